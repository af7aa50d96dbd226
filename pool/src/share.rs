//! Each tick's worker time, split across the models the workers served (pure), for the
//! fleet-time ledger: the rule of [`tidal_autoscaler::pool::split_fleet_time`] applied to
//! every worker over the time since the previous tick.
//!
//! What a worker served in that time is the growth of its heartbeat's `tokens_delivered`
//! per loaded model (completion tokens: decode steps are most of a worker's time, and the
//! counter is what the worker measures live). A worker that is scheduled but sends no
//! heartbeat yet (starting: image pull, download) costs the pool itself. Gaps longer than
//! [`MAX_GAP_MS`] (no tick ran: controller down, no leader) are not charged, as for a
//! model's own fleet.

use std::collections::BTreeMap;

use tidal_autoscaler::pool::{split_fleet_time, Payer};
use tidal_queue::{CapacityType, PoolHeartbeat};

/// Longest time between two ticks that is still charged.
pub const MAX_GAP_MS: u64 = 5 * 60_000;

/// The worker time of one tick's interval, by payer and capacity type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    /// Start of the interval, ms since the epoch.
    pub from_ms: u64,
    /// Its end.
    pub to_ms: u64,
    /// Worker milliseconds per payer and capacity type, each above zero, in payer order.
    pub parts: Vec<(Payer, CapacityType, u64)>,
}

/// Remembers the workers' token counters between ticks.
#[derive(Debug, Default)]
pub struct FleetShare {
    last_ms: Option<u64>,
    tokens: BTreeMap<(String, String), u64>,
}

impl FleetShare {
    /// Splits the time since the previous call at `now_ms` (the first call only starts the
    /// clock); `scheduled` is how many workers of each capacity type are scheduled now.
    pub fn split(
        &mut self,
        beats: &[PoolHeartbeat],
        scheduled: &[(CapacityType, u32)],
        now_ms: u64,
    ) -> Option<Shares> {
        let counters: BTreeMap<(String, String), u64> = beats
            .iter()
            .flat_map(|b| {
                b.loaded
                    .iter()
                    .map(|l| ((b.worker.clone(), l.model.clone()), l.tokens_delivered))
            })
            .collect();
        let before = std::mem::replace(&mut self.tokens, counters);
        let from_ms = self.last_ms.replace(now_ms)?;
        if now_ms <= from_ms || now_ms - from_ms > MAX_GAP_MS {
            return None;
        }
        let dt = now_ms - from_ms;
        let mut parts: BTreeMap<(Payer, u8), (CapacityType, u64)> = BTreeMap::new();
        let mut add = |payer: Payer, capacity: CapacityType, ms: u64| {
            let e = parts
                .entry((payer, capacity_order(capacity)))
                .or_insert((capacity, 0));
            e.1 = e.1.saturating_add(ms);
        };
        for b in beats {
            let served: Vec<(&str, u64)> = b
                .loaded
                .iter()
                .map(|l| {
                    let was = before
                        .get(&(b.worker.clone(), l.model.clone()))
                        .copied()
                        .unwrap_or(0);
                    // a counter that went down is a reload: it counts from zero again
                    let grew = if l.tokens_delivered >= was {
                        l.tokens_delivered - was
                    } else {
                        l.tokens_delivered
                    };
                    (l.model.as_str(), grew)
                })
                .collect();
            let held: Vec<&str> = b
                .loaded
                .iter()
                .map(|l| l.model.as_str())
                .chain(b.loading.iter().map(String::as_str))
                .collect();
            for (payer, ms) in split_fleet_time(dt, &held, &served) {
                add(payer, b.capacity_type, ms);
            }
        }
        for (capacity, count) in scheduled {
            let reporting = beats
                .iter()
                .filter(|b| b.capacity_type == *capacity)
                .count();
            let silent = u64::from(*count).saturating_sub(reporting as u64);
            if silent > 0 {
                add(Payer::Pool, *capacity, silent.saturating_mul(dt));
            }
        }
        Some(Shares {
            from_ms,
            to_ms: now_ms,
            parts: parts
                .into_iter()
                .filter(|(_, (_, ms))| *ms > 0)
                .map(|((payer, _), (capacity, ms))| (payer, capacity, ms))
                .collect(),
        })
    }
}

