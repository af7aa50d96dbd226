//! Tests of status, record state and Events.

use super::*;
use k8s_openapi::jiff::Timestamp;
use tidal_autoscaler::ScalingSpec;
use tidal_autoscaler::{CapacityObserved, Reason};
use tidal_crds::ColdStart;

fn decision(spot: u32, on_demand: u32, fallback: u32) -> Decision {
    Decision {
        spot,
        on_demand,
        fallback,
        serving: spot + on_demand - fallback,
        reason: Reason::Stable,
        panic: false,
        stable_demand: 0.0,
        panic_demand: 0.0,
        prefill_demand: 0.0,
    }
}

fn observed(spot_ready: u32, od_ready: u32, backlog: u64) -> Observed {
    Observed {
        backlog,
        in_flight: 1,
        spot: CapacityObserved {
            ready: spot_ready,
            ..CapacityObserved::default()
        },
        on_demand: CapacityObserved {
            ready: od_ready,
            ..CapacityObserved::default()
        },
        last_request_at: None,
        arrived_prompt_tokens: 0,
        decoding: 0,
    }
}

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

#[test]
fn phases() {
    assert_eq!(
        phase(&observed(0, 0, 0), &decision(0, 0, 0), false),
        Phase::ScaledToZero
    );
    assert_eq!(
        phase(&observed(0, 0, 3), &decision(1, 0, 0), false),
        Phase::Starting
    );
    assert_eq!(
        phase(&observed(1, 0, 3), &decision(2, 0, 0), false),
        Phase::Ready
    );
    assert_eq!(
        phase(&observed(1, 0, 3), &decision(2, 0, 0), true),
        Phase::Degraded
    );
    assert_eq!(
        record_state(&observed(0, 0, 0), &decision(0, 0, 0)),
        ModelState::ScaledToZero
    );
    assert_eq!(
        record_state(&observed(0, 0, 1), &decision(0, 1, 0)),
        ModelState::Starting
    );
    assert_eq!(
        record_state(&observed(0, 1, 1), &decision(0, 1, 0)),
        ModelState::Ready
    );
}

fn constants() -> TimeConstants {
    let cold = Duration::from_secs(75);
    TimeConstants::of(
        &ScalingSpec::for_cold_start(cold),
        ColdStart::measured(cold),
    )
}

#[test]
fn status_reports_per_capacity_and_keeps_transition_times() {
    let o = observed(2, 1, 7);
    let d = decision(3, 2, 1);
    let tick = Tick {
        observed: &o,
        decision: &d,
        generation: Some(4),
        last_request: Some(t(90)),
        degraded: None,
        memory_refusal: None,
        now: t(100),
        measured_cold_start: Some(Duration::from_secs(75)),
        time_constants: constants(),
    };
    let s = status(&tick, None);
    assert_eq!(s.phase, Phase::Ready);
    assert_eq!(s.ready_replicas, 3);
    assert_eq!(
        s.spot,
        CapacityStatus {
            desired: 3,
            ready: 2
        }
    );
    assert_eq!(
        s.on_demand,
        CapacityStatus {
            desired: 2,
            ready: 1
        }
    );
    assert_eq!((s.fallback_replicas, s.backlog, s.in_flight), (1, 7, 1));
    assert_eq!(s.observed_generation, Some(4));
    assert_eq!(s.last_request_time, Some(t(90)));
    assert_eq!(s.measured_cold_start_seconds, Some(75));
    assert_eq!(s.time_constants, Some(constants()));
    let spot = s
        .conditions
        .iter()
        .find(|c| c.type_ == "SpotAvailable")
        .unwrap();
    assert_eq!(
        (spot.status.as_str(), spot.reason.as_str()),
        ("False", "SpotFallback")
    );
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Serving")
    );

    // Same statuses later keep their transition time; a flipped one gets the new time.
    let d2 = decision(3, 0, 0);
    let later = Tick {
        decision: &d2,
        now: t(200),
        ..tick.clone()
    };
    let s2 = status(&later, Some(&s));
    let get = |s: &ModelStatus, ty: &str| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ty)
            .unwrap()
            .last_transition_time
            .clone()
    };
    assert_eq!(get(&s2, "Ready"), t(100));
    assert_eq!(get(&s2, "SpotAvailable"), t(200));
}

