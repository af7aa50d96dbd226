//! The autoscaling decision: a pure function of observed metrics, spec, its own state and an
//! injected clock.
//!
//! Follows Knative's KPA (`pkg/autoscaler/scaling/autoscaler.go`): demand averaged over a stable
//! window and a short panic window; panic mode when the panic-window desire reaches
//! `panicThreshold` times the ready replicas, during which the policy only scales up and which
//! ends one stable window after the last panicking tick; scale-up and scale-down rate limits
//! relative to ready replicas. Unlike KPA the demand is queue depth (stream backlog + pending
//! entries), so no activator is needed: with nothing running, the first queued request
//! activates replicas on the same tick, sized from the instantaneous backlog. With
//! `prefillTokensPerSecond` set, the demand is also at least the replicas that the prompt
//! tokens of the last TTFT target need ([`crate::prefill`]). A job that is only decoding
//! weighs `decodingWeight` of a waiting one.

use crate::capacity::{split, Split};
use crate::observed::Observed;
use crate::prefill::{prefill_replicas, ArrivalWindow};
use crate::spec::{ScaleDownHold, ScalingSpec, StableAggregate};
use crate::window::Window;
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// Why the serving target has its value (the last rule that set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Stable-window average against the per-replica target.
    Stable,
    /// Panic mode: panic-window average, never below the panic high-water mark.
    Panic,
    /// Nothing running and work queued: sized from the instantaneous demand.
    Activation,
    /// Idle but inside `scaleToZeroAfter`: one replica kept.
    IdleGrace,
    /// Idle for `scaleToZeroAfter`: zero replicas.
    ScaleToZero,
    /// Held at a higher recent target by `scaleDownDelay`.
    ScaleDownDelay,
    /// Held back by `maxScaleUpRate`.
    ScaleUpLimited,
    /// Held up by `maxScaleDownRate`.
    ScaleDownLimited,
    /// Raised to `minReplicas`.
    MinReplicas,
    /// Raised to the floor of a `floorSchedule` window that holds ([`decide_at`]).
    ScheduledFloor,
    /// Cut to `maxReplicas`.
    MaxReplicas,
}

impl Reason {
    /// The reason in words, as events, metrics and `tidal status` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Stable => "stable",
            Reason::Panic => "panic",
            Reason::Activation => "activation",
            Reason::IdleGrace => "idle-grace",
            Reason::ScaleToZero => "scale-to-zero",
            Reason::ScaleDownDelay => "scale-down-delay",
            Reason::ScaleUpLimited => "scale-up-limited",
            Reason::ScaleDownLimited => "scale-down-limited",
            Reason::MinReplicas => "min-replicas",
            Reason::ScheduledFloor => "scheduled-floor",
            Reason::MaxReplicas => "max-replicas",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The policy's output for one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Desired spot replicas.
    pub spot: u32,
    /// Desired on-demand replicas (base floor + stand-ins for unavailable spot).
    pub on_demand: u32,
    /// How many of `on_demand` stand in for unavailable or interrupted spot replicas.
    pub fallback: u32,
    /// Serving target (`spot + on_demand - fallback`), within `[minReplicas, maxReplicas]`.
    pub serving: u32,
    /// The rule that set `serving`.
    pub reason: Reason,
    /// Whether the policy is in panic mode.
    pub panic: bool,
    /// Demand averaged over the stable window.
    pub stable_demand: f64,
    /// Demand averaged over the panic window.
    pub panic_demand: f64,
    /// Replicas (before rounding) the prompts of the last TTFT target ask for; zero with
    /// prefill sizing off.
    pub prefill_demand: f64,
}

/// What the policy remembers between ticks (one per model).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyState {
    window: Window,
    panic_until: Option<Duration>,
    panic_high_water: u32,
    fallback: u32,
    recent: VecDeque<(Duration, u32)>,
    arrivals: ArrivalWindow,
}

impl PolicyState {
    /// Fresh state for a model with this spec.
    pub fn new(spec: &ScalingSpec) -> Self {
        Self {
            window: Window::new(spec.stable_window.max(spec.panic_window)),
            panic_until: None,
            panic_high_water: 0,
            fallback: 0,
            recent: VecDeque::new(),
            arrivals: ArrivalWindow::default(),
        }
    }

    /// Adopts a changed spec and keeps what was seen: the demand samples (now kept for the
    /// new windows), panic, the targets the scale-down delay holds and the arrivals. A
    /// fresh state would forget the recent peak, and a fleet whose time constants change
    /// (an edited spec, a new measurement of the cold start) would shrink at once.
    pub fn respec(&mut self, spec: &ScalingSpec) {
        self.window
            .set_retention(spec.stable_window.max(spec.panic_window));
    }
}

fn replicas_for(demand: f64, target: f64) -> u32 {
    // Saturating float-to-int cast; tiny epsilon so 32.0/16.0 is 2, not 3 after rounding noise.
    ((demand / target) - 1e-9).ceil().max(0.0) as u32
}

/// The highest level `k` of a target set `age` ago that [`ScaleDownHold::PerLevel`] still
/// holds: `k <= delay / age`.
fn levels_held(delay: Duration, age: Duration) -> u32 {
    if age.is_zero() {
        return u32::MAX;
    }
    // saturating float-to-int cast
    (delay.as_secs_f64() / age.as_secs_f64()).floor() as u32
}

