//! Lua scripts that make the multi-key steps of the protocol atomic on the Redis server
//! (one script runs to completion before any other command).

use redis::Script;

/// Start gate, run on every delivered job (claim or takeover).
/// KEYS: state, jobs, cancel, the model's decoding set. ARGV: entry, deadline_ms, ttl_ms,
/// request id. Returns `{1, times_delivered}` when the job may run; `{0, 0}` when it was
/// dropped (withdrawn, cancelled or past its deadline before it started), acked and deleted.
/// A job delivered again (takeover) waits for its first token again: it leaves the decoding
/// set.
const GATE: &str = r#"
redis.call('SREM', KEYS[4], ARGV[4])
local function drop()
  redis.call('SET', KEYS[1], 'withdrawn', 'PX', ARGV[3])
  redis.call('XACK', KEYS[2], 'workers', ARGV[1])
  redis.call('XDEL', KEYS[2], ARGV[1])
end
local s = redis.call('GET', KEYS[1])
if s == 'withdrawn' then drop() return {0, 0} end
if s ~= 'started' then
  local dl = tonumber(ARGV[2])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if (dl > 0 and now > dl) or redis.call('EXISTS', KEYS[3]) == 1 then drop() return {0, 0} end
end
redis.call('SET', KEYS[1], 'started', 'PX', ARGV[3])
local p = redis.pcall('XPENDING', KEYS[2], 'workers', ARGV[1], ARGV[1], 1)
local n = 1
if type(p) == 'table' and not p.err and #p > 0 then n = p[1][4] end
return {1, n}
"#;

/// Withdraw. KEYS: state, jobs. ARGV: entry, ttl_ms.
/// Returns 0: already started; 1: withdrawn now; 2: was already withdrawn.
const WITHDRAW: &str = r#"
if redis.call('GET', KEYS[1]) == 'started' then return 0 end
local before = redis.call('SET', KEYS[1], 'withdrawn', 'PX', ARGV[2], 'GET')
redis.call('XACK', KEYS[2], 'workers', ARGV[1])
redis.call('XDEL', KEYS[2], ARGV[1])
if before then return 2 end
return 1
"#;

/// Shared prefix of ACK and REQUEUE: is ARGV[1] pending for consumer ARGV[2]?
const OWNED: &str = r#"
local p = redis.pcall('XPENDING', KEYS[1], 'workers', ARGV[1], ARGV[1], 1)
if type(p) ~= 'table' or p.err or #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
"#;

/// Ack. KEYS: the entry's stream, state, the model's decoding set. ARGV: entry, consumer,
/// finished-gate ttl_ms, request id. Returns 1, or 0 when not the owner. The gate of a
/// finished job only has to outlive late withdraws, so its expiry is shortened.
const ACK: &str = r#"
redis.call('XACK', KEYS[1], 'workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[4])
local ttl = redis.call('PTTL', KEYS[2])
if ttl > tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
"#;

/// Re-enqueue. KEYS: the entry's stream, the model's resumed stream, the model's prompt-token
/// counter, the model's decoding set. ARGV: entry, consumer, tokens the resumer re-prefills
/// (estimate), request id, field, value, ... Returns the new entry id, or 0 when not the
/// owner. The count is advisory: it cannot fail the re-enqueue (`pcall`).
const REQUEUE: &str = r#"
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5))
redis.call('XACK', KEYS[1], 'workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[4])
redis.pcall('INCRBY', KEYS[3], ARGV[3])
return id
"#;

/// A job's first token is out. KEYS: the entry's stream, the model's decoding set. ARGV:
/// entry, consumer, request id, the set's ttl_ms. Returns 1, or 0 when not the owner. The
/// expiry bounds what a member left behind by a lost reply can skew: the set goes once no
/// job of the model has started decoding for a request's lifetime.
const MARK_DECODING: &str = r#"
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"#;

/// Submit a new request. KEYS: jobs stream, request record, idempotency key, the model's
/// prompt-token counter. ARGV: record JSON (with `"entry_id":""`), ttl_ms, use the
/// idempotency key (0/1), request id, prompt tokens (estimate), field, value, ... Returns
/// `{1, entry}` when enqueued; `{0, first id}` when the key was used before (nothing
/// enqueued); `{2, ''}` when the request id is already recorded.
/// The record is spliced as text: a JSON string holds no unescaped quote, so the first
/// `"entry_id":""` is the field itself.
const SUBMIT: &str = r#"
if ARGV[3] == '1' then
  local first = redis.call('GET', KEYS[3])
  if first then return {0, first} end
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {2, ''} end
local entry = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
redis.call('INCRBY', KEYS[4], ARGV[5])
local slot = '"entry_id":""'
local at = string.find(ARGV[1], slot, 1, true)
if not at then return redis.error_reply('record without an empty entry_id') end
local rec = string.sub(ARGV[1], 1, at - 1) .. '"entry_id":"' .. entry .. '"' .. string.sub(ARGV[1], at + #slot)
redis.call('SET', KEYS[2], rec, 'PX', ARGV[2])
if ARGV[3] == '1' then redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[2]) end
return {1, entry}
"#;

/// Release an idempotency key. KEYS: the key, the request's record. ARGV: request id.
/// Deletes the key if it names the request and the record is still kept.
const RELEASE_KEY: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Keep-alive. KEYS: a jobs stream. ARGV: consumer, entry, entry, ...
/// Returns one 1/0 per entry: 1 when it was pending for the consumer (its idle time now
/// restarts; `JUSTID` leaves the delivery count alone), 0 when someone else holds it or it
/// is gone.
const KEEP_ALIVE: &str = r#"
local out = {}
for i = 2, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], 'workers', ARGV[i], ARGV[i], 1)
  if type(p) == 'table' and not p.err and #p > 0 and p[1][2] == ARGV[1] then
    redis.call('XCLAIM', KEYS[1], 'workers', ARGV[1], 0, ARGV[i], 'JUSTID')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"#;

