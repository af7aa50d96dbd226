//! The Redis rate limiter: counters shared by every gateway replica.
//!
//! Keys: `{prefix}rl:{tenant}:{r|t}:{window index}`, one per limit and minute, expiring two
//! windows after their own (the next window still reads it as `prev`). Admission is one Lua
//! script that reads the four counters, applies [`super::window`]'s arithmetic and counts the
//! request only when admitted, so concurrent replicas never admit more than the limit. Time
//! comes from the gateway's clock (passed in), not Redis's, so tests can drive it; replicas
//! whose clocks disagree by a few ms shift window edges by that much, which is harmless for
//! minute windows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};
use tidal_billing::ledger::RateLimits;
use tidal_queue::{Clock, SystemClock};

use super::window::{elapsed_in_window, window_index};
use super::{Admission, LimitError, LimitKind, RateLimiter, WINDOW};

/// KEYS: requests prev, requests curr, tokens prev, tokens curr.
/// ARGV: elapsed ms, window ms, requests limit, tokens limit (0: unlimited), key ttl ms.
/// Returns {0, 0} when admitted (the request is counted), else {kind (1 requests, 2 tokens),
/// wait ms}. Mirrors `window::wait_ms` and `decide` exactly (integers below 2^53).
const ADMIT: &str = r#"
local e = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
if e > w - 1 then e = w - 1 end
local function wait(limit, cost, prev, curr)
  if limit <= 0 then return 0 end
  if prev * (w - e) + (curr + cost) * w <= limit * w then return 0 end
  local t
  if curr + cost <= limit then
    if prev < 1 then prev = 1 end
    t = (w - math.floor((limit - curr - cost) * w / prev)) - e
  elseif curr == 0 then
    t = 2 * w - e
  else
    t = (w - e) + (w - math.floor((limit - cost) * w / curr))
  end
  if t < 1 then t = 1 end
  return t
end
local function get(k) return tonumber(redis.call('GET', k) or '0') end
local rl = tonumber(ARGV[3])
local tl = tonumber(ARGV[4])
local r = wait(rl, 1, get(KEYS[1]), get(KEYS[2]))
local t = wait(tl, 1, get(KEYS[3]), get(KEYS[4]))
if r > 0 and t > 0 then return {1, math.max(r, t)} end
if r > 0 then return {1, r} end
if t > 0 then return {2, t} end
if rl > 0 then
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return {0, 0}
"#;

/// KEYS: tokens curr. ARGV: tokens, key ttl ms.
const RECORD: &str = r#"
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// Counters in Redis.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: ConnectionManager,
    prefix: String,
    clock: Arc<dyn Clock>,
    admit: Arc<Script>,
    record: Arc<Script>,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn window_ms() -> u64 {
    WINDOW.as_millis() as u64
}

/// Counter keys expire this long after their window starts: the window, the next one (which
/// reads it as `prev`), and slack for clock differences between replicas.
fn key_ttl_ms() -> u64 {
    2 * window_ms() + 10_000
}

impl RedisLimiter {
    /// Connects to `url` with keys under `prefix` (e.g. `tidal:`), using the system clock.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, LimitError> {
        Self::connect_with_clock(url, prefix, Arc::new(SystemClock)).await
    }

    /// [`RedisLimiter::connect`] with an injected clock.
    pub async fn connect_with_clock(
        url: &str,
        prefix: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LimitError> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let conn = client.get_connection_manager_with_config(config).await?;
        Ok(RedisLimiter {
            conn,
            prefix: prefix.to_owned(),
            clock,
            admit: Arc::new(Script::new(ADMIT)),
            record: Arc::new(Script::new(RECORD)),
        })
    }

    fn key(&self, tenant: &str, kind: char, index: u64) -> String {
        format!("{}rl:{tenant}:{kind}:{index}", self.prefix)
    }
}

fn arg(limit: Option<u64>) -> u64 {
    limit.unwrap_or(0)
}

#[async_trait]
impl RateLimiter for RedisLimiter {
    async fn admit(&self, tenant: &str, limits: &RateLimits) -> Result<Admission, LimitError> {
        if limits.requests_per_min.is_none() && limits.tokens_per_min.is_none() {
            return Ok(Admission::Admitted);
        }
        let now = self.clock.now_ms();
        let w = window_ms();
        let i = window_index(now, w);
        let mut c = self.conn.clone();
        let (kind, wait): (u8, u64) = self
            .admit
            .key(self.key(tenant, 'r', i.saturating_sub(1)))
            .key(self.key(tenant, 'r', i))
            .key(self.key(tenant, 't', i.saturating_sub(1)))
            .key(self.key(tenant, 't', i))
            .arg(elapsed_in_window(now, w))
            .arg(w)
            .arg(arg(limits.requests_per_min))
            .arg(arg(limits.tokens_per_min))
            .arg(key_ttl_ms())
            .invoke_async(&mut c)
            .await?;
        Ok(match kind {
            0 => Admission::Admitted,
            k => Admission::Limited {
                kind: if k == 2 {
                    LimitKind::Tokens
                } else {
                    LimitKind::Requests
                },
                retry_after: Duration::from_millis(wait),
            },
        })
    }

    async fn record_tokens(&self, tenant: &str, tokens: u64) -> Result<(), LimitError> {
        if tokens == 0 {
            return Ok(());
        }
        let i = window_index(self.clock.now_ms(), window_ms());
        let mut c = self.conn.clone();
        let _: i64 = self
            .record
            .key(self.key(tenant, 't', i))
            .arg(tokens)
            .arg(key_ttl_ms())
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }
}
