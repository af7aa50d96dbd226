//! Spot handling end to end through the reconciler: a spot pod stuck Pending past
//! `fallbackAfterSeconds` brings an on-demand stand-in, a ready spot pod removes it again, an
//! interruption taint on its node brings it back; fleet time reaches the ledger.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::Action;
use serde_json::json;
use tidal_billing::{CapacityType as Billing, Period, Principal};
use tidal_controller::deployment::{build, WorkerConfig};
use tidal_controller::reconcile::reconcile;
use tidal_crds::Model;
use tidal_queue::{Broker, CapacityType, Job};
use uuid::Uuid;

const NS: &str = "models";
const NAME: &str = "llama-3-8b";

fn cfg() -> WorkerConfig {
    WorkerConfig {
        queue_url: "redis://redis:6379".into(),
        key_prefix: None,
    }
}

fn pod(name: &str, cap: CapacityType, node: Option<&str>, ready: bool) -> Pod {
    worker_pod(name, NAME, cap, node, ready)
}

fn node(name: &str, taint: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: taint.map(|k| {
                vec![Taint {
                    key: k.into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]
            }),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// Answers one reconcile's requests: an optional on-demand replicas patch, the events, the
/// status; returns (patched replicas, event reasons, status).
async fn expect_tick(
    h: &mut Harness,
    m: &Model,
    patch: Option<u32>,
    events: &[(&str, &str)],
) -> serde_json::Value {
    if let Some(n) = patch {
        let r = next(&mut h.handle).await;
        assert_eq!(r.method, "PATCH");
        assert_eq!(
            r.path,
            format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-ondemand")
        );
        assert_eq!(r.body, json!({"spec": {"replicas": n}}));
        r.echo();
        let mut d = build(
            m,
            &m.spec.source().unwrap(),
            CapacityType::OnDemand,
            n,
            &cfg(),
        );
        d.metadata.resource_version = Some(format!("{n}"));
        h.add_deployment(d);
    }
    for (reason, kind) in events {
        let ev = next(&mut h.handle).await;
        // a repeated event becomes a PATCH of the first one's series
        assert!(ev.method == "POST" || ev.method == "PATCH", "{}", ev.method);
        assert!(ev
            .path
            .starts_with(&format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")));
        assert_eq!(
            (ev.body["reason"].as_str(), ev.body["type"].as_str()),
            (Some(*reason), Some(*kind))
        );
        let body = ev.body.clone();
        ev.reply(201, &body);
    }
    let r = next(&mut h.handle).await;
    assert_eq!(
        r.path,
        format!("/apis/tidal.dev/v1alpha1/namespaces/{NS}/models/{NAME}/status")
    );
    let status = r.body["status"].clone();
    r.reply(200, &serde_json::to_value(m).unwrap());
    status
}

#[tokio::test]
async fn pending_spot_falls_back_recovers_and_interruption_falls_back_again() {
    let mut h = Harness::new().await;
    let mut m = model("llama", true);
    // the example's office-hours floor holds at T0 (Monday 12:00 UTC); this test follows the
    // demand of its own jobs
    m.spec.scaling.floor_schedule.clear();
    let m = Arc::new(m);
    for _ in 0..3 {
        h.broker
            .enqueue(&Job {
                id: Uuid::now_v7(),
                tenant: "t".into(),
                model: "models/llama-3-8b".into(),
                body: json!({}),
                enqueued_at_ms: T0 * 1000,
                deadline_ms: (T0 + 3600) * 1000,
                resume: None,
            })
            .await
            .unwrap();
    }

    // t0: activation from zero, one spot replica
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    for (suffix, replicas) in [("spot", 1), ("ondemand", 0)] {
        let r = next(&mut h.handle).await;
        assert_eq!(
            r.path,
            format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-{suffix}")
        );
        assert_eq!(r.body["spec"]["replicas"], replicas);
        r.echo();
    }
    let ev = next(&mut h.handle).await;
    assert_eq!(ev.body["reason"], "ScaledUp");
    let body = ev.body.clone();
    ev.reply(201, &body);
    let status = next(&mut h.handle).await;
    status.reply(200, &serde_json::to_value(&*m).unwrap());
    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(2))
    );
    let src = m.spec.source().unwrap();
    h.add_deployment(build(&m, &src, CapacityType::Spot, 1, &cfg()));
    h.add_deployment(build(&m, &src, CapacityType::OnDemand, 0, &cfg()));
    h.add_pod(pod("spot-a", CapacityType::Spot, None, false));

    // t0+30: pending, but not past fallbackAfterSeconds (60): nothing changes
    h.advance(Duration::from_secs(30));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_tick(&mut h, &m, None, &[]).await;
    assert_eq!(status["spot"], json!({"desired": 1, "ready": 0}));
    task.await.unwrap().unwrap();

    // t0+61: still pending: an on-demand stand-in
    h.advance(Duration::from_secs(31));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_tick(&mut h, &m, Some(1), &[("SpotFallback", "Warning")]).await;
    task.await.unwrap().unwrap();
    assert_eq!(status["fallbackReplicas"], 1);
    assert_eq!(status["onDemand"]["desired"], 1);
    let spot_cond = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "SpotAvailable")
        .unwrap()
        .clone();
    assert_eq!(
        (spot_cond["status"].as_str(), spot_cond["reason"].as_str()),
        (Some("False"), Some("SpotFallback"))
    );

    // t0+63: spot capacity arrived and the pod is ready: the stand-in goes
    h.advance(Duration::from_secs(2));
    h.add_node(node("spot-node", None));
    h.add_node(node("od-node", None));
    h.add_pod(pod("spot-a", CapacityType::Spot, Some("spot-node"), true));
    h.add_pod(pod("od-a", CapacityType::OnDemand, Some("od-node"), true));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_tick(&mut h, &m, Some(0), &[("SpotRecovered", "Normal")]).await;
    task.await.unwrap().unwrap();
    assert_eq!(status["phase"], "Ready");
    assert_eq!(status["spot"], json!({"desired": 1, "ready": 1}));

    // t0+65: Karpenter marks the spot node for disruption: a stand-in at once
    h.advance(Duration::from_secs(2));
    h.add_node(node("spot-node", Some("karpenter.sh/disrupted")));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_tick(&mut h, &m, Some(1), &[("SpotFallback", "Warning")]).await;
    task.await.unwrap().unwrap();
    assert_eq!(status["spot"], json!({"desired": 1, "ready": 0}));

    // t0+121: the minute [t0+60, t0+120) closed: fleet time is in the ledger
    h.advance(Duration::from_secs(56));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let _ = expect_tick(&mut h, &m, None, &[]).await;
    task.await.unwrap().unwrap();
    let day = chrono::NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
    let rows = h
        .ledger
        .fleet_usage(
            &Principal::operator(),
            Period::new(day, day.succ_opt().unwrap()).unwrap(),
        )
        .await
        .unwrap();
    let find = |c: Billing| rows.iter().find(|r| r.capacity == c).cloned().unwrap();
    // spot: scheduled from t0+63 to t0+120 (the pod on the disrupted node still costs)
    let spot = find(Billing::Spot);
    assert_eq!(
        (spot.replica_ms, spot.price_per_hour_micros),
        (57_000, 350_000)
    );
    let od = find(Billing::OnDemand);
    assert_eq!((od.replica_ms, od.price_per_hour_micros), (57_000, 980_000));
    assert_eq!(spot.model, "models/llama-3-8b");
}
