//! `tidal bench gateway`: what the gateway adds to a request. The same load goes to a direct
//! OpenAI server backed by the fake model ([`crate::fake_worker::fake_output`], no queue) and
//! through the gateway + Redis broker + Redis rate limiter to a [`FakeWorker`] producing the
//! same output; the report gives both latency distributions, the added median and p99, and
//! requests/s.
//!
//! Closed loop (`clients` concurrent clients, each sending its next request when the last
//! one is answered) measures the maximum requests/s; open loop (`rate_per_s`) measures
//! latency at a fixed offered load. Everything (load generator, servers, worker) runs in
//! this process on loopback, so on a small machine they compete for the same cores.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde::Serialize;
use tidal_billing::{Ledger, Role};
use tidal_protocol::chat::ChatCompletionRequest;
use tidal_protocol::error::parse_json;
use tidal_protocol::job::JobRequest;
use tidal_protocol::render::{Endpoint, ResponseMeta};
use tidal_protocol::usage::Usage;
use tidal_queue::bench::quantile;
use tidal_queue::{Broker, BrokerConfig, ModelRecord, ModelState, Prices, RedisBroker};
use tokio::task::JoinSet;

use crate::fake_worker::{fake_output, FakeWorker, FakeWorkerConfig};
use crate::limits::RedisLimiter;
use crate::{Gateway, GatewayConfig};

/// Load shape of a run.
#[derive(Debug, Clone)]
pub struct GatewayBenchOptions {
    /// Redis for the broker and the rate limiter (a fresh key prefix per run, removed after).
    pub redis_url: String,
    /// Ledger database; `None`: a temporary SQLite file.
    pub database_url: Option<String>,
    /// Concurrent clients (closed loop).
    pub clients: usize,
    /// Requests per mode.
    pub requests: usize,
    /// Completion tokens per request (words the fake model echoes).
    pub tokens: usize,
    /// Open loop at this rate instead of closed loop.
    pub rate_per_s: Option<u32>,
    /// Fake-worker jobs at once.
    pub worker_batch: usize,
}

impl Default for GatewayBenchOptions {
    fn default() -> Self {
        GatewayBenchOptions {
            redis_url: "redis://127.0.0.1:6379".into(),
            database_url: None,
            clients: 64,
            requests: 4_000,
            tokens: 4,
            rate_per_s: None,
            worker_batch: 64,
        }
    }
}

/// Latency and throughput of one path.
#[derive(Debug, Clone, Serialize)]
pub struct PathReport {
    /// Requests answered with 200.
    pub requests: usize,
    /// Wall time.
    pub elapsed_s: f64,
    /// Answered requests per second.
    pub requests_per_s: f64,
    /// Median latency (send to full body).
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
}

/// Both paths and the difference.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayBenchReport {
    /// `closed_loop` or `open_loop`.
    pub mode: &'static str,
    /// Concurrent clients (closed loop) or offered requests/s (open loop).
    pub load: usize,
    /// Completion tokens per request.
    pub tokens: usize,
    /// Direct to the fake model's HTTP server.
    pub direct: PathReport,
    /// Through gateway + Redis + fake worker.
    pub gateway: PathReport,
    /// Gateway median minus direct median.
    pub added_p50_ms: f64,
    /// Gateway p99 minus direct p99.
    pub added_p99_ms: f64,
}

/// What can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Broker trouble.
    #[error("queue: {0}")]
    Queue(#[from] tidal_queue::QueueError),
    /// Ledger trouble.
    #[error("ledger: {0}")]
    Ledger(#[from] tidal_billing::Error),
    /// Rate limiter trouble.
    #[error("limiter: {0}")]
    Limiter(#[from] crate::limits::LimitError),
    /// Redis trouble (cleanup).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// HTTP client trouble.
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    /// Socket trouble.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A request got a non-200 answer.
    #[error("request failed: {0}")]
    Failed(String),
}

const MODEL: &str = "bench-fake";

/// The direct server: the fake model behind `/v1/chat/completions`, non-streaming.
fn direct_router() -> Router {
    Router::new().route(
        "/v1/chat/completions",
        post(|body: Bytes| async move {
            let req: ChatCompletionRequest = match parse_json(&body) {
                Ok(r) => r,
                Err(e) => {
                    return (axum::http::StatusCode::BAD_REQUEST, Json(e.body())).into_response()
                }
            };
            let out = fake_output(&JobRequest::Chat(req.clone()));
            let id = uuid::Uuid::now_v7().simple().to_string();
            let meta = ResponseMeta::new(Endpoint::Chat, &id, 0, req.model);
            let n = out.pieces.len();
            let body = meta.whole(
                out.pieces.concat(),
                None,
                match out.finish {
                    tidal_queue::FinishReason::Stop => "stop",
                    tidal_queue::FinishReason::Length => "length",
                },
                Usage::new(out.prompt_tokens as usize, 0, n),
            );
            Json(body).into_response()
        }),
    )
}

async fn serve(router: Router) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((addr, task))
}

fn body(tokens: usize) -> String {
    let words: Vec<String> = (0..tokens).map(|i| format!("w{i}")).collect();
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": words.join(" ")}],
        "max_tokens": tokens,
    })
    .to_string()
}

async fn one(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &str,
) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let resp = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    if !status.is_success() {
        return Err(BenchError::Failed(format!("{status}: {text}")));
    }
    Ok(t.elapsed())
}