#[test]
fn degraded_status_carries_the_message() {
    let o = observed(0, 0, 0);
    let d = decision(0, 0, 0);
    let s = status(
        &Tick {
            observed: &o,
            decision: &d,
            generation: Some(1),
            last_request: None,
            degraded: Some("prices not published: ledger down".into()),
            memory_refusal: None,
            now: t(5),
            measured_cold_start: None,
            time_constants: constants(),
        },
        None,
    );
    assert_eq!(s.phase, Phase::Degraded);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "Degraded");
    assert!(ready.message.contains("ledger down"));
}

#[test]
fn workers_that_do_not_fit_their_device_make_the_model_degraded_with_the_plans_verdict() {
    let verdict = "the model does not fit cuda:0: it needs 482.0 MiB more; lower --kv-cache-memory to at most 7.53 GiB (61672 tokens), or choose a smaller quantisation or device";
    let (o, d) = (observed(0, 0, 0), decision(0, 1, 0));
    let tick = Tick {
        observed: &o,
        decision: &d,
        generation: Some(1),
        last_request: None,
        degraded: None,
        memory_refusal: Some(verdict.into()),
        now: t(5),
        measured_cold_start: None,
        time_constants: constants(),
    };
    let s = status(&tick, None);
    assert_eq!(s.phase, Phase::Degraded);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "DoesNotFit")
    );
    assert!(
        ready
            .message
            .contains("lower --kv-cache-memory to at most 7.53 GiB"),
        "{}",
        ready.message
    );
    // With a replica serving, the Model is Ready and the message still names the refusal.
    let serving = observed(0, 1, 0);
    let s = status(
        &Tick {
            observed: &serving,
            ..tick.clone()
        },
        None,
    );
    assert_eq!(s.phase, Phase::Ready);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "Serving");
    assert!(
        ready
            .message
            .contains("a worker refused to start: the model does not fit"),
        "{}",
        ready.message
    );
}

#[test]
fn invalid_status_sets_spec_valid_false_and_keeps_the_rest() {
    let previous = ModelStatus {
        backlog: 3,
        measured_cold_start_seconds: Some(40),
        time_constants: Some(constants()),
        ..ModelStatus::default()
    };
    let s = invalid_status("bad".into(), Some(2), t(9), Some(&previous));
    assert_eq!(s.phase, Phase::Degraded);
    assert_eq!(s.backlog, 3);
    // the measurement stays; no time constants are in force for a spec not acted on
    assert_eq!(s.measured_cold_start_seconds, Some(40));
    assert_eq!(s.time_constants, None);
    assert_eq!(s.observed_generation, Some(2));
    let c = &s.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("SpecValid", "False", "InvalidSpec")
    );
}

#[test]
fn events_for_scale_up_down_zero_fallback_and_recovery() {
    let reasons = |prev: Option<&Decision>, next: &Decision| {
        notices(prev, next)
            .iter()
            .map(|n| n.reason)
            .collect::<Vec<_>>()
    };
    assert_eq!(reasons(None, &decision(0, 0, 0)), Vec::<&str>::new());
    assert_eq!(reasons(None, &decision(2, 0, 0)), ["ScaledUp"]);
    assert_eq!(
        reasons(Some(&decision(2, 0, 0)), &decision(2, 0, 0)),
        Vec::<&str>::new()
    );
    assert_eq!(
        reasons(Some(&decision(2, 0, 0)), &decision(1, 0, 0)),
        ["ScaledDown"]
    );
    assert_eq!(
        reasons(Some(&decision(2, 0, 0)), &decision(0, 0, 0)),
        ["ScaledToZero"]
    );
    assert_eq!(
        reasons(Some(&decision(2, 0, 0)), &decision(2, 2, 2)),
        ["SpotFallback"]
    );
    assert_eq!(
        reasons(Some(&decision(2, 2, 2)), &decision(2, 0, 0)),
        ["SpotRecovered"]
    );
    assert_eq!(
        reasons(Some(&decision(1, 0, 0)), &decision(3, 1, 1)),
        ["ScaledUp", "SpotFallback"]
    );
    let fallback = &notices(Some(&decision(2, 0, 0)), &decision(2, 2, 2))[0];
    assert!(fallback.warning);
}
