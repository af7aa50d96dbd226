use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidal_protocol::chat::ChatCompletionRequest;
use tidal_protocol::completion::CompletionRequest;
use tidal_protocol::error::parse_json;
use tidal_protocol::models::{ModelCard, ModelList};
use tidal_protocol::ApiError;

use super::respond::{respond, Endpoint};
use super::{prepare, HttpError, LoadedModel, ServerState};
use crate::engine::EngineError;

pub async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let req: ChatCompletionRequest = parse_json(&body)?;
    check_model(&state, &req.model)?;
    let model = state.loaded()?;
    let prepared = prepare::chat(model, &req)?;
    run(&state, model, prepared, Endpoint::Chat).await
}

pub async fn completions(
    State(state): State<Arc<ServerState>>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let req: CompletionRequest = parse_json(&body)?;
    check_model(&state, &req.model)?;
    let model = state.loaded()?;
    let prepared = prepare::completion(model, &req)?;
    run(&state, model, prepared, Endpoint::Completion).await
}

async fn run(
    state: &ServerState,
    model: &LoadedModel,
    prepared: prepare::Prepared,
    endpoint: Endpoint,
) -> Result<Response, HttpError> {
    let events = model.engine.submit(prepared.request).map_err(|e| match e {
        EngineError::TooLong { .. } => ApiError::invalid("max_tokens", e.to_string()),
        EngineError::Invalid(m) => ApiError::bad_request(m),
        EngineError::Stopped => ApiError::unavailable("the engine has stopped"),
        // Only a starting engine refuses its draft model.
        EngineError::Draft(_) => ApiError::unavailable(e.to_string()),
    })?;
    respond(state, model, endpoint, prepared.shape, events).await
}

fn check_model(state: &ServerState, model: &str) -> Result<(), HttpError> {
    if model != state.model_name {
        return Err(ApiError::model_not_found(model).into());
    }
    Ok(())
}

pub async fn models(State(state): State<Arc<ServerState>>) -> Json<ModelList> {
    let context_length = state
        .loaded
        .get()
        .map(|m| m.engine.model_config().context_length);
    Json(ModelList::new(vec![ModelCard {
        id: state.model_name.clone(),
        object: "model".into(),
        created: state.created,
        owned_by: "tidal".into(),
        context_length,
    }]))
}

pub async fn health(State(state): State<Arc<ServerState>>) -> Response {
    match state.loaded.get() {
        Some(_) => (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))).into_response(),
        None => HttpError(ApiError::unavailable("the model is still loading")).into_response(),
    }
}

pub async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
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

pub async fn not_found(uri: axum::http::Uri) -> HttpError {
    HttpError(ApiError::not_found(
        "unknown_url",
        format!("Unknown path {}", uri.path()),
    ))
}
