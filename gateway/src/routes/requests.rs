//! `GET /v1/requests/{id}/events`: reattach to a request's response stream (after a dropped
//! connection or a gateway restart), from the event after `Last-Event-ID` or `?after=`.
//!
//! Only the tenant that sent the request can: another tenant's id, an unknown id and a
//! request already delivered in full all answer 404. The answer is an SSE stream in the
//! shape of the original endpoint's chunks, whether or not the original asked for one.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tidal_protocol::render::Endpoint;
use tidal_protocol::ApiError;
use tidal_queue::Resume;
use uuid::Uuid;

use super::answered_as;
use crate::error::Reject;
use crate::gateway::Shared;
use crate::relay::Tracked;
use crate::respond::StreamShape;
use crate::{auth, respond};

#[derive(Debug, Default, Deserialize)]
pub(super) struct EventsQuery {
    after: Option<String>,
}

fn seq(param: &str, v: &str) -> Result<u64, Reject> {
    v.trim().parse().map_err(|_| {
        ApiError::invalid(
            param,
            format!("`{param}` must be a non-negative integer (an event id), got {v:?}"),
        )
        .into()
    })
}

/// Where to resume: `?after=` wins over `Last-Event-ID`; neither means from the start.
fn after_seq(q: &EventsQuery, headers: &HeaderMap) -> Result<u64, Reject> {
    if let Some(a) = &q.after {
        return seq("after", a);
    }
    match headers.get("last-event-id") {
        None => Ok(0),
        Some(v) => seq(
            "Last-Event-ID",
            v.to_str()
                .map_err(|_| ApiError::invalid("Last-Event-ID", "not visible ASCII"))?,
        ),
    }
}

/// Text bytes of request `id`'s deltas up to and including event `last` (seqs run 1, 2, ...,
/// so they are its first `last` events).
async fn text_through(shared: &Shared, id: Uuid, last: u64) -> Result<usize, Reject> {
    let count = usize::try_from(last).unwrap_or(usize::MAX);
    let events = shared
        .broker
        .read_responses(id, 0, count, Duration::ZERO)
        .await?;
    Ok(usize::try_from(Resume::from_events(&events).text_len).unwrap_or(usize::MAX))
}

pub(super) async fn events(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    q: Result<Query<EventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let principal = auth::principal(&shared, &headers).await?;
        let Query(q) = q.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
        let after = after_seq(&q, &headers)?;
        let not_found = || {
            Reject::from(ApiError::not_found(
                "request_not_found",
                format!("No request {id} of yours is waiting to be delivered."),
            ))
        };
        let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
        // Another tenant's request is indistinguishable from an unknown one.
        let rec = shared
            .broker
            .request(id)
            .await?
            .filter(|r| r.tenant == principal.tenant)
            .ok_or_else(not_found)?;
        let endpoint = Endpoint::parse(&rec.endpoint).ok_or_else(|| {
            ApiError::internal(format!(
                "request {id} has an unknown endpoint {:?}",
                rec.endpoint
            ))
        })?;
        tracing::Span::current().record("tenant", principal.tenant.as_str());
        tracing::Span::current().record("model", rec.model.as_str());
        tracing::info!(request = %id, after, "client reattached");
        let tracked = Tracked::new(shared.clone(), &rec, after);
        let meta = respond::response_meta(endpoint, &rec);
        // Only legacy completions' log-probabilities need the text before `after`.
        let text_before = if rec.logprobs && endpoint == Endpoint::Completion && after > 0 {
            text_through(&shared, id, after).await?
        } else {
            0
        };
        let shape = StreamShape {
            include_usage: rec.include_usage,
            logprobs: rec.logprobs,
            role_chunk: after == 0,
            text_before,
        };
        let resp = respond::stream(tracked, meta, shape).await?;
        Ok::<_, Reject>(answered_as(resp, id))
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn q(after: Option<&str>) -> EventsQuery {
        EventsQuery {
            after: after.map(str::to_owned),
        }
    }

    #[test]
    fn resume_point() {
        let mut h = HeaderMap::new();
        assert_eq!(after_seq(&q(None), &h).unwrap(), 0);
        h.insert("last-event-id", HeaderValue::from_static("7"));
        assert_eq!(after_seq(&q(None), &h).unwrap(), 7);
        assert_eq!(after_seq(&q(Some("3")), &h).unwrap(), 3, "query wins");
        let e = after_seq(&q(Some("x")), &h).unwrap_err();
        assert_eq!((e.status(), e.error.param.as_deref()), (400, Some("after")));
        h.insert("last-event-id", HeaderValue::from_static("-1"));
        let e = after_seq(&q(None), &h).unwrap_err();
        assert_eq!(e.error.param.as_deref(), Some("Last-Event-ID"));
    }
}
