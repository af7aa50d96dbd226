//! Assembles and runs the one-process platform: ledger, broker, gateway, metering consumer
//! and local fleet, plus the `/local/status` route `tidal status` reads.
//!
//! Shutdown order matters for "nothing lost": the listener stops taking connections, the
//! fleet drains its workers (sequences finish within the drain timeout; the rest are
//! re-enqueued), every job still queued is answered with an error its client receives, the
//! open HTTP responses complete, and the metering consumer catches up with the usage stream
//! before the ledger closes.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::Utc;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tidal_autoscaler::ScalingSpec;
use tidal_billing::consumer::{self, ConsumerConfig};
use tidal_billing::queue_source::{QueueSource, QueueSourceConfig};
use tidal_billing::{Ledger, Month, Principal};
use tidal_gateway::{Gateway, GatewayConfig, MemoryLimiter, RateLimiter, RedisLimiter};
use tidal_protocol::ApiError;
use tidal_queue::{
    fail_job, Broker, BrokerConfig, JobFailure, MemoryBroker, ModelRecord, ModelState, Prices,
    RedisBroker, SystemClock,
};
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::model::{ModelConfig, ModelFile, QuantizeTo};
use tokio::sync::watch;

use crate::credentials::{self, Credentials};
use crate::fetch::{self, FetchConfig};
use crate::fleet::{Fleet, FleetConfig, FleetModel, FleetStatus, ModelStatus, PoolFleet};
use crate::launcher::{LaunchSpec, PoolLauncher, RuntimeLauncher};
use crate::source::ModelSource;
use tidal_autoscaler::pool::PoolSpec;
use tidal_runtime::worker::pool::PinnedModel;

/// Everything `tidal up` can be told.
#[derive(Debug, Clone)]
pub struct UpConfig {
    /// Models to serve (at least one).
    pub models: Vec<ModelSource>,
    /// Address of the API.
    pub listen: SocketAddr,
    /// Ledger file and credentials live here.
    pub data_dir: PathBuf,
    /// Ledger database URL instead of `data_dir/ledger.sqlite` (e.g. `postgres://...`).
    pub ledger_url: Option<String>,
    /// Redis URL instead of the in-process broker.
    pub redis_url: Option<String>,
    /// Broker key prefix (Redis).
    pub key_prefix: String,
    /// Where model downloads are cached.
    pub fetch: FetchConfig,
    /// Engine settings of every worker.
    pub engine: EngineConfig,
    /// Re-quantise weights at load.
    pub quantize: Option<QuantizeTo>,
    /// Scaling of every model (scale-to-zero idle time, max workers, ...); with `pool`,
    /// of the pool's workers.
    pub scaling: ScalingSpec,
    /// Serve every model from one warm pool of workers that load and unload models on
    /// demand (`--pool-memory`) instead of a fleet per model.
    pub pool: Option<UpPool>,
    /// Prices of every model, micro-units per million tokens.
    pub prices: Prices,
    /// Longest a request waits for a worker (cold start included) before a 503.
    pub max_queue_wait: Duration,
    /// Most queued jobs per model before a 503.
    pub backlog_cap: u64,
    /// How long a stopping worker lets its sequences finish.
    pub drain_timeout: Duration,
    /// How much queued prefill stops a worker's claims (`tidal runtime
    /// --claim-prefill-budget`); default one second of its measured prefill.
    pub claim_budget: tidal_runtime::worker::ClaimBudget,
    /// Renders `/metrics`.
    pub prometheus: Option<PrometheusHandle>,
}

/// The local model pool (`tidal up --pool-memory`).
#[derive(Debug, Clone)]
pub struct UpPool {
    /// What one worker's models may take (weights, KV cache, activations), bytes.
    pub worker_memory_bytes: u64,
    /// A model idle on a worker this long is unloaded.
    pub idle_unload_after: Duration,
}

/// What the CLI prints once the platform is up.
#[derive(Debug, Clone)]
pub struct Started {
    /// Where the API listens.
    pub addr: SocketAddr,
    /// The tenant key and admin token.
    pub credentials: Credentials,
    /// Whether they were created by this start.
    pub new_credentials: bool,
    /// Served models: (name, file).
    pub models: Vec<(String, PathBuf)>,
    /// Ledger location.
    pub ledger_url: String,
}

