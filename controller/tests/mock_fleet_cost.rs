//! The fleet cost gauge through the reconciler: after a tick it holds scheduled replicas ×
//! the Model's price per capacity type, as Prometheus renders it; a deleted Model's gauges go
//! to zero. Its own test binary: the Prometheus recorder is process-global.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_controller::fleet_cost::FLEET_COST;
use tidal_controller::reconcile::reconcile;
use tidal_controller::Error;
use tidal_crds::Model;
use tidal_queue::CapacityType;

const NAME: &str = "llama-3-8b";
const ID: &str = "models/llama-3-8b";

/// A pod that is scheduled (on `node`) or Pending, never Ready: cost counts scheduled pods.
fn pod(name: &str, cap: CapacityType, node: Option<&str>) -> Pod {
    worker_pod(name, NAME, cap, node, false)
}

/// Answers every request of one reconcile (applies, scale patches, events, status, deletes,
/// the finaliser's removal) until it returns. The requests themselves are checked in
/// `mock_reconcile.rs` and `mock_spot.rs`; here only the gauge matters.
async fn drive(h: &mut Harness, m: &Arc<Model>) -> Result<Action, Error> {
    let mut task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    loop {
        tokio::select! {
            done = &mut task => return done.unwrap(),
            r = next(&mut h.handle) => {
                if r.method == "DELETE" {
                    r.reply(200, &status_error(200, "Success"));
                } else if r.path.ends_with("/status") {
                    r.reply(200, &serde_json::to_value(&**m).unwrap());
                } else if r.path.ends_with(&format!("/models/{NAME}")) {
                    let mut gone = (**m).clone();
                    gone.metadata.finalizers = None;
                    r.reply(200, &serde_json::to_value(gone).unwrap());
                } else if r.method == "POST" {
                    let body = r.body.clone();
                    r.reply(201, &body);
                } else {
                    r.echo();
                }
            }
        }
    }
}

/// The value of the gauge of `capacity`, as rendered.
fn sample(text: &str, capacity: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{FLEET_COST}{{")))
        .find(|l| {
            l.contains(&format!("model=\"{ID}\""))
                && l.contains(&format!("capacity=\"{capacity}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(String::from)
}

#[tokio::test]
async fn the_gauge_prices_scheduled_replicas_and_is_zeroed_on_delete() {
    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    let mut h = Harness::new().await;
    let m = Arc::new(model("llama", true));
    // llama: spot 350000, on-demand 980000 micro-units per replica-hour. Two spot pods on a
    // node (one not ready yet: it still costs), one spot pod pending (no node, no cost), one
    // on-demand pod on a node.
    h.add_pod(pod("spot-a", CapacityType::Spot, Some("n1")));
    h.add_pod(pod("spot-b", CapacityType::Spot, Some("n2")));
    h.add_pod(pod("spot-c", CapacityType::Spot, None));
    h.add_pod(pod("od-a", CapacityType::OnDemand, Some("n3")));

    drive(&mut h, &m).await.unwrap();
    let text = prometheus.render();
    assert!(
        text.contains(&format!("# TYPE {FLEET_COST} gauge")),
        "{text}"
    );
    assert_eq!(sample(&text, "spot").as_deref(), Some("700000"), "{text}");
    assert_eq!(
        sample(&text, "on_demand").as_deref(),
        Some("980000"),
        "{text}"
    );

    // a spot pod goes: the next tick lowers the rate
    h.pods
        .apply_watcher_event(&kube::runtime::watcher::Event::Delete(pod(
            "spot-b",
            CapacityType::Spot,
            Some("n2"),
        )));
    h.advance(Duration::from_secs(2));
    drive(&mut h, &m).await.unwrap();
    let text = prometheus.render();
    assert_eq!(sample(&text, "spot").as_deref(), Some("350000"), "{text}");

    // deleted: both gauges read zero
    let mut deleted = (*m).clone();
    deleted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(T0 as i64).unwrap()));
    let deleted = Arc::new(deleted);
    assert_eq!(
        drive(&mut h, &deleted).await.unwrap(),
        Action::await_change()
    );
    let text = prometheus.render();
    assert_eq!(sample(&text, "spot").as_deref(), Some("0"), "{text}");
    assert_eq!(sample(&text, "on_demand").as_deref(), Some("0"), "{text}");
}
