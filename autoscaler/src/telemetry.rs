//! The policy's metrics, with one set of names for every fleet backend (Kubernetes controller,
//! local fleet) so dashboards do not depend on where the policy ran. Emitting goes through the
//! `metrics` facade: without an installed recorder these calls do nothing.

use crate::observed::Observed;
use crate::policy::Decision;

/// Gauge: desired replicas, labelled `model` and `capacity` (`spot` / `on_demand`).
pub const DESIRED_REPLICAS: &str = "tidal_autoscaler_desired_replicas";
/// Gauge: on-demand replicas standing in for spot, labelled `model`.
pub const FALLBACK_REPLICAS: &str = "tidal_autoscaler_fallback_replicas";
/// Gauge: 1 while in panic mode, labelled `model`.
pub const PANIC: &str = "tidal_autoscaler_panic";
/// Gauge: demand (backlog + in flight) averaged over the stable window, labelled `model`.
pub const STABLE_DEMAND: &str = "tidal_autoscaler_stable_demand";
/// Gauge: demand averaged over the panic window, labelled `model`.
pub const PANIC_DEMAND: &str = "tidal_autoscaler_panic_demand";
/// Gauge: replicas (before rounding) the prompts of the last TTFT target ask for, labelled
/// `model` (zero with prefill sizing off).
pub const PREFILL_DEMAND: &str = "tidal_autoscaler_prefill_demand";
/// Gauge: jobs queued and not claimed, labelled `model`.
pub const BACKLOG: &str = "tidal_autoscaler_backlog";
/// Gauge: jobs claimed and not finished, labelled `model`.
pub const IN_FLIGHT: &str = "tidal_autoscaler_in_flight";
/// Gauge: of those, the jobs whose first token is out (weighed `decodingWeight`), labelled
/// `model`.
pub const DECODING: &str = "tidal_autoscaler_decoding";
/// Counter: decisions, labelled `model` and `reason`.
pub const DECISIONS: &str = "tidal_autoscaler_decisions_total";

/// Records one decision for `model`.
pub fn record(model: &str, observed: &Observed, d: &Decision) {
    let m = model.to_string();
    metrics::gauge!(DESIRED_REPLICAS, "model" => m.clone(), "capacity" => "spot")
        .set(f64::from(d.spot));
    metrics::gauge!(DESIRED_REPLICAS, "model" => m.clone(), "capacity" => "on_demand")
        .set(f64::from(d.on_demand));
    metrics::gauge!(FALLBACK_REPLICAS, "model" => m.clone()).set(f64::from(d.fallback));
    metrics::gauge!(PANIC, "model" => m.clone()).set(if d.panic { 1.0 } else { 0.0 });
    metrics::gauge!(STABLE_DEMAND, "model" => m.clone()).set(d.stable_demand);
    metrics::gauge!(PANIC_DEMAND, "model" => m.clone()).set(d.panic_demand);
    metrics::gauge!(PREFILL_DEMAND, "model" => m.clone()).set(d.prefill_demand);
    metrics::gauge!(BACKLOG, "model" => m.clone()).set(observed.backlog as f64);
    metrics::gauge!(IN_FLIGHT, "model" => m.clone()).set(observed.in_flight as f64);
    metrics::gauge!(DECODING, "model" => m.clone()).set(observed.decoding as f64);
    metrics::counter!(DECISIONS, "model" => m, "reason" => d.reason.to_string()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{decide, PolicyState};
    use crate::spec::ScalingSpec;
    use std::time::Duration;

    #[test]
    fn recording_without_a_recorder_is_harmless() {
        let spec = ScalingSpec::default();
        let mut st = PolicyState::new(&spec);
        let obs = Observed {
            backlog: 3,
            last_request_at: Some(Duration::ZERO),
            ..Observed::default()
        };
        let d = decide(&obs, &spec, &mut st, Duration::ZERO);
        record("ns/model", &obs, &d);
        assert_eq!(d.reason.to_string(), "activation");
    }
}
