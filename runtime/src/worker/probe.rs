//! The HTTP side of worker mode: `/health` (200 while serving; 503 while the model loads
//! and once draining, so Kubernetes stops counting the pod as ready) and `/metrics`.

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tidal_protocol::ApiError;

use super::WorkerStatus;
use crate::server::HttpError;

/// What the probe endpoints read.
pub struct ProbeState {
    status: OnceLock<WorkerStatus>,
    prometheus: Option<PrometheusHandle>,
}

impl ProbeState {
    /// State for a worker whose model is still loading.
    pub fn new(prometheus: Option<PrometheusHandle>) -> Arc<Self> {
        Arc::new(ProbeState {
            status: OnceLock::new(),
            prometheus,
        })
    }

    /// The worker is running; later calls are ignored.
    pub fn set_worker(&self, status: WorkerStatus) {
        let _ = self.status.set(status);
    }
}

/// `/health` and `/metrics`.
pub fn router(state: Arc<ProbeState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn health(State(state): State<Arc<ProbeState>>) -> Response {
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
