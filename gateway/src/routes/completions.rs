//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`.

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;
use tidal_protocol::render::Endpoint;
use tidal_queue::{ModelState, Prices};

use super::{answered_as, read_body, RequestId, COMPLETION_BODY_BYTES};
use crate::admission::{submit, Accepted};
use crate::breaker::LedgerFault;
use crate::error::{ledger_unavailable, Reject};
use crate::gateway::Shared;
use crate::respond::StreamShape;
use crate::{auth, respond};

/// Authenticates, then reads the body (so an unauthenticated body is never read), then
/// admits the request and answers it.
async fn complete(
    shared: Arc<Shared>,
    id: RequestId,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, Reject> {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let principal = auth::principal(&shared, &headers).await?;
    let body = read_body(&shared, &headers, body, COMPLETION_BODY_BYTES).await?;
    let Accepted {
        id: request_id,
        tracked,
        meta,
        stream,
        include_usage,
        logprobs,
    } = submit(&shared, id.0, principal, endpoint, &headers, &body).await?;
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
    req: Request,
) -> Response {
    complete(shared, id, Endpoint::Chat, req)
        .await
        .into_response()
}

/// `POST /v1/completions`.
pub(super) async fn completion(
    State(shared): State<Arc<Shared>>,
    Extension(id): Extension<RequestId>,
    req: Request,
) -> Response {
    complete(shared, id, Endpoint::Completion, req)
        .await
        .into_response()
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ModelList {
    /// Always `list`.
    #[schemars(extend("const" = "list"))]
    object: &'static str,
    data: Vec<ModelEntry>,
}

/// One model of `/v1/models`: OpenAI's fields and Tidal's.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ModelEntry {
    id: String,
    /// Always `model`.
    #[schemars(extend("const" = "model"))]
    object: &'static str,
    /// When the model's first price took effect (0: no price recorded yet).
    created: i64,
    /// Always `tidal`.
    #[schemars(extend("const" = "tidal"))]
    owned_by: &'static str,
    /// Context window in tokens.
    context_length: u32,
    state: ModelState,
    /// Longest a request waits for a worker (cold start included) before a 503.
    max_queue_wait_ms: u64,
    /// Per million tokens, in micro-units of the currency.
    pricing: Prices,
}

/// `GET /v1/models`: every model record, with its state and per-million-token prices.
pub(super) async fn models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let r = async {
        auth::principal(&shared, &headers).await?;
        let records = shared.broker.models().await?;
        // `created`: when the model's first price took effect in the ledger (0 if it has
        // none yet; records carry no creation time of their own).
        let versions = match shared.ask_ledger(shared.ledger.price_versions(None)).await {
            Ok(v) => v,
            Err(LedgerFault::Unavailable) => return Err(ledger_unavailable()),
            Err(LedgerFault::Failed(e)) => return Err(e.into()),
        };
        let data: Vec<_> = records
            .into_iter()
            .map(|m| {
                let created = versions
                    .iter()
                    .filter(|v| v.model == m.id)
                    .map(|v| v.effective_from.timestamp().max(0))
                    .min()
                    .unwrap_or(0);
                ModelEntry {
                    id: m.id,
                    object: "model",
                    created,
                    owned_by: "tidal",
                    context_length: m.context_length,
                    state: m.state,
                    max_queue_wait_ms: m.max_queue_wait_ms,
                    pricing: m.prices,
                }
            })
            .collect();
        Ok::<_, Reject>(
            Json(ModelList {
                object: "list",
                data,
            })
            .into_response(),
        )
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}
