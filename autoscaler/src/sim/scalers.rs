//! The autoscalers compared by the simulator: ours (the production `decide`), a Knative-KPA
//! baseline, a KEDA + HPA baseline and a fixed fleet sized for the peak.

use crate::observed::Observed;
use crate::policy::{decide_at, PolicyState, Reason};
use crate::spec::{CapacityMode, ScalingSpec};
use std::collections::VecDeque;
use std::time::Duration;

/// Desired replicas per capacity type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Desired {
    /// Spot replicas.
    pub spot: u32,
    /// On-demand replicas.
    pub on_demand: u32,
}

/// An autoscaler driven by the simulator's clock.
pub trait Scaler {
    /// Name in reports.
    fn name(&self) -> &str;
    /// How often it decides.
    fn interval(&self) -> Duration;
    /// One decision.
    fn desired(&mut self, metrics: &Observed, now: Duration) -> Desired;
    /// Replicas already running (ready) when the simulation starts.
    fn initial(&self) -> Desired {
        Desired::default()
    }
    /// Why the last decision is what it is, for autoscalers that say (the time series).
    fn reason(&self) -> Option<&'static str> {
        None
    }
}

/// Our policy: exactly the function the controller calls, with the spec's `floorSchedule`
/// applied first, as the controller does.
#[derive(Debug, Clone)]
pub struct Ours {
    name: String,
    spec: ScalingSpec,
    state: PolicyState,
    tick: Duration,
    wall_clock_start_s: u64,
    last_reason: Option<Reason>,
}

impl Ours {
    /// Our policy with this spec, deciding every `tick`.
    pub fn new(name: &str, spec: ScalingSpec, tick: Duration) -> Self {
        let state = PolicyState::new(&spec);
        Self {
            name: name.into(),
            spec,
            state,
            tick,
            wall_clock_start_s: 0,
            last_reason: None,
        }
    }

    /// The same, with simulated time 0 at `unix_s` on the wall clock (for the floor schedule;
    /// 0, a Thursday midnight UTC, by default).
    pub fn starting_at(self, unix_s: u64) -> Self {
        Self {
            wall_clock_start_s: unix_s,
            ..self
        }
    }
}

impl Scaler for Ours {
    fn name(&self) -> &str {
        &self.name
    }
    fn reason(&self) -> Option<&'static str> {
        self.last_reason.map(Reason::as_str)
    }
    fn interval(&self) -> Duration {
        self.tick
    }
    fn desired(&mut self, metrics: &Observed, now: Duration) -> Desired {
        let wall_clock = self.wall_clock_start_s.saturating_add(now.as_secs());
        let d = decide_at(metrics, &self.spec, &mut self.state, now, wall_clock);
        self.last_reason = Some(d.reason);
        Desired {
            spot: d.spot,
            on_demand: d.on_demand,
        }
    }
}

/// Knative's KPA with its defaults: concurrency target at 70 % utilisation, 60 s stable and
/// 6 s panic windows, panic at 200 %, scale-up rate 1000, scale-down rate 2, scale to zero
/// once the stable window is idle plus the 30 s grace period (90 s), on-demand only. Our
/// policy is KPA's algorithm, so this runs the same window code with Knative's parameters;
/// the concurrency it sees (queued at the activator + running) equals our backlog + in-flight.
pub fn knative_kpa(target_in_flight: f64, max_replicas: u32, tick: Duration) -> Ours {
    let spec = ScalingSpec {
        min_replicas: 0,
        max_replicas,
        target_in_flight_per_replica: target_in_flight * 0.7,
        scale_to_zero_after: Duration::from_secs(90),
        capacity_mode: CapacityMode::OnDemand,
        // KPA counts concurrent requests, decoding or not
        decoding_weight: 1.0,
        ..ScalingSpec::default()
    };
    Ours::new("knative-kpa", spec, tick)
}

/// KEDA (Redis Streams scaler, 30 s polling, 300 s cooldown to zero) driving an HPA (15 s
/// sync, `AverageValue` target, 10 % tolerance, scale-up by max(4 pods, 100 %) per sync,
/// 300 s scale-down stabilisation), on-demand only.
#[derive(Debug, Clone)]
pub struct Keda {
    target: f64,
    max_replicas: u32,
    current: u32,
    last_active: Option<Duration>,
    last_poll: Option<Duration>,
    recommendations: VecDeque<(Duration, u32)>,
}

const KEDA_POLL: Duration = Duration::from_secs(30);
const KEDA_COOLDOWN: Duration = Duration::from_secs(300);
const HPA_SYNC: Duration = Duration::from_secs(15);
const HPA_STABILISATION: Duration = Duration::from_secs(300);

impl Keda {
    /// KEDA with this per-replica queue target.
    pub fn new(target: f64, max_replicas: u32) -> Self {
        Self {
            target: target.max(f64::MIN_POSITIVE),
            max_replicas,
            current: 0,
            last_active: None,
            last_poll: None,
            recommendations: VecDeque::new(),
        }
    }
}

