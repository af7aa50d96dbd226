//! `/health`, `/metrics` and `/openapi.json` (no key needed).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;
use tidal_protocol::ApiError;

use crate::error::Reject;
use crate::gateway::Shared;

/// `GET /health`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    #[schemars(extend("const" = "ok"))]
    status: &'static str,
}

/// Liveness: the process serves HTTP.
pub(super) async fn health() -> Response {
    Json(Health { status: "ok" }).into_response()
}

/// Prometheus text format.
pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.config.prometheus {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => Reject::from(ApiError::not_found(
            "metrics_disabled",
            "metrics are not enabled in this process",
        ))
        .into_response(),
    }
}

/// The OpenAPI document of the public API (generated once, then cached).
pub(super) async fn openapi() -> Response {
    match crate::openapi::json() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot build the OpenAPI document");
            Reject::from(ApiError::internal(format!(
                "The OpenAPI document could not be built: {e}"
            )))
            .into_response()
        }
    }
}
