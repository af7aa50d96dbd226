//! Request bodies are read only after the caller is authenticated, and are capped per route.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, Request, StatusCode};
use common::*;
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;
use tidal_gateway::routes::{ADMIN_BODY_BYTES, COMPLETION_BODY_BYTES};
use tower::ServiceExt;

/// A 16 MiB body in 64 KiB chunks that counts the chunks the server pulls from it.
fn counted_body(pulled: Arc<AtomicUsize>) -> Body {
    let chunks = futures::stream::iter(0..256).map(move |_| {
        pulled.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 64 << 10]))
    });
    Body::from_stream(chunks)
}

async fn send(
    h: &Harness,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Body,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = h
        .gateway
        .router()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn unauthenticated_bodies_are_not_read() {
    let h = Harness::start().await;
    let unknown = "tidal_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    for (method, path, token) in [
        ("POST", "/v1/chat/completions", None),
        ("POST", "/v1/completions", Some(unknown)),
        ("POST", "/v1/admin/tenants", None),
        ("POST", "/v1/admin/tenants", Some("wrong")),
        ("POST", "/v1/admin/tenants/acme/keys", Some(h.key.as_str())),
        ("PUT", "/v1/admin/tenants/acme/budget", None),
        ("PUT", "/v1/admin/tenants/acme/limits", Some(unknown)),
    ] {
        let pulled = Arc::new(AtomicUsize::new(0));
        let body = counted_body(pulled.clone());
        let (status, body) = send(&h, method, path, token, body).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        assert_eq!(
            pulled.load(Ordering::SeqCst),
            0,
            "{path}: no byte of an unauthenticated body is read"
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn bodies_over_the_route_cap_get_413() {
    let h = Harness::start().await;
    // Authenticated, streamed without a length: refused once past the cap, not read on.
    let pulled = Arc::new(AtomicUsize::new(0));
    let (status, body) = send(
        &h,
        "POST",
        "/v1/chat/completions",
        Some(&h.key),
        counted_body(pulled.clone()),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "request_too_large");
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        COMPLETION_BODY_BYTES / (64 << 10) + 1,
        "reading stopped at the chunk past the cap"
    );
    let pulled = Arc::new(AtomicUsize::new(0));
    let (status, _) = send(
        &h,
        "POST",
        "/v1/admin/tenants",
        Some(ADMIN),
        counted_body(pulled.clone()),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(pulled.load(Ordering::SeqCst), 2);

    // Over a socket, with a length: one byte over each cap.
    let over = "x".repeat(COMPLETION_BODY_BYTES + 1);
    let e = error(
        h.post("/v1/chat/completions", Some(&h.key), &over).await,
        413,
    )
    .await;
    assert_eq!(e["error"]["code"], "request_too_large");
    let e = error(h.post("/v1/completions", Some(&h.key), &over).await, 413).await;
    assert_eq!(e["error"]["code"], "request_too_large");
    let over = format!(
        r#"{{"id": "big", "name": "{}"}}"#,
        "x".repeat(ADMIN_BODY_BYTES)
    );
    let r = h
        .http
        .post(format!("{}/v1/admin/tenants", h.base))
        .bearer_auth(ADMIN)
        .body(over)
        .send()
        .await
        .unwrap();
    error(r, 413).await;
    // At the cap, a completion body is read (and this one is then refused as JSON).
    let at_cap = format!("{{{}}}", " ".repeat(COMPLETION_BODY_BYTES - 2));
    let e = error(
        h.post("/v1/chat/completions", Some(&h.key), &at_cap).await,
        400,
    )
    .await;
    assert_ne!(e["error"]["code"], "request_too_large");
    let r = h
        .admin(Method::GET, "/v1/admin/tenants", Some(ADMIN), None)
        .await;
    assert_eq!(r.status(), 200);
    h.stop().await;
}