/// Takeover of dead consumers' jobs. KEYS: a jobs stream. ARGV: taker, max, then the
/// consumers presumed dead. Moves up to `max` entries pending for those consumers to the
/// taker (`XCLAIM` raises their delivery count) and returns them as `[id, fields]` pairs.
/// The holders are read and changed in one step, so two takers never share an entry.
const TAKE_FROM: &str = r#"
local out = {}
local max = tonumber(ARGV[2])
local summary = redis.pcall('XPENDING', KEYS[1], 'workers')
if type(summary) ~= 'table' or summary.err or type(summary[4]) ~= 'table' then return out end
local holds = {}
for _, c in ipairs(summary[4]) do holds[c[1]] = true end
for i = 3, #ARGV do
  if #out >= max then break end
  if holds[ARGV[i]] and ARGV[i] ~= ARGV[1] then
    local p = redis.call('XPENDING', KEYS[1], 'workers', '-', '+', max - #out, ARGV[i])
    for _, e in ipairs(p) do
      for _, entry in ipairs(redis.call('XCLAIM', KEYS[1], 'workers', ARGV[1], 0, e[1])) do
        if type(entry) == 'table' then out[#out + 1] = entry end
      end
    end
  end
end
return out
"#;

/// Forgets dead workers that hold nothing any more: their consumers in both job streams'
/// group and their heartbeats, so that neither grows with every worker a model ever had.
/// KEYS: jobs, resumed, workers hash. ARGV: the dead workers' names. Returns how many went.
const FORGET_IDLE: &str = r#"
local holds = {}
for k = 1, 2 do
  local summary = redis.pcall('XPENDING', KEYS[k], 'workers')
  if type(summary) == 'table' and not summary.err and type(summary[4]) == 'table' then
    for _, c in ipairs(summary[4]) do holds[c[1]] = true end
  end
end
local gone = 0
for i = 1, #ARGV do
  if not holds[ARGV[i]] then
    for k = 1, 2 do redis.pcall('XGROUP', 'DELCONSUMER', KEYS[k], 'workers', ARGV[i]) end
    gone = gone + redis.call('HDEL', KEYS[3], ARGV[i])
  end
end
return gone
"#;

/// Prefix of APPEND for a holder's write. KEYS[2]: the entry's jobs stream. ARGV[5], ARGV[6]:
/// entry, consumer. Returns `{3, 0}` when the consumer no longer holds the entry.
const HELD: &str = r#"
local p = redis.pcall('XPENDING', KEYS[2], 'workers', ARGV[5], ARGV[5], 1)
if type(p) ~= 'table' or p.err or #p == 0 or p[1][2] ~= ARGV[6] then return {3, 0} end
"#;

/// Append a response event. KEYS: resp. ARGV: seq, terminal (0/1), event JSON, ttl_ms.
/// Entry ids are `0-<seq>`. Returns `{0, seq}` on success, `{1, last}` when seq is not
/// last + 1, `{2, last}` when the stream already ended.
const APPEND: &str = r#"
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local lastseq = 0
if #last > 0 then
  lastseq = tonumber(string.match(last[1][1], '-(%d+)$'))
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'fin' and f[i + 1] == '1' then return {2, lastseq} end
  end
end
if tonumber(ARGV[1]) ~= lastseq + 1 then return {1, lastseq} end
redis.call('XADD', KEYS[1], '0-' .. ARGV[1], 'fin', ARGV[2], 'ev', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {0, lastseq + 1}
"#;

/// Depth figures of one model in one round trip, a consistent snapshot. KEYS: jobs stream,
/// resumed stream, prompt-token counter, decoding set. Returns `{backlog, pending,
/// oldest_wait_ms or -1}` for each stream, then the counter and the decoding jobs: eight
/// integers. Waits use the server's clock, which also stamped the entry ids.
const DEPTH: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function depth(key)
  if redis.call('EXISTS', key) == 0 then return 0, 0, -1 end
  local last = '0-0'
  local pending = 0
  local lag = false
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local m = {}
    for i = 1, #g, 2 do m[g[i]] = g[i + 1] end
    if m['name'] == 'workers' then
      last = m['last-delivered-id']
      pending = m['pending']
      lag = m['lag']
    end
  end
  local first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
  if #first == 0 then return 0, pending, -1 end
  local backlog = lag
  if not backlog then
    backlog = #redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1000000)
  end
  local wait = now - tonumber(string.match(first[1][1], '^(%d+)-'))
  if wait < 0 then wait = 0 end
  return backlog, pending, wait
end
local b1, p1, w1 = depth(KEYS[1])
local b2, p2, w2 = depth(KEYS[2])
local tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
return {b1, p1, w1, b2, p2, w2, tokens, redis.call('SCARD', KEYS[4])}
"#;

/// Cancel a request. KEYS: cancel flag, request record. ARGV: delivered seq, ttl_ms. The flag
/// keeps the larger seq; the record goes, the response stream stays for the worker.
const CANCEL: &str = r#"
local cur = tonumber(redis.call('GET', KEYS[1]) or '')
if cur == nil or tonumber(ARGV[1]) > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('DEL', KEYS[2])
return 1
"#;

/// Expire stale pool workers. KEYS: the pool's workers hash, its assignments hash. ARGV:
/// pairs of (worker, the heartbeat JSON read as stale). Removes each worker's heartbeat and
/// assignment only if its heartbeat is still the one read (a worker that beat since stays).
/// Returns the removed workers.
const EXPIRE_POOL: &str = r#"
local gone = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
"#;

/// The loaded scripts (EVALSHA, reloaded transparently after a server restart).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub gate: Script,
    pub withdraw: Script,
    pub ack: Script,
    pub requeue: Script,
    pub mark_decoding: Script,
    pub submit: Script,
    pub release_key: Script,
    pub keep_alive: Script,
    pub take_from: Script,
    pub forget_idle: Script,
    pub append: Script,
    pub append_held: Script,
    pub depth: Script,
    pub cancel: Script,
    pub expire_pool: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            gate: Script::new(GATE),
            withdraw: Script::new(WITHDRAW),
            ack: Script::new(&format!("{OWNED}{ACK}")),
            requeue: Script::new(&format!("{OWNED}{REQUEUE}")),
            mark_decoding: Script::new(&format!("{OWNED}{MARK_DECODING}")),
            submit: Script::new(SUBMIT),
            release_key: Script::new(RELEASE_KEY),
            keep_alive: Script::new(KEEP_ALIVE),
            take_from: Script::new(TAKE_FROM),
            forget_idle: Script::new(FORGET_IDLE),
            append: Script::new(APPEND),
            append_held: Script::new(&format!("{HELD}{APPEND}")),
            depth: Script::new(DEPTH),
            cancel: Script::new(CANCEL),
            expire_pool: Script::new(EXPIRE_POOL),
        }
    }
}
