//! Metric names of the gateway (Prometheus, through the `metrics` facade) and helpers.
//!
//! - `tidal_gateway_requests_total{route,status}`: finished HTTP requests.
//! - `tidal_gateway_request_duration_seconds{route}`: arrival to the response head, which for
//!   a stream is its first chunk (histogram).
//! - `tidal_gateway_queue_wait_seconds{model}`: enqueue to the first response event, i.e. the
//!   queue wait plus the worker's prefill (histogram); observed also for withdrawn requests.
//! - `tidal_gateway_errors_total{code}`: error responses by OpenAI error code (or status).
//! - `tidal_gateway_in_flight`: requests enqueued and not yet finished (gauge).
//! - `tidal_gateway_withdrawn_total{model}`, `tidal_gateway_cancelled_total{model}`: jobs
//!   withdrawn after max queue wait or on disconnect, and jobs cancelled while running.
//! - `tidal_gateway_rate_limited_total{limit}`; `tidal_gateway_limiter_failures_total`
//!   (the limiter's store failed and the request was let through).
//! - `tidal_gateway_budget_refused_total`: requests whose worst case did not fit the tenant's
//!   budget beside its spend and holds (402).

use std::time::Duration;

use tidal_protocol::ApiError;

/// Finished requests.
pub const REQUESTS: &str = "tidal_gateway_requests_total";
/// Request latency.
pub const DURATION: &str = "tidal_gateway_request_duration_seconds";
/// Queue wait (to the first response event).
pub const QUEUE_WAIT: &str = "tidal_gateway_queue_wait_seconds";
/// Errors by code.
pub const ERRORS: &str = "tidal_gateway_errors_total";
/// Requests in flight.
pub const IN_FLIGHT: &str = "tidal_gateway_in_flight";
/// Jobs withdrawn before they started.
pub const WITHDRAWN: &str = "tidal_gateway_withdrawn_total";
/// Jobs cancelled after they started.
pub const CANCELLED: &str = "tidal_gateway_cancelled_total";
/// Requests refused by a rate limit.
pub const RATE_LIMITED: &str = "tidal_gateway_rate_limited_total";
/// Rate-limiter failures (fail open).
pub const LIMITER_FAILURES: &str = "tidal_gateway_limiter_failures_total";

/// Requests refused because their worst case did not fit the budget.
pub const BUDGET_REFUSED: &str = "tidal_gateway_budget_refused_total";

/// Counts an error response by its code (or status when it has none).
pub fn error(e: &ApiError) {
    let code = e
        .code
        .as_deref()
        .map(str::to_owned)
        .unwrap_or_else(|| e.status.to_string());
    metrics::counter!(ERRORS, "code" => code).increment(1);
}

/// Records a finished request.
pub fn finished(route: String, status: u16, took: Duration) {
    metrics::counter!(REQUESTS, "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    metrics::histogram!(DURATION, "route" => route).record(took.as_secs_f64());
}

/// Records how long a request waited for its first response event.
pub fn queue_wait(model: &str, waited: Duration) {
    metrics::histogram!(QUEUE_WAIT, "model" => model.to_owned()).record(waited.as_secs_f64());
}

/// Moves the in-flight gauge.
pub fn in_flight(delta: f64) {
    metrics::gauge!(IN_FLIGHT).increment(delta);
}

/// Counts a withdrawn job.
pub fn withdrawn(model: &str) {
    metrics::counter!(WITHDRAWN, "model" => model.to_owned()).increment(1);
}

/// Counts a cancelled job.
pub fn cancelled(model: &str) {
    metrics::counter!(CANCELLED, "model" => model.to_owned()).increment(1);
}

/// Counts a request refused by a rate limit.
pub fn rate_limited(limit: &'static str) {
    metrics::counter!(RATE_LIMITED, "limit" => limit).increment(1);
}

/// Counts a rate-limiter failure.
pub fn limiter_failed() {
    metrics::counter!(LIMITER_FAILURES).increment(1);
}

/// Counts a request refused by its tenant's budget.
pub fn budget_refused() {
    metrics::counter!(BUDGET_REFUSED).increment(1);
}