/// Why the platform could not start (or stopped with an error).
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("no model to serve")]
    NoModels,
    #[error("two models are named `{0}`; name them with NAME=SOURCE")]
    DuplicateName(String),
    #[error("model `{name}`")]
    Fetch {
        name: String,
        source: fetch::FetchError,
    },
    #[error("model `{name}` ({path}): {message}")]
    Model {
        name: String,
        path: PathBuf,
        message: String,
    },
    #[error("ledger {url}")]
    Ledger {
        url: String,
        source: tidal_billing::Error,
    },
    #[error("credentials")]
    Credentials(#[from] credentials::CredentialsError),
    #[error("broker")]
    Broker(#[from] tidal_queue::QueueError),
    #[error("rate limiter: {0}")]
    Limiter(String),
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Task(String),
}

struct StatusState {
    fleet: FleetStatus,
    ledger: Ledger,
    /// Checks the admin token the same way the admin API does.
    gateway: Gateway,
}

/// What `GET /local/status` returns.
#[derive(Debug, Serialize)]
pub struct PlatformStatus {
    pub models: Vec<ModelStatus>,
    /// This month's usage by tenant and model.
    pub usage: Vec<tidal_billing::UsageRow>,
}

/// Runs the platform until `shutdown` completes; calls `on_started` once it serves.
pub async fn run(
    config: UpConfig,
    shutdown: impl Future<Output = ()> + Send,
    on_started: impl FnOnce(&Started) + Send,
) -> Result<(), UpError> {
    if config.models.is_empty() {
        return Err(UpError::NoModels);
    }
    let mut names = std::collections::HashSet::new();
    for m in &config.models {
        if !names.insert(m.name.clone()) {
            return Err(UpError::DuplicateName(m.name.clone()));
        }
    }

    // Models first: a typo in a path should fail before anything else is created.
    let mut resolved = Vec::new();
    for source in &config.models {
        let path = fetch::resolve(source, &config.fetch)
            .await
            .map_err(|source_err| UpError::Fetch {
                name: source.name.clone(),
                source: source_err,
            })?;
        let context_length = read_context_length(&source.name, &path)?;
        resolved.push((source.name.clone(), path, context_length));
    }

    let ledger_url = config
        .ledger_url
        .clone()
        .unwrap_or_else(|| crate::paths::local_ledger_url(&config.data_dir));
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| UpError::Task(format!("creating {}: {e}", config.data_dir.display())))?;
    let ledger_err = |source| UpError::Ledger {
        url: ledger_url.clone(),
        source,
    };
    let ledger = Ledger::connect(&ledger_url).await.map_err(ledger_err)?;
    ledger.migrate().await.map_err(ledger_err)?;
    let (creds, new_credentials) = credentials::ensure(&config.data_dir, &ledger).await?;

    let broker_config = BrokerConfig {
        prefix: config.key_prefix.clone(),
        ..BrokerConfig::default()
    };
    let (broker, limiter): (Arc<dyn Broker>, Arc<dyn RateLimiter>) = match &config.redis_url {
        Some(url) => (
            Arc::new(RedisBroker::connect(url, broker_config).await?),
            Arc::new(
                RedisLimiter::connect(url, &config.key_prefix)
                    .await
                    .map_err(|e| UpError::Limiter(e.to_string()))?,
            ),
        ),
        None => (
            Arc::new(MemoryBroker::new(broker_config, Arc::new(SystemClock))),
            Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        ),
    };

    // Prices go to the ledger (billing) and the model record (gateway, /v1/models).
    let billing_prices = tidal_billing::Prices::from(&config.prices);
    let mut fleet_models = Vec::new();
    let mut launch = HashMap::new();
    for (name, path, context_length) in &resolved {
        ledger
            .ensure_price(name, billing_prices, Utc::now())
            .await
            .map_err(ledger_err)?;
        fleet_models.push(FleetModel {
            record: ModelRecord {
                id: name.clone(),
                state: ModelState::ScaledToZero,
                prices: config.prices.clone(),
                max_queue_wait_ms: config.max_queue_wait.as_millis() as u64,
                backlog_cap: config.backlog_cap,
                context_length: *context_length,
            },
            spec: config.scaling.clone(),
        });
        launch.insert(
            name.clone(),
            LaunchSpec {
                path: path.clone(),
                engine: config.engine.clone(),
                quantize: config.quantize,
            },
        );
    }
    let fleet_config = FleetConfig {
        shutdown_timeout: config.drain_timeout + Duration::from_secs(30),
        ..FleetConfig::default()
    };
    let fleet = match &config.pool {
        None => {
            let launcher = Arc::new(
                RuntimeLauncher::new(
                    broker.clone(),
                    launch,
                    config.drain_timeout,
                    Duration::from_secs(30),
                )
                .with_claim_budget(config.claim_budget),
            );
            Fleet::new(broker.clone(), launcher, fleet_models, fleet_config)
        }
        Some(pool) => {
            let spec = PoolSpec {
                worker_memory_bytes: pool.worker_memory_bytes,
                idle_unload_after: pool.idle_unload_after,
                workers: config.scaling.clone(),
            };
            spec.validate()
                .map_err(|e| UpError::Task(format!("pool settings: {e}")))?;
            let pinned = resolved
                .iter()
                .map(|(name, path, _)| PinnedModel {
                    model: name.clone(),
                    path: path.clone(),
                    sha256: None,
                })
                .collect();
            let launcher = Arc::new(PoolLauncher::new(
                broker.clone(),
                config.data_dir.clone(),
                pinned,
                config.engine.clone(),
                config.quantize,
                pool.worker_memory_bytes,
                config.drain_timeout,
                Duration::from_secs(30),
            ));
            // no model has a fleet of its own: the fleet's launcher is the pool's
            Fleet::new(broker.clone(), launcher.clone(), Vec::new(), fleet_config)
                .with_pool(PoolFleet::new(fleet_models, spec, launcher))
        }
    };
    let fleet_status = fleet.status();

    let gateway = Gateway::new(
        broker.clone(),
        ledger.clone(),
        limiter,
        GatewayConfig {
            admin_token: Some(creds.admin_token.clone()),
            prometheus: config.prometheus.clone(),
            ..GatewayConfig::default()
        },
    );
    let status_state = Arc::new(StatusState {
        fleet: fleet_status,
        ledger: ledger.clone(),
        gateway: gateway.clone(),
    });
    let app = gateway.router().merge(
        Router::new()
            .route("/local/status", get(status))
            .with_state(status_state),
    );
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| UpError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| UpError::Listen {
        addr: config.listen,
        source,
    })?;

    let (stop_http_tx, stop_http) = watch::channel(false);
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(wait_true(stop_http))
            .into_future(),
    );
    let (stop_fleet_tx, stop_fleet) = watch::channel(false);
    let fleet_task = tokio::spawn(fleet.run(stop_fleet));
    let (stop_meter_tx, stop_meter) = watch::channel(false);
    let source = QueueSource::new(
        broker.clone(),
        QueueSourceConfig {
            takeover_every: Duration::from_millis(200),
            ..QueueSourceConfig::new("local-billing")
        },
    );
    let progress = source.progress();
    let meter_ledger = ledger.clone();
    let metering = tokio::spawn(async move {
        let mut source = source;
        consumer::run(
            &meter_ledger,
            &mut source,
            &ConsumerConfig::default(),
            wait_true(stop_meter),
        )
        .await
    });

    on_started(&Started {
        addr,
        credentials: creds,
        new_credentials,
        models: resolved
            .iter()
            .map(|(n, p, _)| (n.clone(), p.clone()))
            .collect(),
        ledger_url: ledger_url.clone(),
    });

    shutdown.await;
    tracing::info!("shutting down: draining workers");
    let _ = stop_http_tx.send(true);
    let _ = stop_fleet_tx.send(true);
    if let Err(e) = fleet_task.await {
        tracing::error!(error = %e, "fleet task failed");
    }
    for (name, _, _) in &resolved {
        match fail_leftovers(broker.as_ref(), name).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(model = %name, jobs = n, "answered queued requests with an error")
            }
            Err(e) => tracing::error!(model = %name, error = %e, "cannot answer queued requests"),
        }
    }
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "HTTP server failed"),
        Ok(Err(e)) => tracing::error!(error = %e, "HTTP server task failed"),
        Err(_) => tracing::warn!("open connections did not finish in 10 s"),
    }
    // The usage of the last segments must reach the ledger before it closes.
    let seen = progress.idle_sweeps();
    let caught_up = tokio::time::timeout(Duration::from_secs(10), async {
        while progress.idle_sweeps() < seen + 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok();
    if !caught_up {
        tracing::warn!(
            "the metering consumer did not catch up in 10 s; unrecorded usage stays in the broker"
        );
    }
    let _ = stop_meter_tx.send(true);
    match metering.await {
        Ok(Ok(stats)) => tracing::info!(?stats, "metering stopped"),
        Ok(Err(e)) => tracing::error!(error = %e, "metering failed"),
        Err(e) => tracing::error!(error = %e, "metering task failed"),
    }
    ledger.close().await;
    Ok(())
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn read_context_length(name: &str, path: &std::path::Path) -> Result<u32, UpError> {
    let err = |message: String| UpError::Model {
        name: name.to_owned(),
        path: path.to_owned(),
        message,
    };
    let file = ModelFile::open(path).map_err(|e| err(e.to_string()))?;
    let config = ModelConfig::from_file(&file).map_err(|e| err(e.to_string()))?;
    Ok(u32::try_from(config.context_length).unwrap_or(u32::MAX))
}

/// Answers every job still queued for `model` with a 503 error event (the platform is
/// stopping and no worker is left to run it); returns how many.
async fn fail_leftovers(
    broker: &dyn Broker,
    model: &str,
) -> Result<usize, tidal_queue::QueueError> {
    let failure = JobFailure {
        status: 503,
        code: "shutting_down".into(),
        param: None,
        message: "The server is shutting down; retry the request.".into(),
    };
    let mut answered = 0;
    loop {
        let jobs = broker
            .claim(model, "local-shutdown", 64, Duration::ZERO)
            .await?;
        if jobs.is_empty() {
            return Ok(answered);
        }
        for job in &jobs {
            fail_job(broker, job, &failure).await?;
        }
        answered += jobs.len();
    }
}

async fn status(State(state): State<Arc<StatusState>>, headers: HeaderMap) -> Response {
    if let Err(reject) = state.gateway.authorize_admin(&headers) {
        return reject.into_response();
    }
    let period = Month::of_instant(Utc::now()).period();
    let usage = match state
        .ledger
        .usage_rows(&Principal::operator(), None, period)
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            let e = ApiError::unavailable(format!("reading the ledger: {e}"));
            return (StatusCode::SERVICE_UNAVAILABLE, Json(e.body())).into_response();
        }
    };
    Json(PlatformStatus {
        models: state.fleet.snapshot(),
        usage,
    })
    .into_response()
}
