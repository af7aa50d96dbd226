//! A `ModelPool`'s assignment loop against kube's mock API service and the in-memory broker:
//! a queued model is assigned to the worker that has it cached, the worker count follows the
//! pool's demand, each Deployment is applied once and then only scaled, the status lists
//! the workers and their models, and the worker's time is charged to the model it held.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;
use tidal_billing::{CapacityType as Billing, Period, Principal};
use tidal_controller::names::pool_labels;
use tidal_controller::pool_reconcile::{forget_deleted_pools, reconcile_pool};
use tidal_crds::{Model, ModelPool};
use tidal_queue::{Broker, CachedModel, CapacityType, Job, PoolHeartbeat, PoolLoadedModel};
use uuid::Uuid;

const POOL: &str = "models/l4-pool";
const WORKER: &str = "l4-pool-spot-7d9f-x1";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/models/deployments";
const GIB: u64 = 1 << 30;

fn pool() -> ModelPool {
    let mut p: ModelPool =
        serde_yaml::from_str(include_str!("../../crds/examples/pool-gpu-hostpath.yaml")).unwrap();
    p.metadata.uid = Some("pool-uid".into());
    p.metadata.generation = Some(1);
    p
}

fn pooled(name: &str, uid: &str) -> Model {
    let mut m: Model =
        serde_yaml::from_str(include_str!("../../crds/examples/pooled-llama.yaml")).unwrap();
    m.metadata.name = Some(name.into());
    m.metadata.uid = Some(uid.into());
    m
}

fn beat(loaded: &[(&str, u64)], at_ms: u64) -> PoolHeartbeat {
    PoolHeartbeat {
        worker: WORKER.into(),
        pool: POOL.into(),
        node: "node-1".into(),
        capacity_type: CapacityType::Spot,
        memory_total_bytes: 16 * GIB,
        memory_free_bytes: 16 * GIB - 5 * GIB * loaded.len() as u64,
        loaded: loaded
            .iter()
            .map(|(m, tokens)| PoolLoadedModel {
                model: (*m).into(),
                bytes: 5 * GIB,
                running: 0,
                waiting: 0,
                last_used_ms: at_ms,
                tokens_delivered: *tokens,
            })
            .collect(),
        loading: Vec::new(),
        unloading: Vec::new(),
        cached: ["models/llama-a", "models/llama-b"]
            .iter()
            .map(|m| CachedModel {
                model: (*m).into(),
                bytes: 5 * GIB,
                sha256: None,
                warm: true,
            })
            .collect(),
        failed: Vec::new(),
        draining: false,
        last_seen_ms: at_ms,
    }
}

/// Answers the requests of one reconcile: Deployment applies or scales (added to the
/// cache as the watch would), then the status patch, whose body is returned.
async fn serve(h: &mut Harness, p: &ModelPool) -> (Vec<(String, String, Value)>, Value) {
    let task = tokio::spawn(reconcile_pool(Arc::new(p.clone()), h.ctx.clone()));
    let mut deployments = Vec::new();
    loop {
        let r = next(&mut h.handle).await;
        assert_eq!(r.method, "PATCH");
        if r.path.ends_with("/status") {
            let status = r.body["status"].clone();
            r.reply(200, &serde_json::to_value(p).unwrap());
            task.await.unwrap().unwrap();
            return (deployments, status);
        }
        let name = r
            .path
            .trim_start_matches(&format!("{DEPLOYMENTS}/"))
            .to_string();
        let replicas = r.body["spec"]["replicas"].clone();
        if r.content_type == "application/apply-patch+yaml" {
            let d: Deployment = serde_json::from_value(r.body.clone()).unwrap();
            h.add_deployment(d);
            deployments.push((name, "apply".into(), replicas));
        } else {
            deployments.push((name, "scale".into(), replicas));
        }
        r.echo();
    }
}

