//! Tests of a pool Model's record and status, and of which Models a pool serves.

use super::*;
use crate::pool_reconcile::{floor_workers, pool_models};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use tidal_queue::CapacityType;

fn pooled() -> Model {
    serde_yaml::from_str(include_str!("../../crds/examples/pooled-llama.yaml")).unwrap()
}

fn own_fleet() -> Model {
    serde_yaml::from_str(include_str!("../../crds/examples/llama-spot-fallback.yaml")).unwrap()
}

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

#[test]
fn a_pool_model_is_still_published_with_its_own_prices_and_admission() {
    let m = pooled();
    let ready = PoolView {
        pool: "l4-pool".into(),
        found: true,
        ready_workers: 2,
    };
    let r = pooled_record(&m, "models/llama-3-8b-pooled", &ready);
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        serde_json::to_value(ModelRecord {
            id: "models/llama-3-8b-pooled".into(),
            state: ModelState::Ready,
            prices: queue_prices(&m.spec),
            max_queue_wait_ms: 300_000,
            backlog_cap: 2000,
            context_length: 8192,
        })
        .unwrap()
    );
    assert_eq!(r.prices.output_per_mtok_micros, 600_000);
    let cold = PoolView {
        ready_workers: 0,
        ..ready
    };
    assert_eq!(
        pooled_record(&m, "models/llama-3-8b-pooled", &cold).state,
        ModelState::ScaledToZero
    );
}

#[test]
fn the_status_names_the_pool_and_keeps_transition_times() {
    let view = PoolView {
        pool: "l4-pool".into(),
        found: false,
        ready_workers: 0,
    };
    let depth = QueueDepth {
        backlog: 3,
        ..QueueDepth::default()
    };
    let first = pooled_status(&view, depth, Some(2), t(100), None);
    assert_eq!(first.phase, Phase::ScaledToZero);
    assert_eq!(first.backlog, 3);
    let c = &first.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (SERVED_BY_POOL, "False", "PoolNotFound")
    );
    assert!(c.message.contains("l4-pool"), "{}", c.message);
    let found = PoolView {
        found: true,
        ready_workers: 1,
        ..view
    };
    let next = pooled_status(&found, depth, Some(2), t(200), Some(&first));
    assert_eq!(next.phase, Phase::Ready);
    let c = &next.conditions[0];
    assert_eq!(
        (c.status.as_str(), c.last_transition_time.clone()),
        ("True", t(200))
    );
    assert_eq!(c.message, "served by ModelPool l4-pool");
    // SpecValid did not change: its time is kept
    assert_eq!(next.conditions[1].last_transition_time, t(100));
    assert_eq!((next.spot.desired, next.on_demand.desired), (0, 0));
}

#[test]
fn a_pool_serves_the_valid_models_of_its_namespace_that_name_it() {
    let a = pooled();
    let mut b = pooled();
    b.metadata.name = Some("a-first".into());
    let mut elsewhere = pooled();
    elsewhere.metadata.namespace = Some("other".into());
    let mut other_pool = pooled();
    other_pool.spec.pool = Some("cpu-pool".into());
    let mut invalid = pooled();
    invalid.metadata.name = Some("bad".into());
    invalid.spec.resources.gpus = 1;
    let all: Vec<Arc<Model>> = [a, b, elsewhere, other_pool, invalid, own_fleet()]
        .into_iter()
        .map(Arc::new)
        .collect();
    let names: Vec<String> = pool_models(&all, "models", "l4-pool")
        .iter()
        .map(|m| m.model.name_any())
        .collect();
    assert_eq!(names, ["a-first", "llama-3-8b-pooled"]);
}

#[test]
fn a_new_pool_deployment_starts_at_the_floor_split_by_capacity_mode() {
    let mut p: ModelPool =
        serde_yaml::from_str(include_str!("../../crds/examples/pool-gpu-hostpath.yaml")).unwrap();
    p.spec.scaling.min_workers = 3;
    p.spec.capacity.base_on_demand_replicas = 1;
    assert_eq!(floor_workers(&p, CapacityType::Spot), 2);
    assert_eq!(floor_workers(&p, CapacityType::OnDemand), 1);
    p.spec.capacity.mode = tidal_crds::CapacityMode::OnDemand;
    assert_eq!(floor_workers(&p, CapacityType::Spot), 0);
    assert_eq!(floor_workers(&p, CapacityType::OnDemand), 3);
}
