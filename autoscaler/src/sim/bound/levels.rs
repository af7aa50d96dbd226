//! The replicas beyond the first that bursts force, and the cold starts they cost.
//!
//! Billing is the integral of the billed replica count `b(t)`, so it is the sum over levels
//! `k >= 1` of the time during which `b(t) >= k`. The clusters bound without the summed
//! prefill counts level 1 alone. Level `k` is forced wherever `k` replicas must be ready at
//! once: the prompts of the requests arriving in `[a_i, a_j]` are prefilled inside
//! `[a_i, a_j + T]` at the prefill rate, so some moment there has at least
//! `ceil(Σ p / (a_j - a_i + T))` ready replicas. Between two moments `x1 < x2` that have
//! `k` ready, level `k` is billed at least `min(x2 - x1, C)`, and before the first at least
//! `C`: if at some moment `m` in between fewer than `k` are billed, the `k` replicas ready at
//! `x2` were either billed at `m` or started after it; those that started after `m` are
//! ready `C` later, so `m <= x2 - C`, and all `k` are billed throughout `[x2 - C, x2)`.
//! (`docs/oracle.md`, "Proof", step 7.)

use super::Anchor;

/// Lower bound on the billing of levels 2 and up, ms, and the replica starts it counts.
///
/// For each request `i`, the window `[a_i, a_j + T]` (with `a_j - a_i` at most a cold start)
/// that forces the most replicas; for each level, a set of disjoint windows forcing it
/// (earliest end first), billed `C` before the first and `min(gap, C)` between each two.
pub(super) fn beyond_the_first_ms(anchors: &[Anchor], cold: f64, slo_ms: f64) -> (f64, u64) {
    // (replicas forced, window start, window end), for windows forcing at least two
    let mut windows: Vec<(u32, f64, f64)> = Vec::new();
    for (i, first) in anchors.iter().enumerate() {
        let (mut prefill, mut most, mut end) = (0.0, 0u32, 0.0);
        for a in anchors[i..]
            .iter()
            .take_while(|a| a.arrival - first.arrival <= cold)
        {
            prefill += a.prefill;
            let forced = (prefill / (a.arrival - first.arrival + slo_ms)).ceil() as u32;
            if forced > most {
                (most, end) = (forced, a.arrival + slo_ms);
            }
        }
        if most >= 2 {
            windows.push((most, first.arrival, end));
        }
    }
    windows.sort_by(|a, b| a.2.total_cmp(&b.2));
    let top = windows.iter().map(|w| w.0).max().unwrap_or(0);
    let (mut billed, mut starts) = (0.0, 0u64);
    for level in 2..=top {
        let mut last_end: Option<f64> = None;
        for &(_, start, end) in windows.iter().filter(|w| w.0 >= level) {
            match last_end {
                None => {
                    billed += cold;
                    starts += 1;
                }
                Some(prev) if start > prev => {
                    let gap = start - prev;
                    billed += gap.min(cold);
                    starts += u64::from(gap >= cold);
                }
                // overlaps the last window picked: both may be met at one moment
                Some(_) => continue,
            }
            last_end = Some(end);
        }
    }
    (billed, starts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request arriving at `at_ms` with `prefill_ms` of prompt, slack 2 s minus the prefill.
    fn arrival(at_ms: f64, prefill_ms: f64) -> Anchor {
        Anchor {
            arrival: at_ms,
            latest_start: at_ms + 2_000.0 - prefill_ms,
            service: prefill_ms + 100.0,
            prefill: prefill_ms,
        }
    }

    #[test]
    fn a_burst_forces_replicas_each_paying_a_cold_start() {
        // 8 s of prefill at once against a 2 s target: 4 replicas ready at one moment, so
        // levels 2-4 each pay a cold start (60 s)
        let burst: Vec<Anchor> = (0..8).map(|_| arrival(0.0, 1_000.0)).collect();
        assert_eq!(
            beyond_the_first_ms(&burst, 60_000.0, 2_000.0),
            (180_000.0, 3)
        );
        // one replica's worth of prefill forces nothing beyond the first
        let light: Vec<Anchor> = (0..2).map(|_| arrival(0.0, 1_000.0)).collect();
        assert_eq!(beyond_the_first_ms(&light, 60_000.0, 2_000.0), (0.0, 0));
        assert_eq!(beyond_the_first_ms(&[], 60_000.0, 2_000.0), (0.0, 0));
    }

    #[test]
    fn bursts_closer_than_a_cold_start_are_bridged() {
        // two bursts forcing 2 replicas each, windows [0, 2 s] and [12 s, 14 s]: level 2 pays
        // one cold start and is kept across the 10 s between them (cheaper than restarting)
        let mut v: Vec<Anchor> = (0..4).map(|_| arrival(0.0, 1_000.0)).collect();
        v.extend((0..4).map(|_| arrival(12_000.0, 1_000.0)));
        assert_eq!(beyond_the_first_ms(&v, 60_000.0, 2_000.0), (70_000.0, 1));
        // 100 s apart: two starts
        let mut far: Vec<Anchor> = (0..4).map(|_| arrival(0.0, 1_000.0)).collect();
        far.extend((0..4).map(|_| arrival(100_000.0, 1_000.0)));
        assert_eq!(beyond_the_first_ms(&far, 60_000.0, 2_000.0), (120_000.0, 2));
    }

    #[test]
    fn spreading_prompts_over_a_longer_window_forces_fewer_replicas() {
        // 4 s of prefill over 6 s of arrivals: the window from the first forces
        // ceil(4 / (6 + 2)) = 1 at its widest, but its first 2 s (2 s of prefill in 4 s) only
        // 1 as well; one at a time: nothing beyond the first
        let v: Vec<Anchor> = (0..4)
            .map(|i| arrival(f64::from(i) * 2_000.0, 1_000.0))
            .collect();
        assert_eq!(beyond_the_first_ms(&v, 60_000.0, 2_000.0), (0.0, 0));
    }
}
