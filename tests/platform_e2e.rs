//! The pay-per-token path end to end with real processes: `tidal gateway` over Redis and a
//! SQLite ledger, `tidal runtime --queue` workers on the real default model, tenants and
//! keys made with `tidal keys`. 50 concurrent streaming requests from three tenants through
//! two workers; and a model with no worker, whose requests wait until one starts, and whose
//! request past the max queue wait gets a 503 and never runs.

mod platform_common;
mod process;
mod worker_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use platform_common::{key_for, platform, publish};
use serde_json::{json, Value};
use worker_common::*;

/// One streaming chat request; returns (content, prompt tokens, completion tokens).
async fn stream_chat(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    i: usize,
) -> (String, u64, u64) {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": format!("Write a word about the number {i}.")}],
            "max_tokens": 16,
            "temperature": 0.8,
            "seed": i,
            "stream": true,
            "stream_options": {"include_usage": true}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    let body = r.text().await.unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d}: {e}")))
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    let mut content = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["id"], id, "one id per stream");
        if let Some(choice) = c["choices"].get(0) {
            content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
            if let Some(f) = choice["finish_reason"].as_str() {
                assert!(finish.is_none(), "two finish reasons");
                finish = Some(f.to_owned());
            }
        }
    }
    assert!(
        matches!(finish.as_deref(), Some("stop" | "length")),
        "{body}"
    );
    let usage = &chunks.last().unwrap()["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=16).contains(&completion), "{usage}");
    (
        content,
        usage["prompt_tokens"].as_u64().unwrap(),
        completion,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_streams_from_three_tenants_through_the_gateway_and_two_workers() {
    let model = default_model();
    let p = platform("plat50", 120_000).await;
    let tenants = ["acme", "globex", "initech"];
    let keys: Vec<String> = tenants.iter().map(|t| key_for(&p.db, t)).collect();
    let w1 = WorkerProcess::start(&model, &p.queue, "w1", "30s", "10s");
    let w2 = WorkerProcess::start(&model, &p.queue, "w2", "30s", "10s");
    wait_ready(&*p.queue.broker, &["w1", "w2"]).await;

    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (client, base, key) = (client.clone(), p.base.clone(), keys[i % 3].clone());
        tasks.push(tokio::spawn(async move {
            (i % 3, stream_chat(&client, &base, &key, i).await)
        }));
    }
    let mut billed: HashMap<&str, (u64, u64)> = HashMap::new();
    for t in tasks {
        let (tenant, (content, prompt, completion)) = t.await.unwrap();
        assert!(!content.is_empty());
        let e = billed.entry(tenants[tenant]).or_default();
        e.0 += prompt;
        e.1 += completion;
    }
    wait_settled(&*p.queue.broker).await;

    // Usage events: each tenant pays exactly what its responses reported.
    let usage = usage_events(&*p.queue.broker).await;
    assert_eq!(usage.len(), 50, "one segment per undisturbed request");
    let mut metered: HashMap<String, (u64, u64)> = HashMap::new();
    let mut workers = std::collections::HashSet::new();
    for u in &usage {
        let e = metered.entry(u.tenant.clone()).or_default();
        e.0 += u.prompt_tokens;
        e.1 += u.completion_tokens;
        workers.insert(u.worker.clone());
    }
    for t in tenants {
        assert_eq!(
            metered.get(t).copied(),
            billed.get(t).copied(),
            "tenant {t}"
        );
    }
    assert_eq!(workers.len(), 2, "both workers served: {workers:?}");
    drop((w1, w2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_workers_requests_wait_and_an_expired_one_never_runs() {
    let model = default_model();
    let p = platform("platcold", 2_000).await;
    let key = key_for(&p.db, "acme");
    let client = reqwest::Client::new();
    let body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4
    });

    // Nobody serves the model: after the 2 s max queue wait, a 503 with Retry-After.
    let t0 = Instant::now();
    let r = client
        .post(format!("{}/v1/chat/completions", p.base))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(t0.elapsed() >= Duration::from_secs(2));
    let expired: uuid::Uuid = r.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["type"], "server_error", "{err}");

    // A longer wait: the request waits until a worker starts, then completes.
    publish(&*p.queue.broker, 120_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = {
        let (client, base, key, body) = (client.clone(), p.base.clone(), key.clone(), body.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!waiting.is_finished(), "answered with no worker running");
    assert_eq!(
        p.queue.broker.depth(MODEL_ID).await.unwrap().backlog,
        1,
        "the expired job was withdrawn"
    );
    let _w = WorkerProcess::start(&model, &p.queue, "late", "30s", "10s");
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert!(
        done["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
        "{done}"
    );
    wait_settled(&*p.queue.broker).await;

    // The expired request never ran: no response event and no usage for it.
    let events = p
        .queue
        .broker
        .read_responses(expired, 0, 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(events.is_empty(), "{events:?}");
    let usage = usage_events(&*p.queue.broker).await;
    assert_eq!(usage.len(), 1);
    assert_ne!(usage[0].request_id, expired);
}

/// Streams one chat request, counting SSE chunks into `chunks`; returns the request id and
/// the content.
async fn counted_stream(
    client: reqwest::Client,
    url: String,
    key: String,
    request: Value,
    chunks: Arc<AtomicU64>,
) -> (uuid::Uuid, String) {
    let r = client
        .post(url)
        .bearer_auth(key)
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while let Some(part) = body.next().await {
        let part = part.expect("the stream was interrupted");
        chunks.fetch_add(1, Ordering::Relaxed);
        text.push_str(std::str::from_utf8(&part).unwrap());
    }
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let content = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    (id, content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_stream_is_invisible_to_gateway_clients() {
    let model = default_model();
    let p = platform("platkill", 120_000).await;
    let key = key_for(&p.db, "acme");
    let jobs = jobs(20);
    let want = reference_run(&model, &jobs).await;
    let victim = WorkerProcess::start(&model, &p.queue, "victim", "30s", "2s");
    let survivor = WorkerProcess::start(&model, &p.queue, "survivor", "30s", "2s");
    wait_ready(&*p.queue.broker, &["victim", "survivor"]).await;

    let chunks = Arc::new(AtomicU64::new(0));
    let client = reqwest::Client::new();
    let clients: Vec<_> = jobs
        .iter()
        .map(|j| {
            tokio::spawn(counted_stream(
                client.clone(),
                format!("{}/v1/chat/completions", p.base),
                key.clone(),
                j.body["request"].clone(),
                chunks.clone(),
            ))
        })
        .collect();
    while chunks.load(Ordering::Relaxed) < (jobs.len() * MAX_TOKENS / 8) as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    victim.signal(9);
    let mut ids = Vec::new();
    for (client, reference) in clients.into_iter().zip(&want) {
        let (id, got) = client.await.unwrap();
        ids.push(id);
        let expected: String = reference
            .iter()
            .filter_map(|e| match e {
                tidal_queue::ResponseEvent::Delta { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            got, expected,
            "a client saw a different stream than the undisturbed run"
        );
    }
    wait_settled(&*p.queue.broker).await;
    let usage = usage_events(&*p.queue.broker).await;
    let mut per_request: HashMap<uuid::Uuid, (u64, u64, usize)> = HashMap::new();
    for u in &usage {
        let e = per_request.entry(u.request_id).or_default();
        e.0 += u.prompt_tokens;
        e.1 += u.completion_tokens;
        e.2 += 1;
    }
    assert_eq!(per_request.len(), jobs.len());
    for (id, reference) in ids.iter().zip(&want) {
        let Some(tidal_queue::ResponseEvent::Done { usage: u, .. }) = reference.last() else {
            panic!("reference run did not finish");
        };
        let (prompt, completion, _) = per_request[id];
        assert_eq!(prompt, u.prompt_tokens, "the prompt is billed exactly once");
        assert_eq!(
            completion, MAX_TOKENS as u64,
            "every delivered token is billed once"
        );
    }
    assert!(
        per_request.values().any(|&(_, _, segments)| segments > 1),
        "nothing was taken over:\n{}",
        survivor.log_text()
    );
}
