//! The direct OpenAI-compatible HTTP server of `tidal runtime --listen` (axum).
//!
//! Handlers validate and tokenise (`prepare`), submit to the engine, and turn engine events
//! into OpenAI JSON or SSE (`respond`). Dropping the response (client gone) drops the
//! engine receiver, which frees the sequence at the next step.

mod error;
mod handlers;
pub(crate) mod prepare;
mod respond;

use std::sync::{Arc, OnceLock};

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tidal_tokenizer::ChatTemplate;

use crate::engine::Engine;

pub use error::HttpError;

/// What exists once the model is loaded.
pub struct LoadedModel {
    pub engine: Engine,
    /// `None` when the GGUF has no `tokenizer.chat_template` (chat requests get a 400).
    pub chat_template: Option<ChatTemplate>,
}

/// Shared state of the server.
pub struct ServerState {
    /// The name clients use in `model`.
    pub model_name: String,
    loaded: OnceLock<LoadedModel>,
    prometheus: Option<PrometheusHandle>,
    created: u64,
}

impl ServerState {
    /// State for a server whose model is still loading (`/health` answers 503 until `set_loaded`).
    pub fn new(model_name: impl Into<String>, prometheus: Option<PrometheusHandle>) -> Arc<Self> {
        Arc::new(Self {
            model_name: model_name.into(),
            loaded: OnceLock::new(),
            prometheus,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        })
    }

    /// Marks the model as loaded; later calls are ignored.
    pub fn set_loaded(&self, model: LoadedModel) {
        let _ = self.loaded.set(model);
    }

    fn loaded(&self) -> Result<&LoadedModel, HttpError> {
        self.loaded.get().ok_or_else(|| {
            HttpError(tidal_protocol::ApiError::unavailable(
                "the model is still loading",
            ))
        })
    }
}

/// The router with every route of the direct server.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .with_state(state)
}
