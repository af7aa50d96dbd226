//! Splitting a replica count between spot and on-demand capacity.
//!
//! Spot first. On-demand replicas stand in for spot replicas that are stuck Pending past
//! `fallbackAfter` (no spot capacity) or sit on nodes with an interruption signal, and they
//! stay until spot replicas are ready to take their place: the stand-in count only grows with
//! the number of troubled spot pods and only shrinks as the spot shortfall closes, so an
//! interrupted pod's replacement coming up Pending does not remove its stand-in early.

use crate::observed::CapacityObserved;
use crate::spec::{CapacityMode, ScalingSpec};
use std::time::Duration;

/// Replicas per capacity type for one serving target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Desired spot replicas.
    pub spot: u32,
    /// Desired on-demand replicas (base floor plus stand-ins).
    pub on_demand: u32,
    /// On-demand replicas that stand in for unavailable spot replicas.
    pub fallback: u32,
}

/// Splits `total` serving replicas; `prev_fallback` is the stand-in count of the last decision.
pub fn split(
    total: u32,
    spec: &ScalingSpec,
    spot: &CapacityObserved,
    prev_fallback: u32,
    now: Duration,
) -> Split {
    let base = spec.base_on_demand_replicas.min(total);
    match spec.capacity_mode {
        CapacityMode::OnDemand => Split {
            spot: 0,
            on_demand: total,
            fallback: 0,
        },
        CapacityMode::Spot => Split {
            spot: total - base,
            on_demand: base,
            fallback: 0,
        },
        CapacityMode::SpotWithFallback => {
            let spot_target = total - base;
            let troubled = spot
                .pending_longer_than(now, spec.fallback_after)
                .saturating_add(spot.interrupted);
            let shortfall = spot_target.saturating_sub(spot.ready);
            let fallback = shortfall.min(troubled.max(prev_fallback));
            Split {
                spot: spot_target,
                on_demand: base + fallback,
                fallback,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn spec(mode: CapacityMode, base: u32) -> ScalingSpec {
        ScalingSpec {
            capacity_mode: mode,
            base_on_demand_replicas: base,
            fallback_after: s(30),
            ..ScalingSpec::default()
        }
    }

    fn obs(ready: u32, pending_since: &[u64], interrupted: u32) -> CapacityObserved {
        CapacityObserved {
            ready,
            starting: 0,
            pending_since: pending_since.iter().map(|x| s(*x)).collect(),
            interrupted,
        }
    }

    #[test]
    fn on_demand_mode_never_uses_spot() {
        let got = split(
            5,
            &spec(CapacityMode::OnDemand, 2),
            &obs(0, &[0, 0], 1),
            3,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 0,
                on_demand: 5,
                fallback: 0
            }
        );
    }

    #[test]
    fn spot_mode_keeps_base_and_never_falls_back() {
        let got = split(
            5,
            &spec(CapacityMode::Spot, 2),
            &obs(0, &[0, 0, 0], 0),
            0,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 3,
                on_demand: 2,
                fallback: 0
            }
        );
    }

    #[test]
    fn base_never_exceeds_total() {
        let got = split(
            1,
            &spec(CapacityMode::SpotWithFallback, 3),
            &obs(0, &[], 0),
            0,
            s(0),
        );
        assert_eq!(
            got,
            Split {
                spot: 0,
                on_demand: 1,
                fallback: 0
            }
        );
        let zero = split(
            0,
            &spec(CapacityMode::SpotWithFallback, 3),
            &obs(0, &[], 0),
            0,
            s(0),
        );
        assert_eq!(
            zero,
            Split {
                spot: 0,
                on_demand: 0,
                fallback: 0
            }
        );
    }

    #[test]
    fn fresh_pending_spot_does_not_fall_back() {
        let got = split(
            4,
            &spec(CapacityMode::SpotWithFallback, 0),
            &obs(1, &[80, 90, 99], 0),
            0,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 4,
                on_demand: 0,
                fallback: 0
            }
        );
    }

    #[test]
    fn pending_past_the_delay_falls_back_one_for_one() {
        // two of three pending pods are older than 30 s
        let got = split(
            4,
            &spec(CapacityMode::SpotWithFallback, 1),
            &obs(0, &[10, 60, 99], 0),
            0,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 3,
                on_demand: 3,
                fallback: 2
            }
        );
        // exactly at the delay counts
        let edge = split(
            1,
            &spec(CapacityMode::SpotWithFallback, 0),
            &obs(0, &[70], 0),
            0,
            s(100),
        );
        assert_eq!(edge.fallback, 1);
    }

    #[test]
    fn interruption_signal_falls_back_immediately() {
        let got = split(
            3,
            &spec(CapacityMode::SpotWithFallback, 0),
            &obs(1, &[], 2),
            0,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 3,
                on_demand: 2,
                fallback: 2
            }
        );
    }

    #[test]
    fn stand_ins_stay_until_spot_is_ready_then_leave() {
        let sp = spec(CapacityMode::SpotWithFallback, 0);
        // interrupted pods are gone; their replacements are freshly pending
        let held = split(3, &sp, &obs(1, &[99, 99], 0), 2, s(100));
        assert_eq!(held.fallback, 2);
        // one replacement ready
        let one = split(3, &sp, &obs(2, &[99], 0), held.fallback, s(130));
        assert_eq!(
            one,
            Split {
                spot: 3,
                on_demand: 1,
                fallback: 1
            }
        );
        // both ready
        let none = split(3, &sp, &obs(3, &[], 0), one.fallback, s(160));
        assert_eq!(
            none,
            Split {
                spot: 3,
                on_demand: 0,
                fallback: 0
            }
        );
    }

    #[test]
    fn scaling_down_shrinks_stand_ins() {
        let got = split(
            1,
            &spec(CapacityMode::SpotWithFallback, 0),
            &obs(0, &[0], 0),
            5,
            s(100),
        );
        assert_eq!(
            got,
            Split {
                spot: 1,
                on_demand: 1,
                fallback: 1
            }
        );
    }
}