/// Decides desired replicas per capacity type at `now` (any monotonic clock, same as in
/// `metrics`). The spec should have passed [`ScalingSpec::validate`]; out-of-range values are
/// clamped rather than trusted.
pub fn decide(
    metrics: &Observed,
    spec: &ScalingSpec,
    state: &mut PolicyState,
    now: Duration,
) -> Decision {
    let target = spec.target_in_flight_per_replica.max(f64::MIN_POSITIVE);
    // the arrival window is kept only while prefill sizing is on
    let prefill_demand = if spec.prefill_tokens_per_second > 0.0 {
        let tokens = state
            .arrivals
            .record(now, metrics.arrived_prompt_tokens, spec.ttft_target);
        prefill_replicas(tokens, spec)
    } else {
        0.0
    };
    // Prefill demand in request-count units, so both go through the same windows.
    let demand = metrics
        .weighted_demand(spec.decoding_weight)
        .max(prefill_demand * target);
    state.window.record(now, demand);
    let stable_demand = match spec.stable_aggregate {
        StableAggregate::Mean => state.window.average(now, spec.stable_window),
        StableAggregate::Max => state.window.max(now, spec.stable_window),
    }
    .unwrap_or(0.0);
    let panic_demand = state.window.average(now, spec.panic_window).unwrap_or(0.0);
    let desired_stable = replicas_for(stable_demand, target);
    let desired_panic = replicas_for(panic_demand, target);
    let ready = metrics.ready();
    let nothing_running =
        ready == 0 && metrics.spot.not_ready() == 0 && metrics.on_demand.not_ready() == 0;

    let panicking_now = if ready == 0 {
        desired_panic > 0
    } else {
        f64::from(desired_panic) / f64::from(ready) >= spec.panic_threshold
    };
    if panicking_now {
        state.panic_until = Some(now + spec.stable_window);
    }
    let panic = state.panic_until.is_some_and(|until| now < until);
    if !panic {
        state.panic_until = None;
        state.panic_high_water = 0;
    }

    let (mut want, mut reason) = if panic {
        let w = desired_panic
            .max(desired_stable)
            .max(state.panic_high_water);
        state.panic_high_water = w;
        (w, Reason::Panic)
    } else {
        (desired_stable, Reason::Stable)
    };

    if nothing_running && demand > 0.0 {
        let instant = replicas_for(demand, target).max(1);
        if instant >= want {
            (want, reason) = (instant, Reason::Activation);
        }
    }

    if panic {
        state.panic_high_water = state.panic_high_water.max(want);
    }

    // Scale-down delay: the highest target of the trailing delay period wins.
    if !spec.scale_down_delay.is_zero() {
        while state
            .recent
            .front()
            .is_some_and(|(t, _)| *t + spec.scale_down_delay <= now)
        {
            state.recent.pop_front();
        }
        // keep the deque monotonically decreasing: older, lower targets can never win again
        // (per level neither: the newer target is younger, so it holds each level longer)
        while state.recent.back().is_some_and(|(_, w)| *w <= want) {
            state.recent.pop_back();
        }
        state.recent.push_back((now, want));
        let held = match spec.scale_down_hold {
            ScaleDownHold::Flat => state.recent.front().map_or(0, |(_, w)| *w),
            ScaleDownHold::PerLevel => state
                .recent
                .iter()
                .map(|(t, w)| (*w).min(levels_held(spec.scale_down_delay, now - *t)))
                .max()
                .unwrap_or(0),
        };
        if held > want {
            (want, reason) = (held, Reason::ScaleDownDelay);
        }
    }

    // Rate limits are relative to ready replicas; from zero, relative to one.
    let up_limit = (f64::from(ready.max(1)) * spec.max_scale_up_rate).ceil() as u32;
    if want > up_limit {
        (want, reason) = (up_limit, Reason::ScaleUpLimited);
    }
    let down_limit = (f64::from(ready) / spec.max_scale_down_rate.max(1.0)).floor() as u32;
    if want < down_limit {
        (want, reason) = (down_limit, Reason::ScaleDownLimited);
    }

    let idle_for = metrics.last_request_at.map(|t| now.saturating_sub(t));
    let idle = metrics.demand() == 0 && idle_for.is_none_or(|d| d >= spec.scale_to_zero_after);
    if idle {
        (want, reason) = (0, Reason::ScaleToZero);
        // a request after scale-to-zero is sized afresh, not from before the idle period
        state.recent.clear();
    } else if want == 0 {
        (want, reason) = (1, Reason::IdleGrace);
    }

    if want < spec.min_replicas {
        (want, reason) = (spec.min_replicas, Reason::MinReplicas);
    }
    if want > spec.max_replicas {
        (want, reason) = (spec.max_replicas, Reason::MaxReplicas);
    }

    let Split {
        spot,
        on_demand,
        fallback,
    } = split(want, spec, &metrics.spot, state.fallback, now);
    state.fallback = fallback;
    Decision {
        spot,
        on_demand,
        fallback,
        serving: want,
        reason,
        panic,
        stable_demand,
        panic_demand,
        prefill_demand,
    }
}

/// [`decide`] at wall-clock time `unix_secs` (seconds since the Unix epoch), for the callers
/// that know it: the spec's `floorSchedule` first raises `minReplicas`
/// ([`ScalingSpec::at_wall_clock`]), and a target that such a floor set reads
/// [`Reason::ScheduledFloor`], so a replica kept at night is not blamed on `minReplicas`.
pub fn decide_at(
    metrics: &Observed,
    spec: &ScalingSpec,
    state: &mut PolicyState,
    now: Duration,
    unix_secs: u64,
) -> Decision {
    let scheduled = spec.at_wall_clock(unix_secs);
    let mut decision = decide(metrics, &scheduled, state, now);
    if decision.reason == Reason::MinReplicas && scheduled.min_replicas > spec.min_replicas {
        decision.reason = Reason::ScheduledFloor;
    }
    decision
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
