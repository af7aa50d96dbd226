//! `/health` and `/metrics` of the controller process.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::watch;

/// Renders the Prometheus exposition text (the installed recorder's handle).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct HttpState {
    leading: watch::Receiver<bool>,
    render: Render,
}

/// The router: `/health` (200 with whether this replica leads) and `/metrics`.
pub fn router(leading: watch::Receiver<bool>, render: Render) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState { leading, render })
}

async fn health(State(s): State<HttpState>) -> impl IntoResponse {
    let leader = *s.leading.borrow();
    (
        StatusCode::OK,
        Json(json!({"status": "ok", "leader": leader})),
    )
}

async fn metrics_text(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        (s.render)(),
    )
}
