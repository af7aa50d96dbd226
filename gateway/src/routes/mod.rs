//! The route table, the router built from it, and the layer every request passes through
//! (request id, tracing span, metrics).
//!
//! The table is the single source of the gateway's routes: the router is built from it and
//! the tests check that every entry is served and documented in `/openapi.json`.

mod admin;
mod completions;
mod ops;
mod requests;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;
use tidal_protocol::ApiError;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use crate::error::Reject;
use crate::gateway::Shared;
use crate::metrics;

/// Response header carrying the request id (the job id, UUIDv7).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// The id the request layer gave this request (an extension of every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId(pub Uuid);

type Routes = Vec<(&'static str, Method, MethodRouter<Arc<Shared>>)>;

fn table() -> Routes {
    vec![
        (
            "/v1/chat/completions",
            Method::POST,
            post(completions::chat),
        ),
        (
            "/v1/completions",
            Method::POST,
            post(completions::completion),
        ),
        ("/v1/models", Method::GET, get(completions::models)),
        (
            "/v1/requests/{id}/events",
            Method::GET,
            get(requests::events),
        ),
        ("/v1/admin/tenants", Method::GET, get(admin::list_tenants)),
        (
            "/v1/admin/tenants",
            Method::POST,
            post(admin::create_tenant),
        ),
        (
            "/v1/admin/tenants/{tenant}",
            Method::GET,
            get(admin::show_tenant),
        ),
        (
            "/v1/admin/tenants/{tenant}/keys",
            Method::POST,
            post(admin::issue_key),
        ),
        (
            "/v1/admin/tenants/{tenant}/limits",
            Method::PUT,
            put(admin::set_limits),
        ),
        (
            "/v1/admin/tenants/{tenant}/budget",
            Method::PUT,
            put(admin::set_budget),
        ),
        (
            "/v1/admin/keys/{key_id}",
            Method::DELETE,
            delete(admin::revoke_key),
        ),
        ("/health", Method::GET, get(ops::health)),
        ("/metrics", Method::GET, get(ops::metrics)),
        ("/openapi.json", Method::GET, get(ops::openapi)),
    ]
}

/// Every (path, method) the router serves, in axum's path syntax (`{param}`), which is
/// also OpenAPI's.
pub fn route_table() -> Vec<(&'static str, Method)> {
    table().into_iter().map(|(p, m, _)| (p, m)).collect()
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let mut merged: Vec<(&'static str, MethodRouter<Arc<Shared>>)> = Vec::new();
    for (path, _, mr) in table() {
        match merged.iter_mut().find(|(p, _)| *p == path) {
            Some((_, existing)) => *existing = std::mem::take(existing).merge(mr),
            None => merged.push((path, mr)),
        }
    }
    let mut router = Router::new();
    for (path, mr) in merged {
        router = router.route(path, mr.fallback(method_not_allowed));
    }
    router
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(around))
        .with_state(shared)
}

/// Gives the request its id and span, and records its outcome.
async fn around(mut req: Request, next: Next) -> Response {
    let id = Uuid::now_v7();
    req.extensions_mut().insert(RequestId(id));
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %req.method(),
        route = %route,
        tenant = tracing::field::Empty,
        model = tracing::field::Empty,
    );
    let start = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().entry(REQUEST_ID_HEADER).or_insert(v);
    }
    metrics::finished(route, status, start.elapsed());
    span.in_scope(|| {
        tracing::debug!(
            status,
            took_ms = start.elapsed().as_millis() as u64,
            "answered"
        )
    });
    resp
}

async fn not_found(uri: axum::http::Uri) -> Reject {
    ApiError::not_found("unknown_url", format!("Unknown path {}", uri.path())).into()
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    Reject::from(ApiError::new(
        405,
        Some("method_not_allowed".into()),
        None,
        format!("Method {method} is not allowed on {}", uri.path()),
    ))
    .into_response()
}

/// A body extractor's rejection (too large, unreadable) as an OpenAI error.
/// `resp` labelled as request `id`'s: a reattach, or a retry under a used idempotency key,
/// answers as the request it follows (the middleware adds the new request's own id only where
/// no id is set).
pub(crate) fn answered_as(mut resp: Response, id: Uuid) -> Response {
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

pub(crate) fn body_error(e: axum::extract::rejection::BytesRejection) -> Reject {
    let status = e.status().as_u16();
    let status = if (400..500).contains(&status) {
        status
    } else {
        400
    };
    ApiError::new(status, Some("invalid_body".into()), None, e.body_text()).into()
}