async fn load(
    base: SocketAddr,
    key: &str,
    opts: &GatewayBenchOptions,
) -> Result<PathReport, BenchError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.clients.max(1) * 2)
        .build()?;
    let url = Arc::new(format!("http://{base}/v1/chat/completions"));
    let body = Arc::new(body(opts.tokens));
    let key = Arc::new(key.to_owned());
    let started = Instant::now();
    let mut tasks: JoinSet<Result<Vec<Duration>, BenchError>> = JoinSet::new();
    match opts.rate_per_s {
        None => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..opts.clients.max(1) {
                let (c, u, b, k, n) = (
                    client.clone(),
                    url.clone(),
                    body.clone(),
                    key.clone(),
                    next.clone(),
                );
                let total = opts.requests;
                tasks.spawn(async move {
                    let mut lat = Vec::new();
                    while n.fetch_add(1, Ordering::Relaxed) < total {
                        lat.push(one(&c, &u, &k, &b).await?);
                    }
                    Ok(lat)
                });
            }
        }
        Some(rate) => {
            let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for _ in 0..opts.requests {
                tick.tick().await;
                let (c, u, b, k) = (client.clone(), url.clone(), body.clone(), key.clone());
                tasks.spawn(async move { Ok(vec![one(&c, &u, &k, &b).await?]) });
            }
        }
    }
    let mut all = Vec::with_capacity(opts.requests);
    while let Some(r) = tasks.join_next().await {
        let lat = r.map_err(|e| BenchError::Failed(format!("client task: {e}")))??;
        all.extend(lat);
    }
    let elapsed = started.elapsed();
    all.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(PathReport {
        requests: all.len(),
        elapsed_s: elapsed.as_secs_f64(),
        requests_per_s: all.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: ms(quantile(&all, 0.5)),
        p99_ms: ms(quantile(&all, 0.99)),
        max_ms: ms(quantile(&all, 1.0)),
    })
}

async fn delete_prefix(url: &str, prefix: &str) -> Result<(), BenchError> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<i64>(&mut c)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Runs both paths (direct first, then through the gateway) and reports.
pub async fn bench_gateway(opts: GatewayBenchOptions) -> Result<GatewayBenchReport, BenchError> {
    let prefix = format!("tidal-bench-{}:", uuid::Uuid::now_v7().simple());
    let sqlite = std::env::temp_dir().join(format!(
        "tidal_gateway_bench_{}.db",
        uuid::Uuid::now_v7().simple()
    ));
    let db_url = opts
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", sqlite.display()));
    let result = async {
        let broker_cfg = BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        };
        let broker: Arc<dyn Broker> =
            Arc::new(RedisBroker::connect(&opts.redis_url, broker_cfg.clone()).await?);
        let worker_broker: Arc<dyn Broker> =
            Arc::new(RedisBroker::connect(&opts.redis_url, broker_cfg).await?);
        broker
            .put_model(&ModelRecord {
                id: MODEL.into(),
                state: ModelState::Ready,
                prices: Prices {
                    currency: "USD".into(),
                    input_per_mtok_micros: 0,
                    cached_input_per_mtok_micros: 0,
                    output_per_mtok_micros: 0,
                },
                max_queue_wait_ms: 60_000,
                backlog_cap: 0,
                context_length: 4096,
            })
            .await?;
        let ledger = Ledger::connect(&db_url).await?;
        let tenant = format!("bench-{}", uuid::Uuid::now_v7().simple());
        let now = chrono::Utc::now();
        ledger.create_tenant(&tenant, "benchmark", now).await?;
        let key = ledger.issue_key(&tenant, Role::Tenant, now).await?;
        let limiter = Arc::new(RedisLimiter::connect(&opts.redis_url, &prefix).await?);
        let gateway = Gateway::new(broker, ledger.clone(), limiter, GatewayConfig::default());
        let worker = FakeWorker::spawn(
            worker_broker,
            FakeWorkerConfig {
                batch: opts.worker_batch,
                ..FakeWorkerConfig::new(MODEL, "bench-worker")
            },
        );
        let (direct_addr, direct_task) = serve(direct_router()).await?;
        let (gw_addr, gw_task) = serve(gateway.router()).await?;

        // Warm up connections and caches on both paths.
        let warm = GatewayBenchOptions {
            requests: opts.clients.min(64),
            rate_per_s: None,
            ..opts.clone()
        };
        load(direct_addr, &key.secret, &warm).await?;
        load(gw_addr, &key.secret, &warm).await?;

        let direct = load(direct_addr, &key.secret, &opts).await?;
        let through = load(gw_addr, &key.secret, &opts).await?;
        worker.stop().await;
        direct_task.abort();
        gw_task.abort();
        ledger.close().await;
        Ok::<_, BenchError>(GatewayBenchReport {
            mode: if opts.rate_per_s.is_some() {
                "open_loop"
            } else {
                "closed_loop"
            },
            load: opts.rate_per_s.map_or(opts.clients, |r| r as usize),
            tokens: opts.tokens,
            added_p50_ms: through.p50_ms - direct.p50_ms,
            added_p99_ms: through.p99_ms - direct.p99_ms,
            direct,
            gateway: through,
        })
    }
    .await;
    delete_prefix(&opts.redis_url, &prefix).await?;
    if opts.database_url.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", sqlite.display()));
        }
    }
    result
}