/// An order for capacity types (they have none of their own).
fn capacity_order(c: CapacityType) -> u8 {
    match c {
        CapacityType::Spot => 0,
        CapacityType::OnDemand => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::tests::beat;

    const OD: CapacityType = CapacityType::OnDemand;

    fn with_tokens(mut b: PoolHeartbeat, tokens: &[u64]) -> PoolHeartbeat {
        for (l, t) in b.loaded.iter_mut().zip(tokens) {
            l.tokens_delivered = *t;
        }
        b
    }

    fn model(id: &str) -> Payer {
        Payer::Model(id.into())
    }

    #[test]
    fn the_first_tick_only_starts_the_clock() {
        let mut s = FleetShare::default();
        assert_eq!(s.split(&[beat("a", &["x"], &[])], &[(OD, 1)], 1_000), None);
    }

    #[test]
    fn a_worker_is_split_by_tokens_grown_since_the_last_tick() {
        let mut s = FleetShare::default();
        let b = |t: &[u64]| [with_tokens(beat("a", &["x", "y"], &[]), t)];
        s.split(&b(&[100, 50]), &[(OD, 1)], 1_000);
        let out = s.split(&b(&[130, 60]), &[(OD, 1)], 5_000).expect("charged");
        // 30 and 10 tokens: 3 000 and 1 000 ms
        assert_eq!(
            out.parts,
            vec![(model("x"), OD, 3_000), (model("y"), OD, 1_000)]
        );
        assert_eq!((out.from_ms, out.to_ms), (1_000, 5_000));
    }

    #[test]
    fn nothing_served_goes_to_what_is_held_and_nothing_held_to_the_pool() {
        let mut s = FleetShare::default();
        let beats = [beat("a", &["x", "y"], &[]), beat("b", &[], &[])];
        s.split(&beats, &[(OD, 2)], 0);
        let out = s.split(&beats, &[(OD, 2)], 1_000).expect("charged");
        assert_eq!(
            out.parts,
            vec![
                (model("x"), OD, 500),
                (model("y"), OD, 500),
                (Payer::Pool, OD, 1_000)
            ]
        );
    }

    #[test]
    fn scheduled_workers_without_a_heartbeat_cost_the_pool() {
        let mut s = FleetShare::default();
        let beats = [beat("a", &["x"], &[])];
        s.split(&beats, &[], 0);
        let out = s
            .split(&beats, &[(OD, 3), (CapacityType::Spot, 1)], 2_000)
            .expect("charged");
        assert_eq!(
            out.parts,
            vec![
                (model("x"), OD, 2_000),
                (Payer::Pool, CapacityType::Spot, 2_000),
                (Payer::Pool, OD, 4_000)
            ]
        );
    }

    #[test]
    fn a_reload_counts_from_zero_and_a_long_gap_is_not_charged() {
        let mut s = FleetShare::default();
        let b = |t: &[u64]| [with_tokens(beat("a", &["x", "y"], &[]), t)];
        s.split(&b(&[500, 0]), &[(OD, 1)], 0);
        let out = s.split(&b(&[20, 20]), &[(OD, 1)], 1_000).expect("charged");
        assert_eq!(
            out.parts,
            vec![(model("x"), OD, 500), (model("y"), OD, 500)]
        );
        assert_eq!(
            s.split(&b(&[20, 20]), &[(OD, 1)], 1_000 + MAX_GAP_MS + 1),
            None
        );
        let total: u64 = s
            .split(&b(&[30, 20]), &[(OD, 1)], 2_000 + MAX_GAP_MS)
            .expect("charged")
            .parts
            .iter()
            .map(|p| p.2)
            .sum();
        assert_eq!(total, 999);
    }
}
