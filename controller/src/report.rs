//! What a tick tells the outside world (pure): the Model's status, the broker's model
//! record state, and the Kubernetes Events worth emitting for a change of decision.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tidal_autoscaler::{Decision, Observed};
use tidal_crds::{CapacityStatus, ModelStatus, Phase, TimeConstants};
use tidal_queue::ModelState;

/// Inputs of one tick's status.
#[derive(Debug, Clone)]
pub struct Tick<'a> {
    /// What the policy saw.
    pub observed: &'a Observed,
    /// What it decided.
    pub decision: &'a Decision,
    /// The Model's `metadata.generation`.
    pub generation: Option<i64>,
    /// When the controller last saw work.
    pub last_request: Option<Time>,
    /// A dependency (queue, ledger, API) failed this tick: its message.
    pub degraded: Option<String>,
    /// A worker refused to start because the model does not fit its device: the memory
    /// plan's verdict ([`crate::observe::memory_refusal`]).
    pub memory_refusal: Option<String>,
    /// Now, for condition transition times.
    pub now: Time,
    /// The cold start measured on the Model's replicas (or kept from before).
    pub measured_cold_start: Option<Duration>,
    /// The time constants the policy ran with.
    pub time_constants: TimeConstants,
}

/// The serving phase for a decision and what is running.
pub fn phase(observed: &Observed, decision: &Decision, degraded: bool) -> Phase {
    if degraded {
        Phase::Degraded
    } else if observed.ready() > 0 {
        Phase::Ready
    } else if decision.spot + decision.on_demand > 0 {
        Phase::Starting
    } else {
        Phase::ScaledToZero
    }
}

/// The broker record's state for a phase (a degraded model keeps serving what it can).
pub fn record_state(observed: &Observed, decision: &Decision) -> ModelState {
    if observed.ready() > 0 {
        ModelState::Ready
    } else if decision.spot + decision.on_demand > 0 {
        ModelState::Starting
    } else {
        ModelState::ScaledToZero
    }
}

fn condition(type_: &str, ok: bool, reason: &str, message: String, t: &Tick<'_>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: t.generation,
        last_transition_time: t.now.clone(),
    }
}

/// Keeps a condition's transition time when its status did not change.
pub(crate) fn carry_transitions(new: &mut [Condition], old: &[Condition]) {
    for c in new {
        if let Some(o) = old.iter().find(|o| o.type_ == c.type_) {
            if o.status == c.status {
                c.last_transition_time = o.last_transition_time.clone();
            }
        }
    }
}

/// The status for a tick; `previous` supplies condition transition times.
pub fn status(t: &Tick<'_>, previous: Option<&ModelStatus>) -> ModelStatus {
    let o = t.observed;
    let d = t.decision;
    // Workers that cannot fit their device will never become Ready: say so, with the plan's
    // numbers, rather than `Starting` forever.
    let refused = t.degraded.is_none() && o.ready() == 0;
    let (phase, ready_reason, ready_message) = match (&t.memory_refusal, refused) {
        (Some(verdict), true) => (
            Phase::Degraded,
            "DoesNotFit",
            format!("a worker refused to start: {verdict}"),
        ),
        (verdict, _) => {
            let phase = phase(o, d, t.degraded.is_some());
            let reason = match phase {
                Phase::Ready => "Serving",
                Phase::Starting => "Starting",
                Phase::ScaledToZero => "ScaledToZero",
                Phase::Degraded => "Degraded",
            };
            let mut message = match &t.degraded {
                Some(m) => m.clone(),
                None => format!(
                    "{} of {} replicas ready ({})",
                    o.ready(),
                    d.spot + d.on_demand,
                    d.reason
                ),
            };
            if let Some(verdict) = verdict {
                message.push_str(&format!("; a worker refused to start: {verdict}"));
            }
            (phase, reason, message)
        }
    };
    let spot_ok = d.fallback == 0;
    let mut conditions = vec![
        condition("Ready", o.ready() > 0, ready_reason, ready_message, t),
        condition(
            "SpotAvailable",
            spot_ok,
            if spot_ok {
                "SpotAvailable"
            } else {
                "SpotFallback"
            },
            if spot_ok {
                "no spot replica needs an on-demand stand-in".into()
            } else {
                format!(
                    "{} on-demand replicas stand in for pending or interrupted spot replicas",
                    d.fallback
                )
            },
            t,
        ),
        condition("SpecValid", true, "Valid", "the spec is valid".into(), t),
    ];
    if let Some(p) = previous {
        carry_transitions(&mut conditions, &p.conditions);
    }
    ModelStatus {
        phase,
        ready_replicas: o.ready(),
        spot: CapacityStatus {
            desired: d.spot,
            ready: o.spot.ready,
        },
        on_demand: CapacityStatus {
            desired: d.on_demand,
            ready: o.on_demand.ready,
        },
        fallback_replicas: d.fallback,
        backlog: o.backlog,
        in_flight: o.in_flight,
        decoding: o.decoding,
        last_request_time: t.last_request.clone(),
        conditions,
        measured_cold_start_seconds: t
            .measured_cold_start
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX)),
        time_constants: Some(t.time_constants.clone()),
        observed_generation: t.generation,
    }
}

