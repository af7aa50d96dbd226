//! Per-tenant rate limits: requests per minute and tokens per minute.
//!
//! [`RateLimiter`] is the interface; [`RedisLimiter`] keeps the counters in Redis, shared by
//! every gateway replica, and [`MemoryLimiter`] in process (`tidal up`, tests). Both apply the
//! sliding-window counter of [`window`] with one-minute windows and take time from an
//! injected [`Clock`](tidal_queue::Clock).
//!
//! A request is admitted when one more request fits under the requests/min limit and the
//! tokens/min estimate is still below its limit; admitting counts the request. Tokens are
//! counted when a request finishes, from the usage its `done` event reports (prompt +
//! completion), so one large request may overshoot the token limit: the next ones wait until
//! the estimate is back under it (`Retry-After`).

mod memory;
mod redis;
pub mod window;

use std::time::Duration;

use async_trait::async_trait;
use tidal_billing::ledger::RateLimits;

pub use self::memory::MemoryLimiter;
pub use self::redis::RedisLimiter;

/// Length of a rate-limit window: limits are per minute.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// Requests per minute.
    Requests,
    /// Tokens per minute.
    Tokens,
}

impl LimitKind {
    /// Stable name (`requests`, `tokens`).
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Requests => "requests",
            LimitKind::Tokens => "tokens",
        }
    }
}

/// Outcome of [`RateLimiter::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The request was admitted and counted.
    Admitted,
    /// Over a limit; nothing was counted.
    Limited {
        /// The limit that refused it (requests when both did).
        kind: LimitKind,
        /// How long until a request would fit, if no other arrives.
        retry_after: Duration,
    },
}

/// A rate limiter's failure (its store is unreachable).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// Redis failed.
    #[error("rate-limit store: {0}")]
    Redis(#[from] ::redis::RedisError),
}

/// Counts requests and tokens per tenant against [`RateLimits`].
#[async_trait]
pub trait RateLimiter: Send + Sync + std::fmt::Debug {
    /// Admits one request of `tenant` under `limits` (counting it), or says how long to wait.
    async fn admit(&self, tenant: &str, limits: &RateLimits) -> Result<Admission, LimitError>;

    /// Counts `tokens` that a finished request of `tenant` used.
    async fn record_tokens(&self, tenant: &str, tokens: u64) -> Result<(), LimitError>;
}

/// The decision for both limits from the four window counts (pure; both limiters use it).
pub fn decide(
    limits: &RateLimits,
    requests: window::Counts,
    tokens: window::Counts,
    elapsed_ms: u64,
    window_ms: u64,
) -> Admission {
    let r = limits
        .requests_per_min
        .and_then(|l| window::wait_ms(l, 1, requests, elapsed_ms, window_ms));
    // Tokens are known only afterwards: admit while the estimate is below the limit.
    let t = limits
        .tokens_per_min
        .and_then(|l| window::wait_ms(l, 1, tokens, elapsed_ms, window_ms));
    let (kind, wait) = match (r, t) {
        (None, None) => return Admission::Admitted,
        (Some(r), None) => (LimitKind::Requests, r),
        (None, Some(t)) => (LimitKind::Tokens, t),
        (Some(r), Some(t)) => (LimitKind::Requests, r.max(t)),
    };
    Admission::Limited {
        kind,
        retry_after: Duration::from_millis(wait),
    }
}

#[cfg(test)]
mod tests {
    use super::window::Counts;
    use super::*;

    const W: u64 = 60_000;

    fn limits(rpm: Option<u64>, tpm: Option<u64>) -> RateLimits {
        RateLimits {
            requests_per_min: rpm,
            tokens_per_min: tpm,
        }
    }

    fn c(prev: u64, curr: u64) -> Counts {
        Counts { prev, curr }
    }

    #[test]
    fn unlimited_always_admits() {
        let d = decide(
            &limits(None, None),
            c(1 << 40, 1 << 40),
            c(1 << 40, 1 << 40),
            0,
            W,
        );
        assert_eq!(d, Admission::Admitted);
    }

    #[test]
    fn each_limit_refuses_on_its_own() {
        let l = limits(Some(2), Some(100));
        assert_eq!(decide(&l, c(0, 1), c(0, 99), 0, W), Admission::Admitted);
        assert!(matches!(
            decide(&l, c(0, 2), c(0, 0), 0, W),
            Admission::Limited {
                kind: LimitKind::Requests,
                ..
            }
        ));
        assert!(matches!(
            decide(&l, c(0, 0), c(0, 100), 0, W),
            Admission::Limited {
                kind: LimitKind::Tokens,
                ..
            }
        ));
    }

    #[test]
    fn both_over_waits_for_the_later() {
        let l = limits(Some(1), Some(10));
        let only_r = decide(&l, c(0, 1), c(0, 0), 0, W);
        let both = decide(&l, c(0, 1), c(0, 1000), 0, W);
        let (
            Admission::Limited { retry_after: a, .. },
            Admission::Limited {
                kind,
                retry_after: b,
            },
        ) = (only_r, both)
        else {
            panic!("{only_r:?} {both:?}")
        };
        assert_eq!(kind, LimitKind::Requests);
        assert!(b >= a);
    }
}
