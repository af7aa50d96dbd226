//! A gateway killed with SIGKILL while a request waits for a worker: its client never got
//! a request id, but a retry with the same `Idempotency-Key` through a new gateway process
//! gets the first request's complete answer, and the request runs and is billed once.
//! Real processes: `tidal gateway` over Redis and SQLite, a `tidal runtime --queue` worker
//! on the default model.

mod platform_common;
mod process;
mod worker_common;

use std::time::Duration;

use platform_common::{key_for, platform, start_gateway};
use serde_json::{json, Value};
use worker_common::*;

fn chat_body() -> Value {
    json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Name one colour."}],
        "max_tokens": 8,
        "temperature": 0
    })
}

async fn post(base: &str, key: &str, idem: Option<&str>) -> reqwest::Result<reqwest::Response> {
    let mut r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body());
    if let Some(k) = idem {
        r = r.header("Idempotency-Key", k);
    }
    r.send().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_gateway_crash_runs_the_request_once() {
    let mut p = platform("platidem", 120_000).await;
    let key = key_for(&p.db, "acme");
    // No worker yet: the request waits in the queue.
    let first = tokio::spawn({
        let (base, key) = (p.base.clone(), key.clone());
        async move { post(&base, &key, Some("crash-1")).await }
    });
    let broker = p.queue.broker.clone();
    process::eventually("the first request queued", Duration::from_secs(30), || {
        let b = broker.clone();
        async move { (b.depth(MODEL_ID).await.unwrap().backlog == 1).then_some(()) }
    })
    .await;
    // The gateway dies without a word: the client's connection breaks, and it has no id.
    p.gateway.0.kill().unwrap();
    let _ = p.gateway.0.wait();
    assert!(
        first.await.unwrap().is_err(),
        "the client lost its connection"
    );

    let (_gateway2, base2) = start_gateway(&p.queue, &p.db).await;
    let worker = WorkerProcess::start(&default_model(), &p.queue, "w1", "30s", "10s");
    wait_ready(&*p.queue.broker, &["w1"]).await;
    let retry = post(&base2, &key, Some("crash-1")).await.unwrap();
    assert_eq!(retry.status(), 200);
    let retry_id: uuid::Uuid = retry.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let retried: Value = retry.json().await.unwrap();
    // An undisturbed request gives the same greedy answer.
    let fresh: Value = post(&base2, &key, None)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(!text(&retried).is_empty());
    assert_eq!(text(&retried), text(&fresh));
    // (The fresh one's prompt comes from the prefix cache; the counts are the same.)
    for field in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(retried["usage"][field], fresh["usage"][field], "{field}");
    }

    wait_settled(&*p.queue.broker).await;
    let usage = usage_events(&*p.queue.broker).await;
    assert_eq!(
        usage.len(),
        2,
        "the retried request and the fresh one: {usage:?}"
    );
    let of_retry: Vec<_> = usage.iter().filter(|u| u.request_id == retry_id).collect();
    assert_eq!(of_retry.len(), 1, "the crashed request ran once: {usage:?}");
    assert_eq!(
        of_retry[0].completion_tokens,
        retried["usage"]["completion_tokens"].as_u64().unwrap()
    );
    drop(worker);
}
