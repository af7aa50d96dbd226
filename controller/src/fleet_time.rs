//! Fleet time (pure): replica-milliseconds per model and capacity type, cut into one-minute
//! intervals aligned to the clock, for the ledger's platform cost report.
//!
//! Each tick samples how many replicas are scheduled; the time since the previous sample is
//! charged at the previous count (what ran during it). An interval is reported once it has
//! closed, under an id built from model, capacity type and interval start, so the ledger's
//! idempotency makes a repeated report harmless and a controller that restarts (or a new
//! leader) never counts a minute twice; it may miss the part of a minute it did not see.
//! Gaps longer than [`MAX_GAP_MS`] (no leader, controller down) are not charged.

use std::collections::HashMap;

use tidal_queue::CapacityType;

/// Interval length.
pub const INTERVAL_MS: u64 = 60_000;
/// Longest gap between samples that is still charged.
pub const MAX_GAP_MS: u64 = 5 * 60_000;

/// A closed interval to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Idempotency key: `{model}/{capacity}/{start_ms}`.
    pub id: String,
    /// Model id.
    pub model: String,
    /// Capacity type.
    pub capacity: CapacityType,
    /// Interval start, ms since the epoch.
    pub start_ms: u64,
    /// Replica time inside the interval.
    pub replica_ms: u64,
}

#[derive(Debug, Clone, Default)]
struct Open {
    start_ms: u64,
    replica_ms: u64,
    last_ms: u64,
    last_count: u32,
}

/// Accumulates fleet time between ticks.
#[derive(Debug, Default)]
pub struct FleetMeter {
    open: HashMap<(String, CapacityType), Open>,
}

fn cap_name(c: CapacityType) -> &'static str {
    match c {
        CapacityType::Spot => "spot",
        CapacityType::OnDemand => "on_demand",
    }
}

impl FleetMeter {
    /// Records that `count` replicas of `model` on `capacity` are scheduled at `at_ms`;
    /// returns the intervals that closed since the previous sample (with replica time).
    pub fn sample(
        &mut self,
        model: &str,
        capacity: CapacityType,
        count: u32,
        at_ms: u64,
    ) -> Vec<Interval> {
        let start_of = |t: u64| t - t % INTERVAL_MS;
        let key = (model.to_string(), capacity);
        let mut closed = Vec::new();
        let Some(open) = self.open.get_mut(&key) else {
            self.open.insert(
                key,
                Open {
                    start_ms: start_of(at_ms),
                    replica_ms: 0,
                    last_ms: at_ms,
                    last_count: count,
                },
            );
            return closed;
        };
        if at_ms <= open.last_ms {
            open.last_count = count;
            return closed;
        }
        let charge = at_ms - open.last_ms <= MAX_GAP_MS;
        let mut t = open.last_ms;
        while t < at_ms {
            let end = (open.start_ms + INTERVAL_MS).min(at_ms);
            if charge {
                open.replica_ms += (end - t) * u64::from(open.last_count);
            }
            t = end;
            if t == open.start_ms + INTERVAL_MS {
                if open.replica_ms > 0 {
                    closed.push(Interval {
                        id: format!("{model}/{}/{}", cap_name(capacity), open.start_ms),
                        model: model.to_string(),
                        capacity,
                        start_ms: open.start_ms,
                        replica_ms: open.replica_ms,
                    });
                }
                open.start_ms = if charge { t } else { start_of(at_ms) };
                open.replica_ms = 0;
                if !charge {
                    t = at_ms;
                }
            }
        }
        open.last_ms = at_ms;
        open.last_count = count;
        closed
    }

    /// Adds `replica_ms` of `payer` (a model, or a pool's own line) on `capacity`, spread
    /// evenly over `[from_ms, to_ms)`: a pool's share of its workers' time, which the pool
    /// splits itself. Returns the intervals that closed by `to_ms`. Call it every tick for
    /// every payer charged before, with 0 when it has no share now, so that its last
    /// interval closes. A payer is charged either this way or by [`FleetMeter::sample`],
    /// never both.
    pub fn charge(
        &mut self,
        payer: &str,
        capacity: CapacityType,
        replica_ms: u64,
        from_ms: u64,
        to_ms: u64,
    ) -> Vec<Interval> {
        let start_of = |t: u64| t - t % INTERVAL_MS;
        let key = (payer.to_string(), capacity);
        let mut closed = Vec::new();
        let span = to_ms.saturating_sub(from_ms);
        let mut given = 0u64;
        let mut t = from_ms;
        loop {
            let piece_start = start_of(t);
            let end = (piece_start + INTERVAL_MS).min(to_ms.max(t));
            let open = self.open.entry(key.clone()).or_insert(Open {
                start_ms: piece_start,
                ..Open::default()
            });
            if open.start_ms < piece_start {
                if open.replica_ms > 0 {
                    closed.push(Interval {
                        id: format!("{payer}/{}/{}", cap_name(capacity), open.start_ms),
                        model: payer.to_string(),
                        capacity,
                        start_ms: open.start_ms,
                        replica_ms: open.replica_ms,
                    });
                }
                open.start_ms = piece_start;
                open.replica_ms = 0;
            }
            let share = if end >= to_ms || span == 0 {
                replica_ms - given
            } else {
                // `span` is above zero and `end - from_ms` at most `span`: the quotient fits
                u64::try_from(u128::from(replica_ms) * u128::from(end - from_ms) / u128::from(span))
                    .unwrap_or(replica_ms)
                    - given
            };
            open.replica_ms = open.replica_ms.saturating_add(share);
            given += share;
            open.last_ms = end;
            if end >= to_ms {
                break;
            }
            t = end;
        }
        closed
    }

