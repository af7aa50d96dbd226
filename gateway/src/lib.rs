//! Tidal's public API (design.md, "Data flow"): OpenAI-compatible completions through the
//! per-model job queue, with auth, budgets, rate limits and an admin API.
//!
//! A request goes: request id (UUIDv7, the job id; `x-request-id` header and the `request`
//! span of every log line) → API key ([`tidal_billing::Ledger::authenticate`], cached
//! briefly; while the ledger is unreachable, a circuit breaker skips it and a key checked
//! within `max_stale` is taken from the cache) → body (read only now, capped per route) →
//! body checks ([`tidal_protocol::job::JobRequest::validate`]) → budget (402) and
//! rate limits (429 + `Retry-After`, [`limits`]) → model record (404 `model_not_found`) →
//! backlog cap (503 + `Retry-After`) → enqueue with `deadline = now + max queue wait` and
//! record its owner in the broker → read its response stream (blocking reads) → JSON or SSE.
//! Past the deadline with nothing started, the job is withdrawn and the client gets 503; if
//! a worker started it first, it is served. A client that goes away withdraws or cancels its
//! job. A client whose connection broke (a gateway restart) reattaches with
//! `GET /v1/requests/{id}/events` and `Last-Event-ID`.
//!
//! Build one with [`Gateway::new`] from any [`tidal_queue::Broker`], a
//! [`tidal_billing::Ledger`] and a [`limits::RateLimiter`]; serve [`Gateway::router`].
//! [`fake_worker`] is a model-free worker for tests and the benchmark ([`mod@bench`]).

mod admission;
mod auth;
pub mod bench;
mod breaker;
mod cache;
mod config;
mod error;
pub mod fake_worker;
mod gateway;
mod hold;
pub mod limits;
pub mod metrics;
pub mod openapi;
mod relay;
mod respond;
pub mod routes;

pub use config::GatewayConfig;
pub use error::Reject;
pub use gateway::Gateway;
pub use limits::{MemoryLimiter, RateLimiter, RedisLimiter};
pub use routes::{route_table, REQUEST_ID_HEADER};
