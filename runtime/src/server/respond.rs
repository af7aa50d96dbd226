//! Engine events → OpenAI responses: one JSON body, or an SSE stream ending with `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use tidal_protocol::render::{PieceLogprobs, ResponseMeta};
use tidal_protocol::usage::Usage;
use tidal_protocol::ApiError;
use tidal_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use super::prepare::ResponseShape;
use super::{HttpError, LoadedModel, ServerState};
use crate::engine::{FinishReason, GenerationEvent, TokenLogprob, Usage as EngineUsage};
use crate::logprobs;

pub use tidal_protocol::render::Endpoint;

fn usage(u: EngineUsage) -> Usage {
    Usage::new(u.prompt_tokens, u.cached_tokens, u.completion_tokens)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Builds the HTTP response for a submitted request.
pub async fn respond(
    state: &ServerState,
    model: &LoadedModel,
    endpoint: Endpoint,
    shape: ResponseShape,
    events: UnboundedReceiver<GenerationEvent>,
) -> Result<Response, HttpError> {
    let ctx = Ctx {
        meta: ResponseMeta::new(
            endpoint,
            &uuid::Uuid::now_v7().simple().to_string(),
            now_secs(),
            state.model_name.clone(),
        ),
        shape,
        tokenizer: model.engine.tokenizer().clone(),
    };
    if shape.stream {
        Ok(Sse::new(sse_stream(ctx, events))
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        collect(ctx, events).await.map(IntoResponse::into_response)
    }
}

/// What one response (or one streamed chunk) says.
struct Piece {
    text: String,
    logprobs: Option<PieceLogprobs>,
    finish: Option<FinishReason>,
    /// Set on the closing chunk of a stream: the role-less, choice-less usage chunk.
    usage_only: Option<Usage>,
}

struct Ctx {
    meta: ResponseMeta,
    shape: ResponseShape,
    tokenizer: Arc<Tokenizer>,
}

impl Ctx {
    /// Converts engine log-probabilities; `offset` is the text length before them.
    fn logprobs(&self, items: &[TokenLogprob], offset: usize) -> Option<PieceLogprobs> {
        if !self.shape.logprobs {
            return None;
        }
        Some(PieceLogprobs::new(
            self.meta.endpoint,
            logprobs::render(&self.tokenizer, items),
            offset,
        ))
    }

    /// A whole response (`usage` given) or a stream chunk (`usage` none) of this endpoint.
    fn body(&self, piece: Piece, whole: Option<Usage>) -> serde_json::Result<serde_json::Value> {
        let finish = piece.finish.map(|f| f.as_str());
        Ok(match (whole, piece.usage_only, finish) {
            (Some(u), _, f) => self
                .meta
                .whole(piece.text, piece.logprobs, f.unwrap_or("stop"), u),
            (None, Some(u), _) => self.meta.usage_chunk(u),
            (None, None, Some(f)) if piece.text.is_empty() => self.meta.finish_chunk(f),
            (None, None, _) => self.meta.delta_chunk(piece.text, piece.logprobs),
        })
    }

    fn event(&self, piece: Piece) -> Event {
        match self.body(piece, None) {
            Ok(v) => Event::default().data(v.to_string()),
            Err(e) => Event::default().data(ApiError::internal(e.to_string()).body().to_string()),
        }
    }
}

async fn collect(
    ctx: Ctx,
    mut events: UnboundedReceiver<GenerationEvent>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let mut text = String::new();
    let mut token_logprobs = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            GenerationEvent::Delta {
                text: t, logprobs, ..
            } => {
                text.push_str(&t);
                token_logprobs.extend(logprobs);
            }
            GenerationEvent::Done {
                finish_reason,
                usage: u,
            } => {
                let piece = Piece {
                    logprobs: ctx.logprobs(&token_logprobs, 0),
                    text,
                    finish: Some(finish_reason),
                    usage_only: None,
                };
                return ctx
                    .body(piece, Some(usage(u)))
                    .map(Json)
                    .map_err(|e| HttpError(ApiError::internal(e.to_string())));
            }
            GenerationEvent::Error { message } => {
                return Err(HttpError(ApiError::internal(message)))
            }
        }
    }
    Err(HttpError(ApiError::internal(
        "the engine ended the request without a result",
    )))
}

enum StreamState {
    Start(Ctx, UnboundedReceiver<GenerationEvent>),
    Running(Ctx, UnboundedReceiver<GenerationEvent>, usize),
    Done,
}

fn sse_stream(
    ctx: Ctx,
    events: UnboundedReceiver<GenerationEvent>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(StreamState::Start(ctx, events), |state| async move {
        match state {
            StreamState::Start(ctx, events) => {
                // OpenAI opens a chat stream with the assistant role and empty content.
                let first = ctx
                    .meta
                    .role_chunk()
                    .map(|chunk| Event::default().data(chunk.to_string()));
                Some((
                    first.into_iter().collect::<Vec<_>>(),
                    StreamState::Running(ctx, events, 0),
                ))
            }
            StreamState::Running(ctx, mut events, offset) => match events.recv().await {
                Some(GenerationEvent::Delta {
                    text,
                    logprobs: lps,
                    ..
                }) => {
                    if text.is_empty() && lps.is_empty() {
                        return Some((vec![], StreamState::Running(ctx, events, offset)));
                    }
                    let next = offset + text.len();
                    let event = ctx.event(Piece {
                        logprobs: ctx.logprobs(&lps, offset),
                        text,
                        finish: None,
                        usage_only: None,
                    });
                    Some((vec![event], StreamState::Running(ctx, events, next)))
                }
                Some(GenerationEvent::Done {
                    finish_reason,
                    usage: u,
                }) => {
                    let mut out = vec![ctx.event(Piece {
                        text: String::new(),
                        logprobs: None,
                        finish: Some(finish_reason),
                        usage_only: None,
                    })];
                    if ctx.shape.include_usage {
                        out.push(ctx.event(Piece {
                            text: String::new(),
                            logprobs: None,
                            finish: None,
                            usage_only: Some(usage(u)),
                        }));
                    }
                    out.push(Event::default().data("[DONE]"));
                    Some((out, StreamState::Done))
                }
                Some(GenerationEvent::Error { message }) => {
                    let body = ApiError::internal(message).body().to_string();
                    Some((
                        vec![Event::default().data(body), Event::default().data("[DONE]")],
                        StreamState::Done,
                    ))
                }
                None => {
                    let body = ApiError::internal("the engine ended the request without a result")
                        .body()
                        .to_string();
                    Some((vec![Event::default().data(body)], StreamState::Done))
                }
            },
            StreamState::Done => None,
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}
