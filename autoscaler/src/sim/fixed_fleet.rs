//! The `always-on-slo` baseline: the smallest fixed on-demand fleet whose replay of the trace
//! meets the SLO target. It is how an operator sizes a static deployment from last week's
//! traffic, so it knows the trace (like the oracle) and is a reference, not a policy. Its
//! cost is what autoscaling has to beat at the same SLO.

use super::engine::{run_policy, FleetConfig};
use super::report::{self, PolicySummary};
use super::scalers::AlwaysOn;
use super::{Request, SLO_TARGET};
use std::collections::BTreeMap;

/// Row name of the baseline.
pub const NAME: &str = "always-on-slo";

/// The fleet size found and its replay.
#[derive(Debug, Clone)]
pub struct FixedFleet {
    /// Replicas of the fleet.
    pub replicas: u32,
    /// Its replay. Below [`SLO_TARGET`] only when even `max_replicas` misses it (prompts that
    /// take longer than the TTFT target to prefill miss on any fleet); the fleet is then the
    /// smallest that reaches what `max_replicas` reaches.
    pub summary: PolicySummary,
}

/// Finds, by doubling from `start` and then bisection within `[1, max_replicas]`, a fleet of
/// `n` replicas that meets [`SLO_TARGET`] where `n - 1` does not (or, when `max_replicas`
/// misses it, reaches `max_replicas`' attainment where `n - 1` does not); each step is one
/// replay. `start_replay`, when given, is a replay of the `start`-replica fleet already made
/// (`always-on-peak`'s row): the same fleet, so it is not replayed again. That `n` is the
/// smallest if more replicas never lower the attainment. On the CPU profile one more replica
/// can lower it by up to 0.1 points (workers claim by count), yet on the shipped trace's four
/// runs a linear scan of 1-60 replicas finds the same `n`.
pub fn smallest_meeting_slo(
    reqs: &[Request],
    fleet: &FleetConfig,
    oracle_cost: u64,
    (start, start_replay): (u32, Option<&PolicySummary>),
    max_replicas: u32,
) -> FixedFleet {
    let max_replicas = max_replicas.max(1);
    let mut replays: BTreeMap<u32, PolicySummary> = BTreeMap::new();
    if let Some(known) = start_replay.filter(|_| (1..=max_replicas).contains(&start)) {
        let renamed = PolicySummary {
            name: NAME.into(),
            ..known.clone()
        };
        replays.insert(start, renamed);
    }
    let replay = |n: u32| {
        let run = run_policy(reqs, fleet, &mut AlwaysOn::named(NAME, n));
        report::summarise(run, reqs, &fleet.profile, oracle_cost)
    };
    let mut attainment = |n: u32| replays.entry(n).or_insert_with(|| replay(n)).slo_attainment;
    // invariant: `hi` reaches `goal` and `lo` does not (0 never does)
    let mut goal = SLO_TARGET;
    let (mut lo, mut hi) = (0, start.clamp(1, max_replicas));
    while attainment(hi) < goal && hi < max_replicas {
        lo = hi;
        hi = hi.saturating_mul(2).min(max_replicas);
    }
    if attainment(hi) < goal {
        // `hi` is `max_replicas`: aim for what it reaches, which smaller fleets may reach too
        goal = attainment(hi);
        lo = 0;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if attainment(mid) >= goal {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let summary = replays.remove(&hi).unwrap_or_else(|| replay(hi));
    FixedFleet {
        replicas: hi,
        summary,
    }
}
