//! From an HTTP request to an enqueued job: auth → body checks → budget and rate limits →
//! model lookup → backlog cap → one atomic submit (enqueue, owner record, idempotency key).
//! Every refusal is an OpenAI error ([`Reject`]): 401, 400, 402, 429 (+ Retry-After),
//! 404 `model_not_found`, 503 (+ Retry-After) for a full backlog or an unreachable queue.
//!
//! A request sent with an `Idempotency-Key` the tenant already used enqueues nothing: while
//! the first request is kept (running, queued, or waiting for a reader after its gateway
//! died) the retry follows it and answers as it would have; once it was answered, 409
//! `idempotency_key_reused`; with another body or endpoint, 422 `idempotency_key_mismatch`.
//! A request that ends without an answer frees its key ([`crate::relay`]).
//!
//! A tenant with a budget holds each request's worst case in the ledger before it is
//! enqueued ([`crate::hold`]); the hold is settled when the request ends.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use tidal_billing::Principal;
use tidal_protocol::error::parse_json;
use tidal_protocol::job::JobRequest;
use tidal_protocol::render::{Endpoint, ResponseMeta};
use tidal_protocol::ApiError;
use tidal_queue::{Idempotency, Job, RequestRecord, Submitted};
use uuid::Uuid;

use crate::error::Reject;
use crate::gateway::Shared;
use crate::hold::{self, HoldTerms};
use crate::limits::{window::retry_after_secs, Admission};
use crate::metrics;
use crate::relay::Tracked;
use crate::respond;

/// An accepted request: its job is in the queue.
pub(crate) struct Accepted {
    /// Its id: the new one, or the first request's for a retry with a used idempotency key.
    pub id: Uuid,
    /// Follows the job's response stream.
    pub tracked: Tracked,
    /// Shape of its response bodies.
    pub meta: ResponseMeta,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
    /// Whether the response carries log-probabilities.
    pub logprobs: bool,
}

/// Parses the body of `endpoint` and runs the checks that need no model.
pub(crate) fn parse(endpoint: Endpoint, body: &[u8]) -> Result<JobRequest, Reject> {
    let req = match endpoint {
        Endpoint::Chat => JobRequest::Chat(parse_json(body)?),
        Endpoint::Completion => JobRequest::Completion(parse_json(body)?),
    };
    req.validate()?;
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

/// Header with which a client makes retries safe: one job per (tenant, key).
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// The request's idempotency key, if it sent one: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Reject> {
    let Some(v) = headers.get(IDEMPOTENCY_HEADER) else {
        return Ok(None);
    };
    let bytes = v.as_bytes();
    if bytes.is_empty() || bytes.len() > 255 || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "`Idempotency-Key` must be 1 to 255 visible ASCII characters",
        )
        .into());
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// Digest of a request as sent: a retry under the same idempotency key must match it.
fn fingerprint(endpoint: Endpoint, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(endpoint.as_str().as_bytes());
    h.update([0]);
    h.update(body);
    h.finalize()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The first request of a retry's idempotency key, if the retry may reattach to it: it is
/// still kept (409 once answered) and it is the same request (422 otherwise).
fn same_request(
    first: Uuid,
    kept: Option<RequestRecord>,
    retry: &RequestRecord,
) -> Result<RequestRecord, Reject> {
    let kept = kept.ok_or_else(|| {
        ApiError::new(
            409,
            Some("idempotency_key_reused".into()),
            Some("Idempotency-Key".into()),
            format!("Request {first}, sent with this Idempotency-Key, was already answered; use a new key for a new request."),
        )
    })?;
    let print = |r: &RequestRecord| r.idempotency.as_ref().map(|i| i.fingerprint.clone());
    if print(&kept) != print(retry) {
        return Err(ApiError::new(
            422,
            Some("idempotency_key_mismatch".into()),
            Some("Idempotency-Key".into()),
            format!("This Idempotency-Key was first used for request {first} with a different body or endpoint."),
        )
        .into());
    }
    Ok(kept)
}

/// Admits and enqueues request `id` of `principal` (authenticated by the caller before it
/// read the body; see the module docs).
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    id: Uuid,
    principal: Principal,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Accepted, Reject> {
    let tenant = principal.tenant.clone();
    tracing::Span::current().record("tenant", tenant.as_str());
    let req = parse(endpoint, body)?;
    let idempotency = idempotency_key(headers)?;

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

    // Last of the checks, so a refused request holds nothing.
    let hold = if policy.has_budget {
        let terms = HoldTerms::worst_case(&req, &record);
        hold::place(shared, id, &tenant, &terms).await?;
        Some(terms)
    } else {
        None
    };

    let now_ms = shared.now_ms();
    let deadline_ms = match record.max_queue_wait_ms {
        0 => 0,
        wait => now_ms + wait,
    };
    let stream = req.stream();
    let include_usage = include_usage(&req);
    let logprobs = req.logprobs();
    let job = Job {
        id,
        tenant: tenant.clone(),
        model: model.clone(),
        body: req.to_body(),
        enqueued_at_ms: now_ms,
        deadline_ms,
        resume: None,
    };
    let record = RequestRecord {
        id,
        tenant,
        model: model.clone(),
        entry_id: String::new(),
        endpoint: endpoint.as_str().to_owned(),
        include_usage,
        logprobs,
        idempotency: idempotency.map(|key| Idempotency {
            key,
            fingerprint: fingerprint(endpoint, body),
        }),
        deadline_ms,
        created_at_ms: now_ms,
    };
    let submitted = shared.broker.submit(&job, &record).await;
    if hold.is_some() && !matches!(submitted, Ok(Submitted::Enqueued(_))) {
        // Nothing of ours will run: a retry follows the first request, which holds its own.
        hold::release(shared, id);
    }
    let (record, hold) = match submitted? {
        Submitted::Enqueued(entry) => (
            RequestRecord {
                entry_id: entry,
                ..record
            },
            hold,
        ),
        Submitted::Duplicate {
            id: first,
            record: kept,
        } => {
            let kept = same_request(first, kept, &record)?;
            tracing::info!(request = %first, "retry with a used idempotency key; reattaching");
            (kept, None)
        }
    };
    // From here on the job exists: dropping `tracked` (an error below, or the client going
    // away) withdraws or cancels it.
    let tracked = Tracked::new(shared.clone(), &record, 0).holding(hold);
    tracing::debug!(stream, "enqueued");
    let meta = respond::response_meta(endpoint, &record);
    Ok(Accepted {
        id: record.id,
        tracked,
        meta,
        stream,
        include_usage,
        logprobs,
    })
}
