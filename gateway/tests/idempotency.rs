//! Retries with an `Idempotency-Key`: one job per (tenant, key). A retry of a request that
//! is still kept reattaches to it and answers as the first request (same id, same text);
//! a retry after the answer was delivered gets 409; a different request under a used key
//! 422; a request that ended without an answer (client gone) frees its key.

mod common;

use common::*;
use serde_json::{json, Value};
use tidal_queue::testing::drain_usage;
use uuid::Uuid;

const KEY_HEADER: &str = "Idempotency-Key";

fn body(model: &str, content: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": content}]}).to_string()
}

async fn post_with_key(base: &str, key: &str, idem: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header(KEY_HEADER, idem)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

fn request_id(r: &reqwest::Response) -> Uuid {
    Uuid::parse_str(r.headers()["x-request-id"].to_str().unwrap()).unwrap()
}

#[tokio::test]
async fn a_retry_after_the_gateway_went_away_gets_the_first_answer_once() {
    let h = Harness::start().await;
    h.put_model("cold", 60_000, 0).await;
    let req = body("cold", "only once please");
    // The first attempt waits for a worker; its gateway goes away before anything came.
    let detach = async {
        h.until_backlog("cold", 1).await;
        h.gateway.detach_in_flight();
    };
    let (first, ()) = tokio::join!(post_with_key(&h.base, &h.key, "order-17", &req), detach);
    let first_id = request_id(&first);
    error(first, 503).await;
    // The client retries on another gateway, with the same key, and no id of its own.
    let (base2, server2) = h.second_gateway().await;
    let retry = tokio::spawn({
        let (base2, key, req) = (base2.clone(), h.key.clone(), req.clone());
        async move { post_with_key(&base2, &key, "order-17", &req).await }
    });
    let w = h.worker("cold", 0);
    let retry = retry.await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(
        request_id(&retry),
        first_id,
        "the retry answers as the first request"
    );
    let v: Value = retry.json().await.unwrap();
    assert_eq!(v["id"], format!("chatcmpl-{}", first_id.simple()));
    assert_eq!(v["choices"][0]["message"]["content"], "only once please");
    // The worker finishes what it holds on stop; nothing else is left to claim.
    w.stop().await;
    let left = h
        .broker
        .claim("cold", "probe", 10, std::time::Duration::from_millis(100))
        .await
        .unwrap();
    assert!(left.is_empty(), "a second job was enqueued: {left:?}");
    let usage = drain_usage(&*h.broker).await;
    assert_eq!(usage.len(), 1, "run and billed once: {usage:?}");
    assert_eq!(usage[0].request_id, first_id);

    // Answered: a later retry under the key is refused rather than run again.
    let b = h.broker.clone();
    eventually("the answered request forgotten", || {
        let b = b.clone();
        async move { b.request(first_id).await.unwrap().is_none() }
    })
    .await;
    let late = post_with_key(&base2, &h.key, "order-17", &req).await;
    let e = error(late, 409).await;
    assert_eq!(e["error"]["code"], "idempotency_key_reused");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&first_id.to_string()), "{msg}");
    assert_eq!(e["error"]["param"], "Idempotency-Key");
    // Another tenant's use of the same key is its own request.
    let w = h.worker("cold", 0);
    let other = post_with_key(&base2, &h.key_b, "order-17", &req).await;
    assert_eq!(other.status(), 200);
    assert_ne!(request_id(&other), first_id);
    w.stop().await;
    server2.abort();
    h.stop().await;
}

#[tokio::test]
async fn a_used_key_with_another_request_is_422_and_bad_keys_400() {
    let h = Harness::start().await;
    h.put_model("cold", 60_000, 0).await;
    let first = tokio::spawn({
        let (base, key, req) = (h.base.clone(), h.key.clone(), body("cold", "first"));
        async move { post_with_key(&base, &key, "k-1", &req).await }
    });
    h.until_backlog("cold", 1).await;
    let other = post_with_key(&h.base, &h.key, "k-1", &body("cold", "second")).await;
    let e = error(other, 422).await;
    assert_eq!(e["error"]["code"], "idempotency_key_mismatch");
    assert_eq!(h.broker.depth("cold").await.unwrap().backlog, 1);
    for bad in ["", "has space", &"x".repeat(256)] {
        let r = post_with_key(&h.base, &h.key, bad, &body("cold", "x")).await;
        let e = error(r, 400).await;
        assert_eq!(e["error"]["param"], "Idempotency-Key", "{bad:?}");
    }

    // The first client goes away: its job is withdrawn and its key freed, so the same key
    // now starts a new request.
    first.abort();
    h.until_backlog("cold", 0).await;
    let again = tokio::spawn({
        let (base, key, req) = (h.base.clone(), h.key.clone(), body("cold", "second"));
        async move { post_with_key(&base, &key, "k-1", &req).await }
    });
    h.until_backlog("cold", 1).await;
    let w = h.worker("cold", 0);
    let again = again.await.unwrap();
    assert_eq!(again.status(), 200);
    let v: Value = again.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "second");
    w.stop().await;
    h.stop().await;
}