#[tokio::test]
async fn a_pool_tick_assigns_the_queued_model_scales_the_pool_and_charges_its_time() {
    let mut h = Harness::new().await;
    let p = pool();
    h.add_pool(p.clone());
    h.add_model(pooled("llama-a", "uid-a"));
    h.add_model(pooled("llama-b", "uid-b"));
    let mut pod = worker_pod(WORKER, "unused", CapacityType::Spot, Some("node-1"), true);
    pod.metadata.labels = Some(pool_labels("l4-pool", CapacityType::Spot));
    h.add_pool_pod(pod);
    let t0_ms = T0 * 1000;
    h.broker.pool_heartbeat(&beat(&[], t0_ms)).await.unwrap();
    h.broker
        .enqueue(&Job {
            id: Uuid::now_v7(),
            tenant: "acme".into(),
            model: "models/llama-a".into(),
            body: serde_json::json!({"prompt": "hello", "max_tokens": 4}),
            enqueued_at_ms: t0_ms,
            deadline_ms: 0,
            resume: None,
        })
        .await
        .unwrap();

    // t0: both Deployments applied whole, one spot worker for the one queued request
    let (deps, status) = serve(&mut h, &p).await;
    assert_eq!(
        deps,
        vec![
            ("l4-pool-spot".into(), "apply".into(), Value::from(1)),
            ("l4-pool-ondemand".into(), "apply".into(), Value::from(0)),
        ]
    );
    assert_eq!(
        h.broker.pool_assignment(POOL, WORKER).await.unwrap(),
        Some(vec!["models/llama-a".to_string()])
    );
    assert_eq!(status["workers"][0]["name"], WORKER);
    assert_eq!(status["workers"][0]["node"], "node-1");
    let placed = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Placed")
        .cloned()
        .unwrap();
    assert_eq!(placed["status"], "True", "{placed}");
    let args: Vec<String> = serde_json::from_value(
        h.ctx
            .deployments
            .state()
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some("l4-pool-spot"))
            .map(|d| {
                serde_json::to_value(
                    &d.spec
                        .as_ref()
                        .unwrap()
                        .template
                        .spec
                        .as_ref()
                        .unwrap()
                        .containers[0]
                        .args,
                )
                .unwrap()
            })
            .unwrap(),
    )
    .unwrap();
    assert!(args.contains(
        &"models/llama-a=/cache/models/llama-a/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf".to_string()
    ));

    // t0+2: the worker loaded it; nothing to apply again, the status shows the model
    h.advance(Duration::from_secs(2));
    h.broker
        .pool_heartbeat(&beat(&[("models/llama-a", 0)], t0_ms + 2_000))
        .await
        .unwrap();
    let (deps, status) = serve(&mut h, &p).await;
    assert!(deps.is_empty(), "{deps:?}");
    assert_eq!(
        status["workers"][0]["models"],
        serde_json::json!(["models/llama-a"])
    );

    // t0+62: the minute [t0, t0+60) closed; the worker held only llama-a: all of it is
    // llama-a's, at the pool's spot price
    h.advance(Duration::from_secs(60));
    h.broker
        .pool_heartbeat(&beat(&[("models/llama-a", 40)], t0_ms + 62_000))
        .await
        .unwrap();
    let _ = serve(&mut h, &p).await;
    let day = chrono::NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
    let rows = h
        .ledger
        .fleet_usage(
            &Principal::operator(),
            Period::new(day, day.succ_opt().unwrap()).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].model, "models/llama-a");
    assert_eq!(rows[0].capacity, Billing::Spot);
    assert_eq!(rows[0].price_per_hour_micros, 350_000);
    // [t0, t0+2) at the second tick, and 58 of the 60 s up to the third
    assert_eq!(rows[0].replica_ms, 60_000);
}

#[tokio::test]
async fn a_deleted_pool_is_forgotten_at_the_next_pool_reconcile() {
    let mut h = Harness::new().await;
    let p = pool();
    h.add_pool(p.clone());
    h.add_model(pooled("llama-a", "uid-a"));
    h.broker
        .pool_heartbeat(&beat(&[], T0 * 1000))
        .await
        .unwrap();
    let _ = serve(&mut h, &p).await;
    assert!(h.ctx.pool_memory().contains_key(POOL));
    assert!(
        forget_deleted_pools(&h.ctx).await.is_empty(),
        "still in the cache"
    );
    h.pools
        .apply_watcher_event(&kube::runtime::watcher::Event::Delete(p));
    assert_eq!(forget_deleted_pools(&h.ctx).await, vec![POOL.to_string()]);
    assert!(h.ctx.pool_memory().is_empty());
}
