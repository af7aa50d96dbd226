//! The in-process rate limiter of `tidal up` and tests: the same windows as Redis, in a map.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tidal_billing::ledger::RateLimits;
use tidal_queue::{Clock, SystemClock};

use super::window::{elapsed_in_window, window_index, Counts};
use super::{decide, Admission, LimitError, RateLimiter, WINDOW};

#[derive(Debug, Default, Clone, Copy)]
struct Windows {
    index: u64,
    requests: Counts,
    tokens: Counts,
}

impl Windows {
    /// Moves the counters to window `index` (the current one becomes the previous one, or
    /// both reset after a gap).
    fn roll(&mut self, index: u64) {
        if index == self.index {
            return;
        }
        let adjacent = index == self.index + 1;
        let carry = |c: Counts| Counts {
            prev: if adjacent { c.curr } else { 0 },
            curr: 0,
        };
        self.requests = carry(self.requests);
        self.tokens = carry(self.tokens);
        self.index = index;
    }
}

/// Counters in process memory, by tenant.
#[derive(Debug)]
pub struct MemoryLimiter {
    clock: Arc<dyn Clock>,
    tenants: Mutex<HashMap<String, Windows>>,
}

impl Default for MemoryLimiter {
    fn default() -> Self {
        MemoryLimiter::new(Arc::new(SystemClock))
    }
}

impl MemoryLimiter {
    /// A limiter reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryLimiter {
            clock,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, tenant: &str, f: impl FnOnce(&mut Windows, u64, u64) -> T) -> T {
        let w = WINDOW.as_millis() as u64;
        let now = self.clock.now_ms();
        // A panic cannot leave a counter half-written; keep serving.
        let mut map = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(tenant.to_owned()).or_insert_with(|| Windows {
            index: window_index(now, w),
            ..Windows::default()
        });
        entry.roll(window_index(now, w));
        f(entry, elapsed_in_window(now, w), w)
    }
}

#[async_trait]
impl RateLimiter for MemoryLimiter {
    async fn admit(&self, tenant: &str, limits: &RateLimits) -> Result<Admission, LimitError> {
        Ok(self.with(tenant, |win, elapsed, w| {
            let d = decide(limits, win.requests, win.tokens, elapsed, w);
            if d == Admission::Admitted {
                win.requests.curr += 1;
            }
            d
        }))
    }

    async fn record_tokens(&self, tenant: &str, tokens: u64) -> Result<(), LimitError> {
        self.with(tenant, |win, _, _| {
            win.tokens.curr = win.tokens.curr.saturating_add(tokens);
        });
        Ok(())
    }
}
