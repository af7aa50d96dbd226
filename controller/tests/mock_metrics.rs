//! The controller's `/metrics` through the reconciler, scraped over HTTP as Prometheus does:
//! after a tick the fleet cost gauge holds scheduled replicas × the Model's price per capacity
//! type and the autoscaler's gauges hold the decision; once the Model is deleted none of its
//! series are left. Its own test binary: the Prometheus recorder is process-global.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_autoscaler::telemetry;
use tidal_controller::fleet_cost::FLEET_COST;
use tidal_controller::http::{router, Render};
use tidal_controller::reconcile::reconcile;
use tidal_controller::Error;
use tidal_crds::Model;
use tidal_queue::{Broker, CapacityType};

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

/// Serves the controller's router as `run` does (the exporter's text, then the Models'
/// series) on a free local port; returns its address.
async fn serve(h: &Harness, exporter: Render, leading: bool) -> std::net::SocketAddr {
    let render = h.ctx.model_metrics.clone().appended_to(exporter);
    let (tx, rx) = tokio::sync::watch::channel(leading);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _keep = tx;
        axum::serve(listener, router(rx, render)).await.unwrap();
    });
    addr
}

/// `GET path` over plain HTTP/1.1: (status line, content-type, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: controller\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_string();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(String::from)
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, content_type, body) = get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(content_type, "text/plain; version=0.0.4");
    body
}

/// The lines of `text` about the model.
fn series_of(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains(&format!("model=\"{ID}\"")))
        .collect()
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
async fn metrics_show_a_models_gauges_until_it_is_deleted() {
    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    let mut h = Harness::new().await;
    let addr = serve(&h, Arc::new(move || prometheus.render()), true).await;
    let (status, content_type, body) = get(addr, "/health").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(content_type, "application/json");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"status": "ok", "leader": true})
    );
    // the process's own series stay in the exporter
    metrics::counter!("tidal_controller_reconcile_errors_total").increment(1);
    let m = Arc::new(model("llama", true));
    // llama: spot 350000, on-demand 980000 micro-units per replica-hour. Two spot pods on a
    // node (one not ready yet: it still costs), one spot pod pending (no node, no cost), one
    // on-demand pod on a node.
    h.add_pod(pod("spot-a", CapacityType::Spot, Some("n1")));
    h.add_pod(pod("spot-b", CapacityType::Spot, Some("n2")));
    h.add_pod(pod("spot-c", CapacityType::Spot, None));
    h.add_pod(pod("od-a", CapacityType::OnDemand, Some("n3")));

    for _ in 0..3 {
        h.broker
            .enqueue(&tidal_queue::Job {
                id: uuid::Uuid::now_v7(),
                tenant: "t".into(),
                model: ID.into(),
                body: serde_json::json!({}),
                enqueued_at_ms: T0 * 1000,
                deadline_ms: (T0 + 3600) * 1000,
                resume: None,
            })
            .await
            .unwrap();
    }

    drive(&mut h, &m).await.unwrap();
    let text = scrape(addr).await;
    assert!(
        text.contains(&format!("# TYPE {FLEET_COST} gauge")),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}{{model=\"{ID}\"}} 3\n", telemetry::BACKLOG)),
        "{text}"
    );
    for name in [
        telemetry::DESIRED_REPLICAS,
        telemetry::PANIC,
        telemetry::DECISIONS,
    ] {
        assert!(
            text.contains(&format!("{name}{{model=\"{ID}\"")),
            "{name}: {text}"
        );
    }
    assert!(
        text.contains("tidal_controller_reconcile_errors_total 1\n"),
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
    let text = scrape(addr).await;
    assert_eq!(sample(&text, "spot").as_deref(), Some("350000"), "{text}");

    // deleted (the finaliser withdraws the three jobs): no series of the model is left but
    // the queue's counters, which the controller's process does not own (its finaliser adds
    // to them while withdrawing) and which only ever count up
    let mut deleted = (*m).clone();
    deleted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(T0 as i64).unwrap()));
    let deleted = Arc::new(deleted);
    assert_eq!(
        drive(&mut h, &deleted).await.unwrap(),
        Action::await_change()
    );
    let text = scrape(addr).await;
    let left: Vec<&str> = series_of(&text)
        .into_iter()
        .filter(|l| !l.starts_with("tidal_queue_jobs_"))
        .collect();
    assert!(left.is_empty(), "{left:?}\n{text}");
    assert!(
        text.contains("tidal_controller_reconcile_errors_total 1\n"),
        "{text}"
    );
}
