//! The sliding-window counter both rate limiters implement (pure).
//!
//! Each limit counts events in fixed windows of `W` ms (the minute) and estimates the count of
//! the last `W` ms as `prev * (W - e) / W + curr`, where `e` is how far into the current
//! window we are: the previous window's count, weighted by how much of it still overlaps the
//! sliding window, plus the current one. This is the "sliding window counter" of Cloudflare
//! and others: two counters per limit (cheap in Redis, shared by every replica), smooth at
//! window edges (a fixed window lets a tenant send twice its limit across a boundary), exact
//! when traffic is even over a window. All arithmetic is on integers, scaled by `W`, so the
//! Lua script of the Redis limiter reproduces it exactly.

/// Counts of the previous and the current fixed window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events in the previous window.
    pub prev: u64,
    /// Events in the current window so far.
    pub curr: u64,
}

/// Index of the fixed window containing `now_ms`.
pub fn window_index(now_ms: u64, window_ms: u64) -> u64 {
    now_ms / window_ms.max(1)
}

/// How far `now_ms` is into its window.
pub fn elapsed_in_window(now_ms: u64, window_ms: u64) -> u64 {
    now_ms % window_ms.max(1)
}

/// Whether `cost` more events fit under `limit` at `elapsed` ms into the current window:
/// `None` if they do, else how many ms until they would (assuming no other events).
pub fn wait_ms(limit: u64, cost: u64, c: Counts, elapsed: u64, window_ms: u64) -> Option<u64> {
    let w = u128::from(window_ms.max(1));
    let e = u128::from(elapsed).min(w - 1);
    let (limit, cost, prev, curr) = (
        u128::from(limit),
        u128::from(cost),
        u128::from(c.prev),
        u128::from(c.curr),
    );
    if prev * (w - e) + (curr + cost) * w <= limit * w {
        return None;
    }
    let wait = if curr + cost <= limit {
        // The previous window's share is what is over: wait until it has decayed enough.
        // prev * (w - e') <= (limit - curr - cost) * w; prev > 0 here, or we would fit.
        let e_needed = w - ((limit - curr - cost) * w / prev.max(1));
        e_needed - e
    } else if limit < cost || curr == 0 {
        // Can never fit (a zero limit); answer "after two windows".
        2 * w - e
    } else {
        // The current window alone is over: in the next one it becomes `prev`.
        let e_needed = w - ((limit - cost) * w / curr);
        (w - e) + e_needed
    };
    Some(u64::try_from(wait.max(1)).unwrap_or(u64::MAX))
}

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait_ms: u64) -> u64 {
    wait_ms.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 60_000;

    fn c(prev: u64, curr: u64) -> Counts {
        Counts { prev, curr }
    }

    #[test]
    fn windows() {
        assert_eq!(window_index(119_999, W), 1);
        assert_eq!(window_index(120_000, W), 2);
        assert_eq!(elapsed_in_window(125_000, W), 5_000);
    }

    #[test]
    fn fits_under_the_limit() {
        assert_eq!(wait_ms(10, 1, c(0, 0), 0, W), None);
        assert_eq!(wait_ms(10, 1, c(0, 9), 0, W), None);
        assert!(wait_ms(10, 1, c(0, 10), 0, W).is_some());
        // Half the previous window still counts half-way through the current one.
        assert_eq!(wait_ms(10, 1, c(10, 4), 30_000, W), None, "5 + 4 + 1 = 10");
        assert!(
            wait_ms(10, 1, c(10, 5), 30_000, W).is_some(),
            "5 + 5 + 1 = 11"
        );
    }

    #[test]
    fn wait_for_the_previous_window_to_decay() {
        // prev 10, curr 5, limit 10: need 10 * (W - e) <= 4 * W → e >= 0.6 W = 36 s.
        let wait = wait_ms(10, 1, c(10, 5), 30_000, W).unwrap();
        assert_eq!(wait, 6_000);
        assert_eq!(wait_ms(10, 1, c(10, 5), 30_000 + wait, W), None);
        assert!(wait_ms(10, 1, c(10, 5), 30_000 + wait - 1, W).is_some());
    }

    #[test]
    fn wait_into_the_next_window_when_the_current_is_full() {
        // curr 10 = limit at 20 s: next window starts in 40 s; there prev = 10 must decay to
        // 9: 10 * (W - e) <= 9 W → e >= 6 s. Total 46 s.
        let wait = wait_ms(10, 1, c(0, 10), 20_000, W).unwrap();
        assert_eq!(wait, 46_000);
        // Check by moving on: at that instant, in the next window, one request fits.
        assert_eq!(wait_ms(10, 1, c(10, 0), 6_000, W), None);
        assert!(wait_ms(10, 1, c(10, 0), 5_999, W).is_some());
        // Far over (tokens reported after the fact): still less than two windows.
        let wait = wait_ms(100, 1, c(0, 10_000), 0, W).unwrap();
        assert!(wait > W && wait < 2 * W, "{wait}");
    }

    #[test]
    fn a_limit_below_the_cost_never_fits() {
        assert_eq!(wait_ms(0, 1, c(0, 0), 10_000, W), Some(2 * W - 10_000));
    }

    #[test]
    fn every_reported_wait_is_exact() {
        // Exhaustive over small counts: after the reported wait (and no new events) the cost
        // fits, and one ms earlier it did not.
        let w = 1_000;
        for limit in 1..6u64 {
            for prev in 0..8u64 {
                for curr in 0..8u64 {
                    for e in (0..w).step_by(37) {
                        let Some(wait) = wait_ms(limit, 1, c(prev, curr), e, w) else {
                            continue;
                        };
                        let at = |dt: u64| {
                            let t = e + dt;
                            match t / w {
                                0 => wait_ms(limit, 1, c(prev, curr), t, w),
                                1 => wait_ms(limit, 1, c(curr, 0), t - w, w),
                                _ => wait_ms(limit, 1, c(0, 0), t % w, w),
                            }
                        };
                        assert_eq!(at(wait), None, "{limit} {prev} {curr} {e} {wait}");
                        assert!(at(wait - 1).is_some(), "{limit} {prev} {curr} {e} {wait}");
                    }
                }
            }
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(0), 1);
    }
}
