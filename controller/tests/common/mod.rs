//! A reconcile context over kube's mock API service, an in-process broker, a SQLite ledger
//! and hand-filled caches, plus helpers that answer the mock's requests one by one.

#![allow(dead_code)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{Request, Response};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::Client;
use serde_json::Value;
use tidal_billing::Ledger;
use tidal_controller::deployment::WorkerConfig;
use tidal_controller::{Context, Settings};
use tidal_crds::{Model, ModelPool};
use tidal_queue::{BrokerConfig, ManualClock, MemoryBroker};
use tower_test::mock::{Handle, SendResponse};

pub type MockHandle = Handle<Request<Body>, Response<Body>>;

/// Everything a reconcile test drives.
pub struct Harness {
    pub ctx: Arc<Context>,
    pub broker: Arc<MemoryBroker>,
    pub ledger: Ledger,
    pub handle: Pin<Box<MockHandle>>,
    pub pods: Writer<Pod>,
    pub nodes: Writer<Node>,
    pub deployments: Writer<Deployment>,
    pub pools: Writer<ModelPool>,
    pub models: Writer<Model>,
    pub pool_pods: Writer<Pod>,
    pub now: Arc<Mutex<SystemTime>>,
}

/// 2026-11-30T12:00:00Z
pub const T0: u64 = 1_796_040_000;

impl Harness {
    pub async fn new() -> Harness {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let broker = Arc::new(MemoryBroker::new(
            BrokerConfig::default(),
            Arc::new(ManualClock::new(T0 * 1000)),
        ));
        // In memory: nothing is left behind in the temp directory.
        let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
        let (pods_r, pods) = reflector::store::<Pod>();
        let (nodes_r, nodes) = reflector::store::<Node>();
        let (deps_r, deployments) = reflector::store::<Deployment>();
        let now = Arc::new(Mutex::new(SystemTime::UNIX_EPOCH + Duration::from_secs(T0)));
        let clock_now = now.clone();
        let (pools_r, pools) = reflector::store::<ModelPool>();
        let (models_r, models) = reflector::store::<Model>();
        let (pool_pods_r, pool_pods) = reflector::store::<Pod>();
        let mut ctx = Context::new(
            client,
            broker.clone(),
            ledger.clone(),
            pods_r,
            nodes_r,
            deps_r,
            Settings {
                tick: Duration::from_secs(2),
                pool_tick: Duration::from_millis(250),
                worker: WorkerConfig {
                    queue_url: "redis://redis:6379".into(),
                    key_prefix: None,
                },
                consumer: "tidal-controller-test".into(),
                delete_grace: Duration::from_secs(30),
            },
            Arc::new(move || *clock_now.lock().unwrap()),
        );
        ctx.pools = pools_r;
        ctx.models = models_r;
        ctx.pool_pods = pool_pods_r;
        let ctx = Arc::new(ctx);
        Harness {
            ctx,
            broker,
            ledger,
            handle: Box::pin(handle),
            pods,
            nodes,
            deployments,
            pools,
            models,
            pool_pods,
            now,
        }
    }

    pub fn add_pool(&mut self, p: ModelPool) {
        self.pools.apply_watcher_event(&watcher::Event::Apply(p));
    }

    pub fn add_model(&mut self, m: Model) {
        self.models.apply_watcher_event(&watcher::Event::Apply(m));
    }

    pub fn add_pool_pod(&mut self, p: Pod) {
        self.pool_pods
            .apply_watcher_event(&watcher::Event::Apply(p));
    }

    pub fn advance(&self, d: Duration) {
        *self.now.lock().unwrap() += d;
    }

    pub fn add_deployment(&mut self, d: Deployment) {
        self.deployments
            .apply_watcher_event(&watcher::Event::Apply(d));
    }

    pub fn add_pod(&mut self, p: Pod) {
        self.pods.apply_watcher_event(&watcher::Event::Apply(p));
    }

    pub fn remove_pod(&mut self, p: Pod) {
        self.pods.apply_watcher_event(&watcher::Event::Delete(p));
    }

    pub fn add_node(&mut self, n: Node) {
        self.nodes.apply_watcher_event(&watcher::Event::Apply(n));
    }
}

/// One request the mock received.
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Query parameters, sorted.
    pub query: Vec<(String, String)>,
    pub content_type: String,
    pub body: Value,
    pub send: SendResponse<Response<Body>>,
}

impl Seen {
    /// Answers with `status` and a JSON body.
    pub fn reply(self, status: u16, body: &Value) {
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        self.send.send_response(resp);
    }

    /// Answers 200 with the request's own body (what an apply or create returns).
    pub fn echo(self) {
        let body = self.body.clone();
        self.reply(200, &body);
    }

    pub fn query_pairs(&self) -> Vec<(&str, &str)> {
        self.query
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// A Kubernetes `Status` error body.
pub fn status_error(code: u16, reason: &str) -> Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code
    })
}

/// Waits for the next request (fails the test after 10 s).
pub async fn next(handle: &mut Pin<Box<MockHandle>>) -> Seen {
    let (req, send) = tokio::time::timeout(Duration::from_secs(10), handle.as_mut().next_request())
        .await
        .expect("no request within 10 s")
        .expect("service dropped");
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let mut query: Vec<(String, String)> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    query.sort();
    let content_type = req
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Seen {
        method,
        path,
        query,
        content_type,
        body,
        send,
    }
}

/// Asserts the mock gets no further request within `d`.
pub async fn assert_quiet(handle: &mut Pin<Box<MockHandle>>, d: Duration) {
    if let Ok(Some((req, _))) = tokio::time::timeout(d, handle.as_mut().next_request()).await {
        panic!("unexpected request {} {}", req.method(), req.uri());
    }
}

/// An example Model with uid, generation and (optionally) the finaliser.
pub fn model(example: &str, finalised: bool) -> Model {
    let text = match example {
        "small" => include_str!("../../../crds/examples/small-cpu-ondemand.yaml"),
        "llama" => include_str!("../../../crds/examples/llama-spot-fallback.yaml"),
        other => panic!("no example {other}"),
    };
    let mut m: Model = serde_yaml::from_str(text).unwrap();
    m.metadata.uid = Some("5f8e6c1a-0000-4000-8000-000000000001".into());
    m.metadata.generation = Some(1);
    m.metadata.resource_version = Some("100".into());
    if finalised {
        m.metadata.finalizers = Some(vec![tidal_crds::FINALIZER.into()]);
    }
    m
}

/// A worker pod of model `models/<name>` on `capacity`: Running on `node` (Ready or not), or
/// Pending (unscheduled) without one. Created at [`T0`].
pub fn worker_pod(
    name: &str,
    model_name: &str,
    capacity: tidal_queue::CapacityType,
    node: Option<&str>,
    ready: bool,
) -> Pod {
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("models".into()),
            labels: Some(tidal_controller::names::labels(model_name, capacity)),
            creation_timestamp: Some(Time(Timestamp::from_second(T0 as i64).unwrap())),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(String::from),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
    }
}