    /// Forgets a model (deleted); its open interval is dropped.
    pub fn forget(&mut self, model: &str) {
        self.open.retain(|(m, _), _| m != model);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: CapacityType = CapacityType::Spot;

    #[test]
    fn a_charge_is_spread_over_the_minutes_it_covers_and_closes_them() {
        let mut m = FleetMeter::default();
        // 30 s before a minute boundary to 30 s after: half in each minute; the first
        // minute closes as the charge passes its end
        let interval = |start_ms: u64| Interval {
            id: format!("ns/p/spot/{start_ms}"),
            model: "ns/p".into(),
            capacity: S,
            start_ms,
            replica_ms: 500,
        };
        assert_eq!(
            m.charge("ns/p", S, 1_000, 30_000, 90_000),
            vec![interval(0)]
        );
        assert_eq!(
            m.charge("ns/p", S, 0, 90_000, 121_000),
            vec![interval(60_000)]
        );
        // nothing charged in the minute now open: it closes with nothing to report
        assert!(m.charge("ns/p", S, 0, 121_000, 200_000).is_empty());
    }

    #[test]
    fn charges_within_one_minute_add_up() {
        let mut m = FleetMeter::default();
        m.charge("ns/a", S, 7, 0, 1_000);
        m.charge("ns/a", S, 5, 1_000, 2_000);
        let closed = m.charge("ns/a", S, 0, 2_000, 60_000);
        assert!(closed.is_empty());
        let closed = m.charge("ns/a", S, 0, 60_000, 61_000);
        assert_eq!(closed[0].replica_ms, 12);
    }

    #[test]
    fn first_sample_only_starts_the_clock() {
        let mut m = FleetMeter::default();
        assert!(m.sample("ns/a", S, 3, 10_000).is_empty());
    }

    #[test]
    fn charges_previous_count_and_closes_aligned_minutes() {
        let mut m = FleetMeter::default();
        m.sample("ns/a", S, 2, 30_000);
        assert!(m.sample("ns/a", S, 4, 50_000).is_empty()); // 2 x 20 s
        let closed = m.sample("ns/a", S, 0, 70_000); // 4 x 10 s in minute 0, 4 x 10 s in minute 1
        assert_eq!(
            closed,
            vec![Interval {
                id: "ns/a/spot/0".into(),
                model: "ns/a".into(),
                capacity: S,
                start_ms: 0,
                replica_ms: 2 * 20_000 + 4 * 10_000,
            }]
        );
        let closed = m.sample("ns/a", S, 0, 200_000);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].id, "ns/a/spot/60000");
        assert_eq!(closed[0].replica_ms, 4 * 10_000);
    }

    #[test]
    fn empty_minutes_are_not_reported_and_capacities_are_separate() {
        let mut m = FleetMeter::default();
        m.sample("ns/a", S, 0, 0);
        m.sample("ns/a", CapacityType::OnDemand, 1, 0);
        assert!(m.sample("ns/a", S, 0, 180_000).is_empty());
        let od = m.sample("ns/a", CapacityType::OnDemand, 1, 180_000);
        assert_eq!(
            od.iter()
                .map(|i| (i.id.as_str(), i.replica_ms))
                .collect::<Vec<_>>(),
            vec![
                ("ns/a/on_demand/0", 60_000),
                ("ns/a/on_demand/60000", 60_000),
                ("ns/a/on_demand/120000", 60_000),
            ]
        );
    }

    #[test]
    fn long_gaps_are_not_charged() {
        let mut m = FleetMeter::default();
        m.sample("ns/a", S, 5, 0);
        let closed = m.sample("ns/a", S, 5, MAX_GAP_MS + 61_000);
        assert!(closed.is_empty(), "{closed:?}");
        // charging resumes from the sample after the gap
        let closed = m.sample("ns/a", S, 5, MAX_GAP_MS + 120_000);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].replica_ms, 5 * 59_000);
    }

    #[test]
    fn clock_going_back_charges_nothing() {
        let mut m = FleetMeter::default();
        m.sample("ns/a", S, 5, 50_000);
        assert!(m.sample("ns/a", S, 1, 40_000).is_empty());
        let closed = m.sample("ns/a", S, 1, 60_000);
        assert_eq!(closed[0].replica_ms, 10_000);
    }

    #[test]
    fn forget_drops_open_intervals() {
        let mut m = FleetMeter::default();
        m.sample("ns/a", S, 5, 0);
        m.forget("ns/a");
        assert!(m.sample("ns/a", S, 5, 120_000).is_empty());
    }
}
