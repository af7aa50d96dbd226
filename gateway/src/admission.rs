//! From an HTTP request to an enqueued job: auth → body checks → budget and rate limits →
//! model lookup → backlog cap → enqueue and record the owner. Every refusal is an OpenAI
//! error ([`Reject`]): 401, 400, 402, 429 (+ Retry-After), 404 `model_not_found`,
//! 503 (+ Retry-After) for a full backlog or an unreachable queue.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use tidal_protocol::error::parse_json;
use tidal_protocol::job::JobRequest;
use tidal_protocol::render::{Endpoint, ResponseMeta};
use tidal_protocol::ApiError;
use tidal_queue::{Job, RequestRecord};
use uuid::Uuid;

use crate::auth;
use crate::error::Reject;
use crate::gateway::Shared;
use crate::limits::{window::retry_after_secs, Admission};
use crate::metrics;
use crate::relay::Tracked;

/// An accepted request: its job is in the queue.
pub(crate) struct Accepted {
    /// Follows the job's response stream.
    pub tracked: Tracked,
    /// Shape of its response bodies.
    pub meta: ResponseMeta,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
}

/// Parses the body of `endpoint` and runs the checks that need no model.
pub(crate) fn parse(endpoint: Endpoint, body: &[u8]) -> Result<JobRequest, Reject> {
    let req = match endpoint {
        Endpoint::Chat => JobRequest::Chat(parse_json(body)?),
        Endpoint::Completion => JobRequest::Completion(parse_json(body)?),
    };
    req.validate()?;
    // Response events carry no log-probabilities: refuse rather than silently omit them.
    let logprobs = match &req {
        JobRequest::Chat(r) => r.logprobs == Some(true),
        JobRequest::Completion(r) => r.logprobs.is_some(),
    };
    if logprobs {
        return Err(ApiError::invalid(
            "logprobs",
            "log probabilities are not available through the gateway",
        )
        .into());
    }
    if req.model().is_empty() {
        return Err(ApiError::invalid("model", "`model` must not be empty").into());
    }
    Ok(req)
}

fn include_usage(req: &JobRequest) -> bool {
    match req {
        JobRequest::Chat(r) => r.sampling.include_usage(),
        JobRequest::Completion(r) => r.sampling.include_usage(),
    }
}

/// Admits and enqueues request `id` (see the module docs).
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    id: Uuid,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Accepted, Reject> {
    let principal = auth::principal(shared, headers).await?;
    let tenant = principal.tenant.clone();
    tracing::Span::current().record("tenant", tenant.as_str());
    let req = parse(endpoint, body)?;

    let policy = shared.policy(&principal).await?;
    if policy.budget_exhausted {
        return Err(ApiError::payment_required(
            "Your monthly budget is spent; raise it or wait for the next month.",
        )
        .into());
    }
    match shared.limiter.admit(&tenant, &policy.limits).await {
        Ok(Admission::Admitted) => {}
        Ok(Admission::Limited { kind, retry_after }) => {
            metrics::rate_limited(kind.as_str());
            let secs = retry_after_secs(retry_after.as_millis() as u64);
            return Err(Reject::retry(
                ApiError::rate_limited(format!(
                    "Rate limit reached: {} per minute. Retry after {secs} s.",
                    kind.as_str()
                )),
                secs,
            ));
        }
        Err(e) => {
            // Limits protect capacity, not money (budgets do): let the request through.
            metrics::limiter_failed();
            tracing::warn!(error = %e, "rate limiter unavailable; admitting");
        }
    }

    let model = req.model().to_owned();
    tracing::Span::current().record("model", model.as_str());
    let record = match shared.models.fresh(&model) {
        Some(r) => r,
        None => {
            let r = shared
                .broker
                .model(&model)
                .await?
                .ok_or_else(|| ApiError::model_not_found(&model))?;
            shared.models.put(model.clone(), r.clone());
            r
        }
    };
    if record.backlog_cap > 0 {
        let depth = shared.broker.depth(&model).await?;
        if depth.backlog >= record.backlog_cap {
            return Err(Reject::retry(
                ApiError::unavailable(format!(
                    "Model `{model}` has {} requests waiting, its limit; retry later.",
                    depth.backlog
                )),
                1,
            ));
        }
    }

    let now_ms = shared.now_ms();
    let deadline_ms = match record.max_queue_wait_ms {
        0 => 0,
        wait => now_ms + wait,
    };
    let stream = req.stream();
    let include_usage = include_usage(&req);
    let job = Job {
        id,
        tenant: tenant.clone(),
        model: model.clone(),
        body: req.to_body(),
        enqueued_at_ms: now_ms,
        deadline_ms,
        resume: None,
    };
    let entry = shared.broker.enqueue(&job).await?;
    // From here on the job exists: dropping `tracked` (an error below, or the client going
    // away) withdraws it.
    let tracked = Tracked::new(
        shared.clone(),
        id,
        tenant.clone(),
        model.clone(),
        entry.clone(),
        deadline_ms,
        0,
    );
    let owner = RequestRecord {
        id,
        tenant,
        model: model.clone(),
        entry_id: entry,
        endpoint: endpoint.as_str().to_owned(),
        include_usage,
        deadline_ms,
        created_at_ms: now_ms,
    };
    if let Err(e) = shared.broker.record_request(&owner).await {
        drop(tracked);
        return Err(e.into());
    }
    tracing::debug!(stream, "enqueued");
    let meta = ResponseMeta::new(endpoint, &id.simple().to_string(), now_ms / 1000, model);
    Ok(Accepted {
        tracked,
        meta,
        stream,
        include_usage,
    })
}
