//! The HTTP side of worker mode (one model, or a pool worker's models): `/health` (200 while serving; 503 while the model loads
//! and once draining, so Kubernetes stops counting the pod as ready), `/metrics`, and
//! `/drain`, the pod's preStop hook: it starts the drain before Kubernetes sends SIGTERM and
//! answers once the worker holds no job (finished or re-enqueued), so the kubelet sends the
//! signal to a worker that has nothing left to lose.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tidal_protocol::ApiError;
use tokio::sync::watch;

use super::pool::PoolHandle;
use super::WorkerStatus;
use crate::server::HttpError;

/// What the probe endpoints read.
pub struct ProbeState {
    status: OnceLock<WorkerStatus>,
    /// Set instead of `status` by a pool worker.
    pool: OnceLock<PoolHandle>,
    prometheus: Option<PrometheusHandle>,
    drain: Arc<watch::Sender<bool>>,
}

impl ProbeState {
    /// State for a worker whose model is still loading; `/drain` sets `drain` to true (the
    /// same switch the shutdown signals set).
    pub fn new(prometheus: Option<PrometheusHandle>, drain: Arc<watch::Sender<bool>>) -> Arc<Self> {
        Arc::new(ProbeState {
            status: OnceLock::new(),
            pool: OnceLock::new(),
            prometheus,
            drain,
        })
    }

    /// The worker is running; later calls are ignored.
    pub fn set_worker(&self, status: WorkerStatus) {
        let _ = self.status.set(status);
    }

    /// A pool worker is running (ready with or without models); later calls are ignored.
    pub fn set_pool(&self, pool: PoolHandle) {
        let _ = self.pool.set(pool);
    }
}

/// `/health` and `/metrics`.
pub fn router(state: Arc<ProbeState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/drain", get(drain))
        .with_state(state)
}

/// How often `/drain` looks whether the worker still holds jobs.
const DRAIN_POLL: Duration = Duration::from_millis(100);

async fn drain(State(state): State<Arc<ProbeState>>) -> Response {
    tracing::info!("drain requested over HTTP (preStop)");
    let _ = state.drain.send(true);
    if let Some(pool) = state.pool.get() {
        let deadline = tokio::time::Instant::now()
            + pool.config().worker.drain_timeout
            + Duration::from_secs(10);
        while pool.snapshot().jobs > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        let jobs = pool.snapshot().jobs;
        return Json(serde_json::json!({"status": "drained", "jobs": jobs})).into_response();
    }
    let Some(status) = state.status.get() else {
        // Still loading: the loader sees the switch and stops; nothing is held.
        return Json(serde_json::json!({"status": "drained", "jobs": 0})).into_response();
    };
    // Bounded by the drain timeout (after it the worker re-enqueues what is left) plus the
    // time those re-enqueues take; the kubelet's grace period bounds it as well.
    let deadline =
        tokio::time::Instant::now() + status.config().drain_timeout + Duration::from_secs(10);
    while status.held() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    Json(serde_json::json!({"status": "drained", "jobs": status.held()})).into_response()
}

async fn health(State(state): State<Arc<ProbeState>>) -> Response {
    if let Some(pool) = state.pool.get() {
        let s = pool.snapshot();
        if s.draining {
            return HttpError(ApiError::unavailable("the worker is draining")).into_response();
        }
        return (
            StatusCode::OK,
            Json(serde_json::json!({
                "status": "ok",
                "pool": pool.config().pool,
                "worker": pool.config().worker.name,
                "models": s.loaded,
                "loading": s.loading,
                "unloading": s.unloading,
                "jobs": s.jobs,
            })),
        )
            .into_response();
    }
    match state.status.get() {
        None => HttpError(ApiError::unavailable("the model is still loading")).into_response(),
        Some(s) if s.draining() => {
            HttpError(ApiError::unavailable("the worker is draining")).into_response()
        }
        Some(s) => (
            StatusCode::OK,
            Json(serde_json::json!({
                "status": "ok",
                "model": s.config().model_id,
                "worker": s.config().name,
                "jobs": s.held(),
            })),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<ProbeState>>) -> Response {
    match &state.prometheus {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => HttpError(ApiError::not_found(
            "metrics_disabled",
            "metrics are not enabled in this process",
        ))
        .into_response(),
    }
}