impl Scaler for Keda {
    fn name(&self) -> &str {
        "keda-hpa"
    }
    fn interval(&self) -> Duration {
        HPA_SYNC
    }
    fn desired(&mut self, metrics: &Observed, now: Duration) -> Desired {
        let metric = metrics.demand() as f64;
        let poll_due = self.last_poll.is_none_or(|t| now >= t + KEDA_POLL);
        if poll_due {
            self.last_poll = Some(now);
            if metric > 0.0 {
                self.last_active = Some(now);
            }
            if self.current == 0 && metric > 0.0 {
                // KEDA activates 0 -> 1; the HPA takes it from there
                self.current = 1;
                return Desired {
                    spot: 0,
                    on_demand: 1,
                };
            }
            let cooled = self.last_active.is_none_or(|t| now >= t + KEDA_COOLDOWN);
            if self.current > 0 && cooled {
                self.current = 0;
                self.recommendations.clear();
                return Desired::default();
            }
        }
        if self.current == 0 {
            return Desired::default();
        }
        let cur = f64::from(self.current);
        let ratio = metric / (self.target * cur);
        let raw = if (ratio - 1.0).abs() <= 0.1 {
            self.current
        } else {
            ((metric / self.target).ceil() as u32).max(1)
        };
        self.recommendations.push_back((now, raw));
        while self
            .recommendations
            .front()
            .is_some_and(|(t, _)| *t + HPA_STABILISATION < now)
        {
            self.recommendations.pop_front();
        }
        let stabilised = if raw < self.current {
            self.recommendations
                .iter()
                .map(|(_, r)| *r)
                .max()
                .unwrap_or(raw)
                .min(self.current)
        } else {
            raw
        };
        let up_limit = (self.current + 4).max(self.current * 2);
        self.current = stabilised.min(up_limit).clamp(1, self.max_replicas.max(1));
        Desired {
            spot: 0,
            on_demand: self.current,
        }
    }
}

/// Row name of the fixed fleet sized to the busiest minute.
pub const ALWAYS_ON_PEAK: &str = "always-on-peak";

/// A fixed on-demand fleet, ready from the start.
#[derive(Debug, Clone)]
pub struct AlwaysOn {
    name: &'static str,
    replicas: u32,
}

impl AlwaysOn {
    /// `replicas` on-demand replicas, always: the `always-on-peak` baseline.
    pub fn new(replicas: u32) -> Self {
        Self::named(ALWAYS_ON_PEAK, replicas)
    }

    /// The same fleet under another row name.
    pub fn named(name: &'static str, replicas: u32) -> Self {
        Self { name, replicas }
    }
}

impl Scaler for AlwaysOn {
    fn name(&self) -> &str {
        self.name
    }
    fn interval(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn desired(&mut self, _: &Observed, _: Duration) -> Desired {
        Desired {
            spot: 0,
            on_demand: self.replicas,
        }
    }
    fn initial(&self) -> Desired {
        Desired {
            spot: 0,
            on_demand: self.replicas,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn load(demand: u64) -> Observed {
        Observed {
            backlog: demand,
            ..Observed::default()
        }
    }

    #[test]
    fn keda_activates_on_poll_then_scales_by_hpa_rules() {
        let mut k = Keda::new(10.0, 100);
        assert_eq!(k.desired(&load(0), s(0)).on_demand, 0);
        // not a poll tick yet at 15 s: stays at zero
        assert_eq!(k.desired(&load(95), s(15)).on_demand, 0);
        assert_eq!(k.desired(&load(95), s(30)).on_demand, 1);
        // HPA: max(4 pods, 100 %) per sync
        assert_eq!(k.desired(&load(95), s(45)).on_demand, 5);
        assert_eq!(k.desired(&load(95), s(60)).on_demand, 10);
        // within 10 % tolerance: no change
        assert_eq!(k.desired(&load(105), s(75)).on_demand, 10);
    }

    #[test]
    fn keda_scale_down_is_stabilised_and_zero_waits_for_cooldown() {
        let mut k = Keda::new(10.0, 100);
        k.desired(&load(50), s(0));
        for t in (15..=60).step_by(15) {
            k.desired(&load(50), s(t));
        }
        assert_eq!(k.current, 5);
        // load drops to 1 at 75 s: held at 5 for the 300 s stabilisation window
        for t in (75..=360).step_by(15) {
            assert_eq!(k.desired(&load(1), s(t)).on_demand, 5, "t={t}");
        }
        assert_eq!(k.desired(&load(1), s(375)).on_demand, 1);
        // idle from 390 s; the last active poll was at 360 s: zero at the poll at 660 s
        for t in (390..660).step_by(15) {
            assert_eq!(k.desired(&load(0), s(t)).on_demand, 1, "t={t}");
        }
        assert_eq!(k.desired(&load(0), s(660)).on_demand, 0);
    }

    #[test]
    fn kpa_is_on_demand_only_with_a_70_percent_target() {
        let mut kpa = knative_kpa(10.0, 100, s(1));
        let obs = Observed {
            backlog: 70,
            last_request_at: Some(s(0)),
            ..Observed::default()
        };
        assert_eq!(
            kpa.desired(&obs, s(0)),
            Desired {
                spot: 0,
                on_demand: 10
            }
        );
    }

    #[test]
    fn always_on_never_changes() {
        let mut a = AlwaysOn::new(3);
        assert_eq!(
            a.initial(),
            Desired {
                spot: 0,
                on_demand: 3
            }
        );
        assert_eq!(
            a.desired(&load(1000), s(5)),
            Desired {
                spot: 0,
                on_demand: 3
            }
        );
    }
}
