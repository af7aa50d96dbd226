//! Response events → OpenAI bodies: one JSON body, or an SSE stream whose chunks carry
//! `id: <seq>` (so a client can reattach from the last one it saw) and end with
//! `data: [DONE]`.
//!
//! Nothing is sent before the first response event arrives, so a request refused by its
//! worker (an `error` event first) or withdrawn after its max queue wait still gets a proper
//! HTTP status. After that, an `error` event becomes an error chunk (OpenAI's
//! `{"error": {...}}`) followed by `[DONE]`.
//!
//! One exception: when the gateway starts stopping while a request still waits for its first
//! event (queued, perhaps for a cold start), its client has received nothing, not even its
//! request id, and would lose a job that goes on running. Such a request is answered at once
//! ([`detached_answer`]) with its `x-request-id` and code `gateway_restarting`: a stream gets
//! that error as its only chunk (no `id:`, no `[DONE]`), a plain request a 503 with
//! `Retry-After`; either client reattaches with `GET /v1/requests/{id}/events` from the start.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use tidal_protocol::render::{Endpoint, PieceLogprobs, ResponseMeta};
use tidal_protocol::usage::Usage;
use tidal_protocol::ApiError;
use tidal_queue::{FinishReason, RequestRecord, ResponseEvent};
use tracing::Instrument;

use crate::error::Reject;
use crate::relay::Tracked;

/// What every body of a response to the request of `record` shares.
pub(crate) fn response_meta(endpoint: Endpoint, record: &RequestRecord) -> ResponseMeta {
    ResponseMeta::new(
        endpoint,
        &record.id.simple().to_string(),
        record.created_at_ms / 1000,
        record.model.clone(),
    )
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(u: tidal_queue::Usage) -> Usage {
    Usage::new(
        u.prompt_tokens as usize,
        u.cached_prompt_tokens as usize,
        u.completion_tokens as usize,
    )
}

/// The client-facing error of an `error` event.
pub(crate) fn event_error(
    status: u16,
    code: String,
    param: Option<String>,
    message: String,
) -> ApiError {
    // A status outside 4xx/5xx cannot be sent as an error; treat it as ours.
    let status = if (400..600).contains(&status) {
        status
    } else {
        500
    };
    ApiError::new(status, Some(code), param, message)
}

/// Counts a finished request's tokens against its tenant's tokens/min limit.
async fn count_tokens(tracked: &Tracked, u: &tidal_queue::Usage) {
    let tokens = u.prompt_tokens + u.completion_tokens;
    if let Err(e) = tracked
        .shared()
        .limiter
        .record_tokens(&tracked.tenant, tokens)
        .await
    {
        crate::metrics::limiter_failed();
        tracing::warn!(error = %e, "counting tokens failed");
    }
}

/// The answer to a request that still waits for its first event when the gateway starts
/// stopping (see the module docs); the request keeps running.
fn detached_answer(tracked: &Tracked, stream: bool) -> Result<Response, Reject> {
    let error = ApiError::new(
        503,
        Some("gateway_restarting".into()),
        None,
        format!(
            "This gateway is restarting before your request started; it was not cancelled. Read its result from any gateway with GET /v1/requests/{}/events.",
            tracked.id
        ),
    );
    tracing::info!("gateway stopping; queued request answered with its id for reattachment");
    if !stream {
        return Err(Reject::retry(error, 1));
    }
    let only = stream::iter([Ok::<_, Infallible>(data(&error.body()))]);
    Ok(Sse::new(only).into_response())
}

/// Reads the whole response and answers with one JSON body; `logprobs`: the client asked
/// for log-probabilities (the events carry them).
pub(crate) async fn collect(
    mut tracked: Tracked,
    meta: ResponseMeta,
    logprobs: bool,
) -> Result<Response, Reject> {
    tracked.answer_whole();
    let mut text = String::new();
    let mut tokens = Vec::new();
    let Some(mut ev) = tracked.next_unless_detached().await? else {
        return detached_answer(&tracked, false);
    };
    loop {
        match ev {
            ResponseEvent::Delta {
                text: t,
                logprobs: lps,
                ..
            } => {
                text.push_str(&t);
                tokens.extend(lps);
            }
            ResponseEvent::Done {
                finish_reason,
                usage: u,
                ..
            } => {
                count_tokens(&tracked, &u).await;
                let lps = logprobs.then(|| PieceLogprobs::new(meta.endpoint, tokens, 0));
                let body = meta.whole(text, lps, finish_str(finish_reason), usage(u));
                return Ok(Json(body).into_response());
            }
            ResponseEvent::Error {
                status,
                code,
                param,
                message,
                ..
            } => return Err(event_error(status, code, param, message).into()),
        }
        ev = tracked.next().await?;
    }
}

/// How a response stream is shaped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamShape {
    /// End with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Chunks carry log-probabilities.
    pub logprobs: bool,
    /// Open with the assistant-role chunk (a chat stream from its start, not a reattach
    /// mid-stream).
    pub role_chunk: bool,
    /// Text bytes delivered before the first event read (a reattach mid-stream): where the
    /// legacy completions' `text_offset` goes on from.
    pub text_before: usize,
}

