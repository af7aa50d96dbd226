//! The route table, the router built from it, and the layer every request passes through
//! (request id, tracing span, metrics).
//!
//! The table is the single source of the gateway's routes: the router is built from it and
//! the tests check that every entry is served and documented in `/openapi.json`.

pub(crate) mod admin;
pub(crate) mod completions;
pub(crate) mod ops;
mod requests;

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;
use futures::StreamExt;
use tidal_protocol::ApiError;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use crate::error::Reject;
use crate::gateway::Shared;
use crate::metrics;

/// Response header carrying the request id (the job id, UUIDv7).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Largest completion request body (413 beyond). The largest context of the architectures
/// we serve is 128k tokens; at about 4 bytes of text per token that is 512 KiB of prompt,
/// about 1 MiB once JSON-escaped, and a prompt of 128k token ids is under 1 MiB too, so
/// 4 MiB admits any prompt a model can take with room to spare.
pub const COMPLETION_BODY_BYTES: usize = 4 << 20;

/// Largest admin request body (413 beyond): its bodies are a few small fields.
pub const ADMIN_BODY_BYTES: usize = 64 << 10;

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

/// A path, its methods and their handlers.
type PathRoutes = (&'static str, Vec<Method>, MethodRouter<Arc<Shared>>);

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let mut merged: Vec<PathRoutes> = Vec::new();
    for (path, method, mr) in table() {
        match merged.iter_mut().find(|(p, _, _)| *p == path) {
            Some((_, methods, existing)) => {
                methods.push(method);
                *existing = std::mem::take(existing).merge(mr);
            }
            None => merged.push((path, vec![method], mr)),
        }
    }
    let mut router = Router::new();
    for (path, methods, mr) in merged {
        let allow: Vec<&str> = methods.iter().map(Method::as_str).collect();
        let allow = HeaderValue::from_str(&allow.join(", ")).ok();
        let refuse = move |method: Method, uri: axum::http::Uri| {
            let allow = allow.clone();
            async move { method_not_allowed(method, uri, allow) }
        };
        router = router.route(path, mr.fallback(refuse));
    }
    router
        .fallback(not_found)
        // Handlers read bodies themselves ([`read_body`]); this caps any extractor that would.
        .layer(DefaultBodyLimit::max(COMPLETION_BODY_BYTES))
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

/// 405 with `Allow`: the methods the path serves.
fn method_not_allowed(
    method: Method,
    uri: axum::http::Uri,
    allow: Option<HeaderValue>,
) -> Response {
    let mut resp = Reject::from(ApiError::new(
        405,
        Some("method_not_allowed".into()),
        None,
        format!("Method {method} is not allowed on {}", uri.path()),
    ))
    .into_response();
    if let Some(allow) = allow {
        resp.headers_mut().insert(header::ALLOW, allow);
    }
    resp
}

/// `resp` labelled as request `id`'s: a reattach, or a retry under a used idempotency key,
/// answers as the request it follows (the middleware adds the new request's own id only where
/// no id is set).
pub(crate) fn answered_as(mut resp: Response, id: Uuid) -> Response {
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// 413 for a body over `cap` bytes.
fn too_large(cap: usize) -> Reject {
    ApiError::new(
        413,
        Some("request_too_large".into()),
        None,
        format!("The request body is larger than this route takes ({cap} bytes)."),
    )
    .into()
}

/// Reads a request body of at most `cap` bytes. Call it only once the caller is
/// authenticated: an unauthenticated request is refused without its body being read.
///
/// A declared `Content-Length` over `cap` is refused before any byte is read; otherwise at
/// most `cap` bytes are buffered (413 past them). Reads wait for one of `body_reads` turns,
/// so memory held by bodies stays under `body_reads` x `cap`, and must finish within
/// `body_timeout` (408).
pub(crate) async fn read_body(
    shared: &Shared,
    headers: &HeaderMap,
    body: Body,
    cap: usize,
) -> Result<Bytes, Reject> {
    let turns = &shared.body_reads;
    read_capped(turns, shared.config.body_timeout, headers, body, cap).await
}

/// [`read_body`] with its turns and time limit passed in.
async fn read_capped(
    turns: &Semaphore,
    limit: Duration,
    headers: &HeaderMap,
    body: Body,
    cap: usize,
) -> Result<Bytes, Reject> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(too_large(cap));
    }
    let read = async {
        // The semaphore is never closed, so acquiring only waits for a turn.
        let _turn = turns
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable("The gateway is stopping."))?;
        let mut stream = body.into_data_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    400,
                    Some("invalid_body".into()),
                    None,
                    format!("Failed to read the request body: {e}"),
                )
            })?;
            if buf.len() + chunk.len() > cap {
                return Err(too_large(cap));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(limit, read).await.unwrap_or_else(|_| {
        Err(ApiError::new(
            408,
            Some("request_timeout".into()),
            None,
            format!(
                "The request body did not arrive within {} ms.",
                limit.as_millis()
            ),
        )
        .into())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use futures::FutureExt;

    use super::*;

    /// A body of `chunks` chunks of `size` bytes (then, if `hang`, one that never comes),
    /// counting the chunks read.
    fn body(chunks: usize, size: usize, hang: bool, read: Arc<AtomicUsize>) -> Body {
        let items = futures::stream::iter((0..chunks).map(move |_| {
            read.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; size]))
        }));
        let tail = futures::stream::iter(hang.then_some(())).then(|_| std::future::pending());
        Body::from_stream(items.chain(tail))
    }

    const LIMIT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn reads_up_to_the_cap() {
        let turns = Semaphore::new(1);
        let read = Arc::new(AtomicUsize::new(0));
        let h = HeaderMap::new();
        let b = read_capped(&turns, LIMIT, &h, body(4, 256, false, read.clone()), 1024)
            .await
            .unwrap();
        assert_eq!(b.len(), 1024);
        // One byte over, without a length: refused once the cap is passed, not read on.
        let read = Arc::new(AtomicUsize::new(0));
        let e = read_capped(&turns, LIMIT, &h, body(8, 257, false, read.clone()), 1024)
            .await
            .unwrap_err();
        assert_eq!(e.status(), 413);
        assert_eq!(
            read.load(Ordering::SeqCst),
            4,
            "stopped at the chunk past the cap"
        );
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_refused_unread() {
        let turns = Semaphore::new(1);
        let read = Arc::new(AtomicUsize::new(0));
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1025"));
        let e = read_capped(&turns, LIMIT, &h, body(1, 10, false, read.clone()), 1024)
            .await
            .unwrap_err();
        assert_eq!(e.status(), 413);
        assert_eq!(e.error.code.as_deref(), Some("request_too_large"));
        assert_eq!(read.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn reads_wait_for_a_turn() {
        let turns = Semaphore::new(1);
        let held = turns.acquire().await.unwrap();
        let read = Arc::new(AtomicUsize::new(0));
        let h = HeaderMap::new();
        let mut waiting = Box::pin(read_capped(
            &turns,
            LIMIT,
            &h,
            body(1, 10, false, read.clone()),
            1024,
        ));
        assert!((&mut waiting).now_or_never().is_none());
        assert_eq!(
            read.load(Ordering::SeqCst),
            0,
            "no byte read without a turn"
        );
        drop(held);
        assert_eq!(waiting.await.unwrap().len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_gets_408() {
        let turns = Semaphore::new(1);
        let read = Arc::new(AtomicUsize::new(0));
        let h = HeaderMap::new();
        let e = read_capped(&turns, LIMIT, &h, body(1, 10, true, read), 1024)
            .await
            .unwrap_err();
        assert_eq!(e.status(), 408);
        assert_eq!(turns.available_permits(), 1, "its turn is given back");
    }
}
