//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tidal_protocol::render::Endpoint;

use super::{answered_as, body_error, RequestId};
use crate::admission::{submit, Accepted};
use crate::error::Reject;
use crate::gateway::Shared;
use crate::respond::StreamShape;
use crate::{auth, respond};

async fn complete(
    shared: Arc<Shared>,
    id: RequestId,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Reject> {
    let body = body.map_err(body_error)?;
    let Accepted {
        id: request_id,
        tracked,
        meta,
        stream,
        include_usage,
        logprobs,
    } = submit(&shared, id.0, endpoint, &headers, &body).await?;
    let answer = if stream {
        let shape = StreamShape {
            include_usage,
            logprobs,
            role_chunk: true,
            text_before: 0,
        };
        respond::stream(tracked, meta, shape).await
    } else {
        respond::collect(tracked, meta, logprobs).await
    };
    // A retry under a used idempotency key answers as the first request.
    Ok(answered_as(
        answer.unwrap_or_else(IntoResponse::into_response),
        request_id,
    ))
}

/// `POST /v1/chat/completions`.
pub(super) async fn chat(
    State(shared): State<Arc<Shared>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(shared, id, Endpoint::Chat, headers, body)
        .await
        .into_response()
}

/// `POST /v1/completions`.
pub(super) async fn completion(
    State(shared): State<Arc<Shared>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(shared, id, Endpoint::Completion, headers, body)
        .await
        .into_response()
}

/// `GET /v1/models`: every model record, with its state and per-million-token prices.
pub(super) async fn models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let r = async {
        auth::principal(&shared, &headers).await?;
        let records = shared.broker.models().await?;
        // `created`: when the model's first price took effect in the ledger (0 if it has
        // none yet; records carry no creation time of their own).
        let versions = shared.ledger.price_versions(None).await?;
        let data: Vec<_> = records
            .into_iter()
            .map(|m| {
                let created = versions
                    .iter()
                    .filter(|v| v.model == m.id)
                    .map(|v| v.effective_from.timestamp().max(0))
                    .min()
                    .unwrap_or(0);
                json!({
                    "id": m.id,
                    "object": "model",
                    "created": created,
                    "owned_by": "tidal",
                    "context_length": m.context_length,
                    "state": m.state,
                    "max_queue_wait_ms": m.max_queue_wait_ms,
                    "pricing": {
                        "currency": m.prices.currency,
                        "input_per_mtok_micros": m.prices.input_per_mtok_micros,
                        "cached_input_per_mtok_micros": m.prices.cached_input_per_mtok_micros,
                        "output_per_mtok_micros": m.prices.output_per_mtok_micros,
                    },
                })
            })
            .collect();
        Ok::<_, Reject>(Json(json!({"object": "list", "data": data})).into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}
