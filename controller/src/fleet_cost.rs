//! The fleet's current cost rate as a Prometheus gauge, so dashboards can show the platform's
//! cost per million tokens without reading the ledger.
//!
//! The rate counts the same replicas as fleet time ([`crate::fleet_time`]): pods scheduled on
//! a node, whatever their readiness, priced at the Model's `costPerReplicaHourMicros` of their
//! capacity type. Integrating the gauge over time gives what the ledger records, up to the
//! tick length.

use tidal_crds::Model;
use tidal_queue::CapacityType;

/// Gauge: cost of the fleet per hour right now, in micro-units of the pricing currency,
/// labelled `model` (`namespace/name`) and `capacity` (`spot` / `on_demand`, as the
/// autoscaler's metrics).
pub const FLEET_COST: &str = "tidal_fleet_cost_micros_per_hour";

/// Cost per hour of `replicas` replicas at `per_replica_hour` micro-units each. A negative
/// price (the CRD's schema rejects it) counts as zero; the product saturates.
pub fn cost_per_hour_micros(replicas: u32, per_replica_hour: i64) -> u64 {
    u64::from(replicas).saturating_mul(u64::try_from(per_replica_hour).unwrap_or(0))
}

fn capacity_label(c: CapacityType) -> &'static str {
    match c {
        CapacityType::Spot => "spot",
        CapacityType::OnDemand => "on_demand",
    }
}

/// Sets the gauge of `model` (id `namespace/name`) on `capacity` to `replicas` scheduled
/// replicas at the Model's price, in the current `metrics` recorder (the reconciler's is its
/// [`crate::model_metrics::ModelMetrics`], which drops the gauges of a deleted Model).
pub fn record(id: &str, model: &Model, capacity: CapacityType, replicas: u32) {
    let pool = match capacity {
        CapacityType::Spot => &model.spec.capacity.spot,
        CapacityType::OnDemand => &model.spec.capacity.on_demand,
    };
    let micros = cost_per_hour_micros(replicas, pool.cost_per_replica_hour_micros);
    // f64 holds every integer below 2^53 exactly: about 9e9 currency units an hour.
    metrics::gauge!(FLEET_COST, "model" => id.to_string(), "capacity" => capacity_label(capacity))
        .set(micros as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn llama() -> Model {
        serde_yaml::from_str(include_str!("../../crds/examples/llama-spot-fallback.yaml")).unwrap()
    }

    /// The sample of `capacity` in the exposition text, e.g. `350000`.
    fn sample<'a>(text: &'a str, model: &str, capacity: &str) -> Option<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{FLEET_COST}{{")))
            .find(|l| {
                l.contains(&format!("model=\"{model}\""))
                    && l.contains(&format!("capacity=\"{capacity}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
    }

    #[test]
    fn the_rate_is_replicas_times_the_price() {
        assert_eq!(cost_per_hour_micros(3, 350_000), 1_050_000);
        assert_eq!(cost_per_hour_micros(0, 980_000), 0);
        assert_eq!(cost_per_hour_micros(2, -5), 0);
        assert_eq!(cost_per_hour_micros(u32::MAX, i64::MAX), u64::MAX);
    }

    #[test]
    fn prometheus_sees_the_gauge_per_model_and_capacity() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let m = llama();
        metrics::with_local_recorder(&recorder, || {
            record("models/llama-3-8b", &m, CapacityType::Spot, 3);
            record("models/llama-3-8b", &m, CapacityType::OnDemand, 1);
        });
        let text = handle.render();
        assert!(
            text.contains(&format!("# TYPE {FLEET_COST} gauge")),
            "{text}"
        );
        assert_eq!(sample(&text, "models/llama-3-8b", "spot"), Some("1050000"));
        assert_eq!(
            sample(&text, "models/llama-3-8b", "on_demand"),
            Some("980000")
        );
    }
}