struct StreamState {
    tracked: Tracked,
    meta: ResponseMeta,
    shape: StreamShape,
    /// Text bytes sent (or skipped by a reattach) so far.
    text_len: usize,
    pending: VecDeque<Event>,
    ended: bool,
}

fn data(v: &serde_json::Value) -> Event {
    Event::default().data(v.to_string())
}

impl StreamState {
    /// Queues the SSE events of one response event.
    async fn push(&mut self, ev: ResponseEvent) {
        let id = ev.seq().to_string();
        match ev {
            ResponseEvent::Delta { text, logprobs, .. } => {
                // A token that decodes to nothing yet (part of a UTF-8 sequence) sends
                // nothing, unless its log-probability was asked for.
                if text.is_empty() && logprobs.is_empty() {
                    return;
                }
                let lps = self
                    .shape
                    .logprobs
                    .then(|| PieceLogprobs::new(self.meta.endpoint, logprobs, self.text_len));
                self.text_len += text.len();
                self.pending
                    .push_back(data(&self.meta.delta_chunk(text, lps)).id(id));
            }
            ResponseEvent::Done {
                finish_reason,
                usage: u,
                ..
            } => {
                count_tokens(&self.tracked, &u).await;
                self.pending
                    .push_back(data(&self.meta.finish_chunk(finish_str(finish_reason))).id(id));
                if self.shape.include_usage {
                    self.pending
                        .push_back(data(&self.meta.usage_chunk(usage(u))));
                }
                self.pending.push_back(Event::default().data("[DONE]"));
                self.ended = true;
            }
            ResponseEvent::Error {
                status,
                code,
                param,
                message,
                ..
            } => {
                let e = event_error(status, code, param, message);
                self.pending.push_back(data(&e.body()).id(id));
                self.pending.push_back(Event::default().data("[DONE]"));
                self.ended = true;
            }
        }
    }
}

/// Waits for the first event, then answers with an SSE stream.
pub(crate) async fn stream(
    mut tracked: Tracked,
    meta: ResponseMeta,
    shape: StreamShape,
) -> Result<Response, Reject> {
    let Some(first) = tracked.next_unless_detached().await? else {
        return detached_answer(&tracked, true);
    };
    if let ResponseEvent::Error {
        status,
        code,
        param,
        message,
        ..
    } = first
    {
        return Err(event_error(status, code, param, message).into());
    }
    let mut pending = VecDeque::new();
    if shape.role_chunk {
        if let Some(chunk) = meta.role_chunk() {
            pending.push_back(data(&chunk));
        }
    }
    let mut state = StreamState {
        tracked,
        meta,
        shape,
        text_len: shape.text_before,
        pending,
        ended: false,
    };
    state.push(first).await;
    let span = tracing::Span::current();
    Ok(Sse::new(sse_events(state, span))
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn sse_events(
    state: StreamState,
    span: tracing::Span,
) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(Some(state), move |state| {
        let span = span.clone();
        async move {
            let mut st = state?;
            loop {
                if let Some(ev) = st.pending.pop_front() {
                    return Some((ev, Some(st)));
                }
                if st.ended {
                    return None;
                }
                match st.tracked.next().await {
                    Ok(ev) => st.push(ev).await,
                    Err(reject) => {
                        // Headers are gone: report in-band, then end the stream.
                        st.pending.push_back(data(&reject.error.body()));
                        st.pending.push_back(Event::default().data("[DONE]"));
                        st.ended = true;
                    }
                }
            }
        }
        .instrument(span)
    })
    .map(Ok)
}