/// The status of a Model whose spec the controller cannot act on.
pub fn invalid_status(
    message: String,
    generation: Option<i64>,
    now: Time,
    previous: Option<&ModelStatus>,
) -> ModelStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let mut conditions = vec![Condition {
        type_: "SpecValid".into(),
        status: "False".into(),
        reason: "InvalidSpec".into(),
        message,
        observed_generation: generation,
        last_transition_time: now,
    }];
    carry_transitions(&mut conditions, &status.conditions);
    status.conditions.retain(|c| c.type_ != "SpecValid");
    status.conditions.extend(conditions);
    status.phase = Phase::Degraded;
    status.observed_generation = generation;
    // the controller does not act on this spec: no time constants are in force
    status.time_constants = None;
    status
}

/// A Kubernetes Event to emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `PascalCase` reason.
    pub reason: &'static str,
    /// Human-readable note.
    pub note: String,
    /// Warning rather than Normal.
    pub warning: bool,
}

/// Events for the change from `prev` to `next` (nothing on the first decision except a
/// scale-up or fallback from nothing).
pub fn notices(prev: Option<&Decision>, next: &Decision) -> Vec<Notice> {
    let (p_serving, p_fallback) = prev.map(|p| (p.serving, p.fallback)).unwrap_or((0, 0));
    let mut out = Vec::new();
    if next.serving > p_serving {
        out.push(Notice {
            reason: "ScaledUp",
            note: format!(
                "serving replicas {p_serving} -> {} ({}; spot {}, on-demand {})",
                next.serving, next.reason, next.spot, next.on_demand
            ),
            warning: false,
        });
    } else if next.serving == 0 && p_serving > 0 {
        out.push(Notice {
            reason: "ScaledToZero",
            note: format!("idle: serving replicas {p_serving} -> 0"),
            warning: false,
        });
    } else if next.serving < p_serving {
        out.push(Notice {
            reason: "ScaledDown",
            note: format!(
                "serving replicas {p_serving} -> {} ({})",
                next.serving, next.reason
            ),
            warning: false,
        });
    }
    if next.fallback > p_fallback {
        out.push(Notice {
            reason: "SpotFallback",
            note: format!(
                "{} on-demand replicas stand in for pending or interrupted spot replicas",
                next.fallback
            ),
            warning: true,
        });
    } else if next.fallback == 0 && p_fallback > 0 {
        out.push(Notice {
            reason: "SpotRecovered",
            note: format!(
                "spot replicas are ready again; {p_fallback} on-demand stand-ins removed"
            ),
            warning: false,
        });
    }
    out
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
