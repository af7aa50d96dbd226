//! Test harness: a gateway on a real socket over an in-process broker, a scratch SQLite
//! ledger with two tenants (`acme`, `beta`), and helpers to speak HTTP and SSE to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};
use tidal_billing::scratch::ScratchDb;
use tidal_billing::{Ledger, Role};
use tidal_gateway::fake_worker::{FakeWorker, FakeWorkerConfig};
use tidal_gateway::{Gateway, GatewayConfig, MemoryLimiter, RateLimiter};
use tidal_queue::{Broker, MemoryBroker, ModelRecord, ModelState, Prices};

pub const ADMIN: &str = "admin-secret-token";
pub const MODEL: &str = "fake";

/// One process-wide Prometheus recorder (a process can install only one).
pub fn prometheus() -> PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("install recorder")
    })
    .clone()
}

pub struct Harness {
    pub base: String,
    pub broker: Arc<dyn Broker>,
    pub memory: Arc<MemoryBroker>,
    pub ledger: Ledger,
    pub limiter: Arc<dyn RateLimiter>,
    pub gateway: Gateway,
    pub key: String,
    pub key_id: String,
    pub key_b: String,
    pub http: reqwest::Client,
    db: Option<ScratchDb>,
    server: tokio::task::JoinHandle<()>,
}

pub fn config() -> GatewayConfig {
    GatewayConfig {
        admin_token: Some(ADMIN.into()),
        read_block: Duration::from_millis(500),
        prometheus: Some(prometheus()),
        ..GatewayConfig::default()
    }
}

pub async fn serve(gateway: &Gateway) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let router = gateway.router();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}"), task)
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::with(config(), None).await
    }

    /// A harness with `config`, and `limiter` (default: in-process).
    pub async fn with(config: GatewayConfig, limiter: Option<Arc<dyn RateLimiter>>) -> Harness {
        let db = ScratchDb::sqlite("gateway");
        let ledger = Ledger::connect(&db.url).await.unwrap();
        let now = chrono::Utc::now();
        ledger.create_tenant("acme", "Acme", now).await.unwrap();
        ledger.create_tenant("beta", "Beta", now).await.unwrap();
        let k = ledger.issue_key("acme", Role::Tenant, now).await.unwrap();
        let kb = ledger.issue_key("beta", Role::Tenant, now).await.unwrap();
        let memory = Arc::new(MemoryBroker::default());
        let broker: Arc<dyn Broker> = memory.clone();
        let limiter = limiter.unwrap_or_else(|| Arc::new(MemoryLimiter::default()));
        let gateway = Gateway::new(broker.clone(), ledger.clone(), limiter.clone(), config);
        let (base, server) = serve(&gateway).await;
        let h = Harness {
            base,
            broker,
            memory,
            ledger,
            limiter,
            gateway,
            key: k.secret,
            key_id: k.key_id,
            key_b: kb.secret,
            http: reqwest::Client::new(),
            db: Some(db),
            server,
        };
        h.put_model(MODEL, 30_000, 0).await;
        h
    }

    pub async fn put_model(&self, id: &str, max_queue_wait_ms: u64, backlog_cap: u64) {
        self.broker
            .put_model(&ModelRecord {
                id: id.into(),
                state: ModelState::Ready,
                prices: Prices {
                    currency: "USD".into(),
                    input_per_mtok_micros: 150_000,
                    cached_input_per_mtok_micros: 75_000,
                    output_per_mtok_micros: 600_000,
                },
                max_queue_wait_ms,
                backlog_cap,
                context_length: 8192,
            })
            .await
            .unwrap();
    }

    /// A second gateway over the same broker, ledger and limiter (another replica, or this one
    /// restarted), serving on its own port: its base URL and server task.
    pub async fn second_gateway(&self) -> (String, tokio::task::JoinHandle<()>) {
        let g2 = Gateway::new(
            self.broker.clone(),
            self.ledger.clone(),
            self.limiter.clone(),
            config(),
        );
        serve(&g2).await
    }

    /// Waits until `model` has `n` jobs queued (not yet claimed).
    pub async fn until_backlog(&self, model: &str, n: u64) {
        let b = self.broker.clone();
        let model = model.to_owned();
        eventually(&format!("{n} jobs of {model} queued"), || {
            let (b, model) = (b.clone(), model.clone());
            async move { b.depth(&model).await.unwrap().backlog == n }
        })
        .await;
    }

    pub fn worker(&self, model: &str, delay_ms: u64) -> FakeWorker {
        FakeWorker::spawn(
            self.broker.clone(),
            FakeWorkerConfig {
                token_delay: Duration::from_millis(delay_ms),
                ..FakeWorkerConfig::new(model, format!("w-{}", uuid::Uuid::now_v7()))
            },
        )
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::Response {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send().await.unwrap()
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> reqwest::Response {
        let mut r = self.http.get(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send().await.unwrap()
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send().await.unwrap()
    }

    pub async fn stop(mut self) {
        self.server.abort();
        self.ledger.close().await;
        if let Some(db) = self.db.take() {
            let _ = db.drop_db().await;
        }
    }
}

pub fn chat(content: &str, stream: bool) -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
    .to_string()
}

/// Asserts an OpenAI error body with `status`; returns it.
pub async fn error(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    assert!(
        resp.headers().get("x-request-id").is_some(),
        "x-request-id on errors too"
    );
    let body: Value = resp.json().await.unwrap();
    let e = &body["error"];
    assert!(e["message"].is_string(), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    body
}

/// One parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub id: Option<u64>,
    pub data: String,
}

pub fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .filter_map(|block| {
            let mut id = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                }
            }
            (!data.is_empty()).then(|| Sse {
                id,
                data: data.join("\n"),
            })
        })
        .collect()
}

/// Reads SSE events from a streaming response until `n` have arrived (then returns them
/// and the still-open body stream).
pub async fn read_events(
    resp: reqwest::Response,
    n: usize,
) -> (
    Vec<Sse>,
    impl futures::Stream<Item = reqwest::Result<bytes_alias::Bytes>>,
) {
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    loop {
        let evs = parse_sse(buf.rsplit_once("\n\n").map_or("", |(done, _)| done));
        if evs.len() >= n {
            return (evs, stream);
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

pub mod bytes_alias {
    pub use axum::body::Bytes;
}

/// Text of the deltas of chat or completion chunks.
pub fn chunk_text(events: &[Sse]) -> String {
    events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|v| {
            let c = &v["choices"][0];
            c["delta"]["content"]
                .as_str()
                .or_else(|| c["text"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

/// Polls `f` until it is true (at most 5 s).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Plays a worker of `model`: waits until one job can be claimed and returns it.
pub async fn claim_one(broker: &dyn Broker, model: &str) -> tidal_queue::ClaimedJob {
    loop {
        let mut got = broker
            .claim(model, "w", 1, Duration::from_millis(200))
            .await
            .unwrap();
        if let Some(job) = got.pop() {
            return job;
        }
    }
}
