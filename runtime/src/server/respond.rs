//! Engine events → OpenAI responses: one JSON body, or an SSE stream ending with `[DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use tidal_protocol::chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChoiceLogprobs,
};
use tidal_protocol::completion::{Completion, CompletionChoice, CompletionLogprobs};
use tidal_protocol::usage::Usage;
use tidal_protocol::ApiError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::prepare::Prepared;
use super::{logprobs, HttpError, LoadedModel, ServerState};
use crate::engine::{GenerationEvent, Usage as EngineUsage};

/// Which OpenAI endpoint the response is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

fn usage(u: EngineUsage) -> Usage {
    Usage::new(u.prompt_tokens, u.cached_tokens, u.completion_tokens)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn response_id(endpoint: Endpoint) -> String {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// Builds the HTTP response for a submitted request.
pub async fn respond(
    state: &ServerState,
    model: &LoadedModel,
    endpoint: Endpoint,
    prepared: Prepared,
    _prompt_tokens: usize,
    events: UnboundedReceiver<GenerationEvent>,
) -> Result<Response, HttpError> {
    let ctx = Ctx {
        id: response_id(endpoint),
        created: now_secs(),
        model_name: state.model_name.clone(),
        endpoint,
        logprobs: prepared.logprobs,
        include_usage: prepared.include_usage,
        tokenizer: model.engine.tokenizer().clone(),
    };
    if prepared.stream {
        Ok(Sse::new(sse_stream(ctx, events))
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        collect(ctx, events).await.map(IntoResponse::into_response)
    }
}

struct Ctx {
    id: String,
    created: u64,
    model_name: String,
    endpoint: Endpoint,
    logprobs: bool,
    include_usage: bool,
    tokenizer: std::sync::Arc<tidal_tokenizer::Tokenizer>,
}

async fn collect(
    ctx: Ctx,
    mut events: UnboundedReceiver<GenerationEvent>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let mut text = String::new();
    let mut chat_lp = Vec::new();
    let mut completion_lp = CompletionLogprobs::default();
    while let Some(event) = events.recv().await {
        match event {
            GenerationEvent::Delta {
                text: t,
                logprobs: lps,
                ..
            } => {
                if ctx.logprobs {
                    match ctx.endpoint {
                        Endpoint::Chat => chat_lp.extend(logprobs::chat(&ctx.tokenizer, &lps)),
                        Endpoint::Completion => logprobs::completion(
                            &ctx.tokenizer,
                            &lps,
                            text.len(),
                            &mut completion_lp,
                        ),
                    }
                }
                text.push_str(&t);
            }
            GenerationEvent::Done {
                finish_reason,
                usage: u,
            } => {
                let finish = Some(finish_reason.as_str().to_string());
                let body = match ctx.endpoint {
                    Endpoint::Chat => serde_json::to_value(ChatCompletion {
                        id: ctx.id,
                        object: "chat.completion".into(),
                        created: ctx.created,
                        model: ctx.model_name,
                        choices: vec![ChatChoice {
                            index: 0,
                            message: AssistantMessage {
                                role: "assistant".into(),
                                content: text,
                            },
                            logprobs: ctx.logprobs.then_some(ChoiceLogprobs { content: chat_lp }),
                            finish_reason: finish,
                        }],
                        usage: usage(u),
                    }),
                    Endpoint::Completion => serde_json::to_value(Completion {
                        id: ctx.id,
                        object: "text_completion".into(),
                        created: ctx.created,
                        model: ctx.model_name,
                        choices: vec![CompletionChoice {
                            index: 0,
                            text,
                            logprobs: ctx.logprobs.then_some(completion_lp),
                            finish_reason: finish,
                        }],
                        usage: Some(usage(u)),
                    }),
                };
                return body
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

impl Ctx {
    fn chunk(
        &self,
        delta: ChatDelta,
        logprobs: Option<ChoiceLogprobs>,
        finish: Option<String>,
        text: String,
    ) -> Event {
        let value = match self.endpoint {
            Endpoint::Chat => serde_json::to_value(ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk".into(),
                created: self.created,
                model: self.model_name.clone(),
                choices: vec![ChatChunkChoice {
                    index: 0,
                    delta,
                    logprobs,
                    finish_reason: finish,
                }],
                usage: None,
            }),
            Endpoint::Completion => serde_json::to_value(Completion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model_name.clone(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: finish,
                }],
                usage: None,
            }),
        };
        json_event(value)
    }

    fn usage_chunk(&self, u: Usage) -> Event {
        let value = match self.endpoint {
            Endpoint::Chat => serde_json::to_value(ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk".into(),
                created: self.created,
                model: self.model_name.clone(),
                choices: vec![],
                usage: Some(u),
            }),
            Endpoint::Completion => serde_json::to_value(Completion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model_name.clone(),
                choices: vec![],
                usage: Some(u),
            }),
        };
        json_event(value)
    }
}

fn json_event(value: Result<serde_json::Value, serde_json::Error>) -> Event {
    match value {
        Ok(v) => Event::default().data(v.to_string()),
        Err(e) => Event::default().data(ApiError::internal(e.to_string()).body().to_string()),
    }
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
                let first = (ctx.endpoint == Endpoint::Chat).then(|| {
                    ctx.chunk(
                        ChatDelta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                        },
                        None,
                        None,
                        String::new(),
                    )
                });
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
                    let event = match ctx.endpoint {
                        Endpoint::Chat => {
                            let lp = ctx.logprobs.then(|| ChoiceLogprobs {
                                content: logprobs::chat(&ctx.tokenizer, &lps),
                            });
                            ctx.chunk(
                                ChatDelta {
                                    role: None,
                                    content: Some(text.clone()),
                                },
                                lp,
                                None,
                                String::new(),
                            )
                        }
                        Endpoint::Completion => {
                            let mut lp = CompletionLogprobs::default();
                            logprobs::completion(&ctx.tokenizer, &lps, offset, &mut lp);
                            let value = serde_json::to_value(Completion {
                                id: ctx.id.clone(),
                                object: "text_completion".into(),
                                created: ctx.created,
                                model: ctx.model_name.clone(),
                                choices: vec![CompletionChoice {
                                    index: 0,
                                    text: text.clone(),
                                    logprobs: ctx.logprobs.then_some(lp),
                                    finish_reason: None,
                                }],
                                usage: None,
                            });
                            json_event(value)
                        }
                    };
                    let offset = offset + text.len();
                    Some((vec![event], StreamState::Running(ctx, events, offset)))
                }
                Some(GenerationEvent::Done {
                    finish_reason,
                    usage: u,
                }) => {
                    let mut out = vec![ctx.chunk(
                        ChatDelta::default(),
                        None,
                        Some(finish_reason.as_str().into()),
                        String::new(),
                    )];
                    if ctx.include_usage {
                        out.push(ctx.usage_chunk(usage(u)));
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
