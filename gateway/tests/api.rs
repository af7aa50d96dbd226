//! The gateway's HTTP API over the in-process broker, a scratch SQLite ledger and a fake
//! worker: OpenAI bodies and SSE, the request lifecycle (max queue wait, backlog cap,
//! disconnects, reattaching), and the documented 4xx for every bad input.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tidal_billing::ledger::RateLimits;
use tidal_queue::{ResponseEvent, Usage};
use uuid::Uuid;

fn request_id(resp: &reqwest::Response) -> Uuid {
    let id = Uuid::parse_str(resp.headers()["x-request-id"].to_str().unwrap()).unwrap();
    assert_eq!(id.get_version_num(), 7, "request ids are UUIDv7");
    id
}

#[tokio::test]
async fn chat_non_streaming() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let resp = h
        .post(
            "/v1/chat/completions",
            Some(&h.key),
            &chat("hello tidal world", false),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["id"], format!("chatcmpl-{}", id.simple()));
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "hello tidal world"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 6);
    // Delivered: the response stream and the owner record go.
    let b = h.broker.clone();
    eventually("response stream and record removed", || {
        let b = b.clone();
        async move {
            b.read_responses(id, 0, 10, Duration::ZERO)
                .await
                .unwrap()
                .is_empty()
                && b.request(id).await.unwrap().is_none()
        }
    })
    .await;
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn chat_streaming_with_usage_and_event_ids() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let resp = h
        .post("/v1/chat/completions", Some(&h.key), &chat("a b c", true))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let id = request_id(&resp);
    let events = parse_sse(&resp.text().await.unwrap());
    // role chunk, 3 deltas, finish, usage, [DONE]
    assert_eq!(events.len(), 7, "{events:?}");
    let first: Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["id"], format!("chatcmpl-{}", id.simple()));
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunk_text(&events), "a b c");
    let ids: Vec<Option<u64>> = events.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        vec![None, Some(1), Some(2), Some(3), Some(4), None, None]
    );
    let finish: Value = serde_json::from_str(&events[4].data).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage: Value = serde_json::from_str(&events[5].data).unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(events[6].data, "[DONE]");
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn completions_both_ways() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let body = json!({"model": MODEL, "prompt": "one two three", "max_tokens": 2}).to_string();
    let resp = h.post("/v1/completions", Some(&h.key), &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], "one two");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 3);

    let body = json!({"model": MODEL, "prompt": "x y", "stream": true}).to_string();
    let resp = h.post("/v1/completions", Some(&h.key), &body).await;
    assert_eq!(resp.status(), 200);
    let events = parse_sse(&resp.text().await.unwrap());
    // no role chunk for completions; no usage chunk without include_usage
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(chunk_text(&events), "x y");
    let first: Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert_eq!(events.last().unwrap().data, "[DONE]");
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn models_list_prices_and_state() {
    let h = Harness::start().await;
    let resp = h.get("/v1/models", Some(&h.key)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "list");
    let m = &v["data"][0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["object"], "model");
    assert_eq!(m["state"], "ready");
    assert_eq!(m["context_length"], 8192);
    assert_eq!(m["pricing"]["currency"], "USD");
    assert_eq!(m["pricing"]["input_per_mtok_micros"], 150_000);
    assert_eq!(m["pricing"]["cached_input_per_mtok_micros"], 75_000);
    assert_eq!(m["pricing"]["output_per_mtok_micros"], 600_000);
    error(h.get("/v1/models", None).await, 401).await;
    h.stop().await;
}

#[tokio::test]
async fn bad_keys_get_401() {
    let h = Harness::start().await;
    let body = chat("hi", false);
    let e = error(h.post("/v1/chat/completions", None, &body).await, 401).await;
    assert_eq!(e["error"]["code"], "invalid_api_key");
    assert_eq!(e["error"]["type"], "authentication_error");
    for bad in [
        "nonsense",
        "tidal_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "",
    ] {
        let r = h.post("/v1/chat/completions", Some(bad), &body).await;
        error(r, 401).await;
    }
    // A revoked key stops working at once on the gateway that revoked it.
    let w = h.worker(MODEL, 0);
    assert_eq!(
        h.post("/v1/chat/completions", Some(&h.key), &body)
            .await
            .status(),
        200
    );
    let r = h
        .admin(
            Method::DELETE,
            &format!("/v1/admin/keys/{}", h.key_id),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    error(
        h.post("/v1/chat/completions", Some(&h.key), &body).await,
        401,
    )
    .await;
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn malformed_bodies_get_400_with_the_field() {
    let h = Harness::start().await;
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), None),
        ("/v1/chat/completions", "".into(), None),
        ("/v1/chat/completions", json!({"model": MODEL}).to_string(), None),
        ("/v1/chat/completions", json!({"model": 5, "messages": []}).to_string(), None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": "hi"}).to_string(), None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": []}).to_string(), Some("messages")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}).to_string(), Some("messages[0].role")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(), None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9}).to_string(), Some("temperature")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "10"}).to_string(), None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).to_string(), Some("top_logprobs")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}).to_string(), Some("top_logprobs")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3}).to_string(), Some("n")),
        ("/v1/chat/completions", json!({"model": "", "messages": [{"role": "user", "content": "x"}]}).to_string(), Some("model")),
        ("/v1/completions", json!({"model": MODEL, "prompt": ""}).to_string(), Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": 7}).to_string(), None),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "echo": true}).to_string(), Some("echo")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "logprobs": 30}).to_string(), Some("logprobs")),
    ];
    for (path, body, param) in cases {
        let e = error(h.post(path, Some(&h.key), &body).await, 400).await;
        assert_eq!(e["error"]["type"], "invalid_request_error", "{body}");
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{body}");
        }
    }
    // Too large.
    let huge = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(17 << 20)
    );
    error(
        h.post("/v1/chat/completions", Some(&h.key), &huge).await,
        413,
    )
    .await;
    h.stop().await;
}

#[tokio::test]
async fn unknown_model_route_and_method() {
    let h = Harness::start().await;
    let body = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let e = error(
        h.post("/v1/chat/completions", Some(&h.key), &body).await,
        404,
    )
    .await;
    assert_eq!(e["error"]["code"], "model_not_found");
    assert_eq!(e["error"]["param"], "model");
    let e = error(h.get("/v1/nothing", Some(&h.key)).await, 404).await;
    assert_eq!(e["error"]["code"], "unknown_url");
    let e = error(h.get("/v1/chat/completions", Some(&h.key)).await, 405).await;
    assert_eq!(e["error"]["code"], "method_not_allowed");
    h.stop().await;
}

#[tokio::test]
async fn admin_api_needs_its_token() {
    let h = Harness::start().await;
    for token in [None, Some("wrong"), Some(h.key.as_str())] {
        let r = h.admin(Method::GET, "/v1/admin/tenants", token, None).await;
        error(r, 401).await;
        let r = h
            .admin(
                Method::POST,
                "/v1/admin/tenants",
                token,
                Some(json!({"id": "x"})),
            )
            .await;
        error(r, 401).await;
    }
    // Disabled when no token is configured.
    let mut cfg = config();
    cfg.admin_token = None;
    let h2 = Harness::with(cfg, None).await;
    let r = h2
        .admin(Method::GET, "/v1/admin/tenants", Some(ADMIN), None)
        .await;
    error(r, 403).await;
    h2.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn admin_api_manages_tenants_keys_limits_budgets() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let r = h
        .admin(
            Method::POST,
            "/v1/admin/tenants",
            Some(ADMIN),
            Some(json!({"id": "gamma", "name": "Gamma"})),
        )
        .await;
    assert_eq!(r.status(), 201);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["id"], "gamma");
    // A duplicate id is a conflict; malformed ids, unknown fields, bad types are 400s.
    let r = h
        .admin(
            Method::POST,
            "/v1/admin/tenants",
            Some(ADMIN),
            Some(json!({"id": "gamma"})),
        )
        .await;
    assert_eq!(error(r, 409).await["error"]["code"], "conflict");
    for body in [
        json!({"id": "Bad Id"}),
        json!({"id": "x", "extra": 1}),
        json!({"id": 5}),
    ] {
        let r = h
            .admin(Method::POST, "/v1/admin/tenants", Some(ADMIN), Some(body))
            .await;
        error(r, 400).await;
    }
    let r = h
        .admin(
            Method::POST,
            "/v1/admin/tenants/gamma/keys",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(r.status(), 201);
    let key: Value = r.json().await.unwrap();
    let secret = key["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("tidal_"));
    let r = h
        .admin(
            Method::POST,
            "/v1/admin/tenants/nobody/keys",
            Some(ADMIN),
            None,
        )
        .await;
    error(r, 404).await;
    let body = chat("gamma says hi", false);
    assert_eq!(
        h.post("/v1/chat/completions", Some(&secret), &body)
            .await
            .status(),
        200
    );

    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/gamma/limits",
            Some(ADMIN),
            Some(json!({"requests_per_min": 5, "tokens_per_min": null})),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/gamma/limits",
            Some(ADMIN),
            Some(json!({"requests_per_min": 0})),
        )
        .await;
    error(r, 400).await;
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/gamma/limits",
            Some(ADMIN),
            Some(json!({"requests_per_min": -1})),
        )
        .await;
    error(r, 400).await;
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/gamma/budget",
            Some(ADMIN),
            Some(json!({"monthly_budget_micros": 2_000_000})),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/gamma/budget",
            Some(ADMIN),
            Some(json!({"monthly_budget_micros": "lots"})),
        )
        .await;
    error(r, 400).await;
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/nobody/budget",
            Some(ADMIN),
            Some(json!({"monthly_budget_micros": 1})),
        )
        .await;
    error(r, 404).await;

    let r = h
        .admin(Method::GET, "/v1/admin/tenants/gamma", Some(ADMIN), None)
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["limits"]["requests_per_min"], 5);
    assert_eq!(v["budget"]["budget_micros"], 2_000_000);
    assert_eq!(v["keys"].as_array().unwrap().len(), 1);
    assert!(
        v["keys"][0].get("secret").is_none(),
        "secrets are never listed"
    );
    let r = h
        .admin(Method::GET, "/v1/admin/tenants", Some(ADMIN), None)
        .await;
    let v: Value = r.json().await.unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["acme", "beta", "gamma"]);
    let r = h
        .admin(
            Method::DELETE,
            "/v1/admin/keys/no-such-key",
            Some(ADMIN),
            None,
        )
        .await;
    error(r, 404).await;
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn over_request_limit_gets_429_with_retry_after() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    h.ledger
        .set_rate_limits(
            "acme",
            RateLimits {
                requests_per_min: Some(2),
                tokens_per_min: None,
            },
        )
        .await
        .unwrap();
    let body = chat("hi", false);
    for _ in 0..2 {
        assert_eq!(
            h.post("/v1/chat/completions", Some(&h.key), &body)
                .await
                .status(),
            200
        );
    }
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry), "{retry}");
    let e = error(r, 429).await;
    assert_eq!(e["error"]["code"], "rate_limit_exceeded");
    assert_eq!(e["error"]["type"], "rate_limit_error");
    // Another tenant is not affected.
    assert_eq!(
        h.post("/v1/chat/completions", Some(&h.key_b), &body)
            .await
            .status(),
        200
    );
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn over_token_limit_gets_429() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    h.ledger
        .set_rate_limits(
            "acme",
            RateLimits {
                requests_per_min: None,
                tokens_per_min: Some(10),
            },
        )
        .await
        .unwrap();
    // 6 prompt + 6 completion tokens: over 10 after this one.
    let body = chat("a b c d e f", false);
    assert_eq!(
        h.post("/v1/chat/completions", Some(&h.key), &body)
            .await
            .status(),
        200
    );
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert!(r.headers().get("retry-after").is_some());
    let e = error(r, 429).await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("tokens"),
        "{e}"
    );
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn over_budget_gets_402() {
    let h = Harness::start().await;
    h.ledger.set_budget("acme", Some(0)).await.unwrap();
    let e = error(
        h.post("/v1/chat/completions", Some(&h.key), &chat("hi", false))
            .await,
        402,
    )
    .await;
    assert_eq!(e["error"]["code"], "insufficient_quota");
    h.stop().await;
}

#[tokio::test]
async fn waits_for_a_worker_then_completes() {
    let h = Harness::start().await;
    h.put_model("cold", 10_000, 0).await;
    let body = json!({"model": "cold", "messages": [{"role": "user", "content": "late but here"}]})
        .to_string();
    let req = h.post("/v1/chat/completions", Some(&h.key), &body);
    let late = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        h.worker("cold", 0)
    };
    let (resp, w) = tokio::join!(req, late);
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "late but here");
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn past_max_queue_wait_503_and_never_runs() {
    let h = Harness::start().await;
    h.put_model("slow", 400, 0).await;
    let body = json!({"model": "slow", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let t = std::time::Instant::now();
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert!(r.headers().get("retry-after").is_some());
    let e = error(r, 503).await;
    assert_eq!(e["error"]["code"], "service_unavailable");
    // A worker that comes later finds nothing to run.
    let got = h
        .broker
        .claim("slow", "late", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(got.is_empty(), "withdrawn job was handed out: {got:?}");
    assert_eq!(h.broker.depth("slow").await.unwrap().backlog, 0);
    h.stop().await;
}

#[tokio::test]
async fn started_before_the_deadline_is_served() {
    let h = Harness::start().await;
    h.put_model("edge", 300, 0).await;
    let body = json!({"model": "edge", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let broker = h.broker.clone();
    // A worker claims at once but writes its first event only after the deadline.
    let worker = tokio::spawn(async move {
        let job = claim_one(&*broker, "edge").await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        let id = job.job.id;
        broker
            .append_response(id, &ResponseEvent::delta(1, "ok", vec![1]))
            .await
            .unwrap();
        broker
            .append_response(
                id,
                &ResponseEvent::Done {
                    seq: 2,
                    finish_reason: tidal_queue::FinishReason::Stop,
                    usage: Usage {
                        prompt_tokens: 1,
                        cached_prompt_tokens: 0,
                        completion_tokens: 1,
                    },
                },
            )
            .await
            .unwrap();
        broker.ack(&job).await.unwrap();
    });
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "ok");
    worker.await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn full_backlog_gets_503_with_retry_after() {
    let h = Harness::start().await;
    h.put_model("capped", 5_000, 1).await;
    let body =
        json!({"model": "capped", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let first = h.post("/v1/chat/completions", Some(&h.key), &body);
    let second = async {
        h.until_backlog("capped", 1).await;
        let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
        assert!(r.headers().get("retry-after").is_some());
        error(r, 503).await;
        h.worker("capped", 0)
    };
    let (r1, w) = tokio::join!(first, second);
    assert_eq!(r1.status(), 200);
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn worker_error_before_output_is_the_http_status() {
    let h = Harness::start().await;
    h.put_model("picky", 5_000, 0).await;
    let broker = h.broker.clone();
    let worker = tokio::spawn(async move {
        for _ in 0..2 {
            let job = claim_one(&*broker, "picky").await;
            broker
                .append_response(
                    job.job.id,
                    &ResponseEvent::Error {
                        seq: 1,
                        status: 400,
                        code: "context_length_exceeded".into(),
                        param: Some("messages".into()),
                        message: "too long".into(),
                    },
                )
                .await
                .unwrap();
            broker.ack(&job).await.unwrap();
        }
    });
    for stream in [false, true] {
        let body = json!({"model": "picky", "stream": stream, "messages": [{"role": "user", "content": "x"}]}).to_string();
        let e = error(
            h.post("/v1/chat/completions", Some(&h.key), &body).await,
            400,
        )
        .await;
        assert_eq!(e["error"]["code"], "context_length_exceeded");
        assert_eq!(e["error"]["param"], "messages");
    }
    worker.await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn worker_error_mid_stream_is_an_error_chunk() {
    let h = Harness::start().await;
    h.put_model("flaky", 5_000, 0).await;
    let broker = h.broker.clone();
    let worker = tokio::spawn(async move {
        let job = claim_one(&*broker, "flaky").await;
        let id = job.job.id;
        broker
            .append_response(id, &ResponseEvent::delta(1, "par", vec![1]))
            .await
            .unwrap();
        broker
            .append_response(
                id,
                &ResponseEvent::Error {
                    seq: 2,
                    status: 500,
                    code: "engine_failure".into(),
                    param: None,
                    message: "boom".into(),
                },
            )
            .await
            .unwrap();
        broker.ack(&job).await.unwrap();
    });
    let body =
        json!({"model": "flaky", "stream": true, "messages": [{"role": "user", "content": "x"}]})
            .to_string();
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await.unwrap());
    assert_eq!(chunk_text(&events), "par");
    let err: Value = serde_json::from_str(&events[events.len() - 2].data).unwrap();
    assert_eq!(err["error"]["code"], "engine_failure");
    assert_eq!(events[events.len() - 2].id, Some(2));
    assert_eq!(events.last().unwrap().data, "[DONE]");
    worker.await.unwrap();
    h.stop().await;
}

/// The queue loses a running request (its data gone: record and response stream, as when
/// Redis restarts without persistence) while its worker is stalled: the client is told
/// within seconds with `request_lost` (an error chunk, then `[DONE]`), not left hanging.
#[tokio::test]
async fn a_request_the_queue_lost_gets_request_lost() {
    let h = Harness::start().await;
    h.put_model("lossy", 30_000, 0).await;
    let broker = h.broker.clone();
    let worker = tokio::spawn(async move {
        let job = claim_one(&*broker, "lossy").await;
        for seq in 1..=2u64 {
            broker
                .append_response(
                    job.job.id,
                    &ResponseEvent::delta(seq, "x", vec![seq as u32]),
                )
                .await
                .unwrap();
        }
        job
    });
    let body =
        json!({"model": "lossy", "stream": true, "messages": [{"role": "user", "content": "x"}]})
            .to_string();
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert_eq!(r.status(), 200);
    // the role chunk and both deltas
    let (events, mut rest) = read_events(r, 3).await;
    assert_eq!(chunk_text(&events), "xx");
    let job = worker.await.unwrap();
    // The broker loses the request while its worker is stalled.
    let t = std::time::Instant::now();
    assert!(h.broker.forget_request(job.job.id).await.unwrap());
    let mut text = String::new();
    let read_all = async {
        while let Some(chunk) = rest.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read_all)
        .await
        .expect("the client is told, not left hanging");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let events = parse_sse(&text);
    let err: Value = serde_json::from_str(&events[events.len() - 2].data).unwrap();
    assert_eq!(err["error"]["code"], "request_lost", "{err}");
    assert_eq!(events.last().unwrap().data, "[DONE]");

    // Lost while queued: a plain request gets the 503 itself.
    let body =
        json!({"model": "lossy", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let client = {
        let (http, url, key) = (
            h.http.clone(),
            format!("{}/v1/chat/completions", h.base),
            h.key.clone(),
        );
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
        })
    };
    h.until_backlog("lossy", 1).await;
    let job = claim_one(&*h.broker, "lossy").await;
    h.broker.forget_request(job.job.id).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(15), client)
        .await
        .expect("the client is told, not left hanging")
        .unwrap();
    assert!(r.headers().get("retry-after").is_some());
    let e = error(r, 503).await;
    assert_eq!(e["error"]["code"], "request_lost");
    h.stop().await;
}

/// Silence alone is no loss: a worker slower than the check interval, and a request whose
/// record went with a cancel (another reader's client left) while its worker is yet to end
/// it, are served to the end as usual.
#[tokio::test]
async fn a_silent_request_that_was_not_lost_is_served() {
    let h = Harness::start().await;
    h.put_model("pensive", 30_000, 0).await;
    let broker = h.broker.clone();
    let worker = tokio::spawn(async move {
        // First request: 3 s between its tokens.
        let job = claim_one(&*broker, "pensive").await;
        let id = job.job.id;
        broker
            .append_response(id, &ResponseEvent::delta(1, "a", vec![1]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        broker
            .append_response(id, &ResponseEvent::delta(2, "b", vec![2]))
            .await
            .unwrap();
        let done = ResponseEvent::Done {
            seq: 3,
            finish_reason: tidal_queue::FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 1,
                cached_prompt_tokens: 0,
                completion_tokens: 2,
            },
        };
        broker.append_response(id, &done).await.unwrap();
        broker.ack(&job).await.unwrap();
        // Second request: cancelled by another reader; its worker ends it 3 s later.
        let job = claim_one(&*broker, "pensive").await;
        let id = job.job.id;
        broker
            .append_response(id, &ResponseEvent::delta(1, "a", vec![1]))
            .await
            .unwrap();
        broker.cancel(id, 1).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let cancelled = ResponseEvent::Error {
            seq: 2,
            status: 499,
            code: "cancelled".into(),
            param: None,
            message: "the request was cancelled".into(),
        };
        broker.append_response(id, &cancelled).await.unwrap();
        broker.ack(&job).await.unwrap();
    });
    let body =
        json!({"model": "pensive", "stream": true, "messages": [{"role": "user", "content": "x"}]})
            .to_string();
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await.unwrap());
    assert_eq!(chunk_text(&events), "ab", "{events:?}");
    let finish: Value = serde_json::from_str(&events[events.len() - 2].data).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop", "{events:?}");
    let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await.unwrap());
    let err: Value = serde_json::from_str(&events[events.len() - 2].data).unwrap();
    assert_eq!(err["error"]["code"], "cancelled", "{events:?}");
    worker.await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn streaming_client_disconnect_cancels_the_job() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 100);
    let words: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
    let r = h
        .post(
            "/v1/chat/completions",
            Some(&h.key),
            &chat(&words.join(" "), true),
        )
        .await;
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let (events, stream) = read_events(r, 3).await;
    assert_eq!(chunk_text(&events), "w0 w1");
    drop(stream);
    let b = h.broker.clone();
    eventually("cancel flag set", || {
        let b = b.clone();
        async move { b.is_cancelled(id).await.unwrap() }
    })
    .await;
    eventually("record forgotten", || {
        let b = b.clone();
        async move { b.request(id).await.unwrap().is_none() }
    })
    .await;
    // The worker bills the prompt and one token per word the client was handed: at least
    // the two it read, none it was not.
    w.stop().await;
    let handed = h.broker.cancelled(&[id]).await.unwrap()[0].unwrap();
    assert!(handed >= 2, "{handed}");
    let usage = tidal_queue::testing::drain_usage(&*h.broker).await;
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!((usage[0].request_id, usage[0].prompt_tokens), (id, 50));
    assert_eq!(usage[0].completion_tokens, handed);
    h.stop().await;
}

/// A client that goes away is billed for what it was handed, no more: the cancel carries
/// the seq of the last event the gateway relayed to it (none for a whole-body answer, sent
/// only at the end), the record goes, and the response stream stays so that the worker can
/// end it and bill from it.
#[tokio::test]
async fn a_cancel_carries_the_last_seq_handed_to_the_client() {
    let h = Harness::start().await;
    h.put_model("manual", 30_000, 0).await;
    for stream in [true, false] {
        let body = json!({"model": "manual", "stream": stream,
            "messages": [{"role": "user", "content": "x"}]})
        .to_string();
        let client = {
            let (http, url, key) = (
                h.http.clone(),
                format!("{}/v1/chat/completions", h.base),
                h.key.clone(),
            );
            tokio::spawn(async move {
                let req = http
                    .post(url)
                    .bearer_auth(key)
                    .header("content-type", "application/json")
                    .body(body);
                if stream {
                    let r = req.send().await.unwrap();
                    // the role chunk, then the three deltas
                    let (events, open) = read_events(r, 4).await;
                    assert_eq!(chunk_text(&events), "abc");
                    drop(open);
                } else {
                    // Gives up while the answer is still being generated.
                    let r = req.timeout(Duration::from_secs(2)).send().await;
                    assert!(r.is_err(), "the client gave up");
                }
            })
        };
        let job = claim_one(&*h.broker, "manual").await;
        let id = job.job.id;
        for (seq, piece) in (1..).zip(["a", "b", "c"]) {
            h.broker
                .append_response(id, &ResponseEvent::delta(seq, piece, vec![seq as u32]))
                .await
                .unwrap();
        }
        client.await.unwrap();
        let b = h.broker.clone();
        eventually("cancel flag set", || {
            let b = b.clone();
            async move { b.is_cancelled(id).await.unwrap() }
        })
        .await;
        let handed = if stream { 3 } else { 0 };
        assert_eq!(h.broker.cancelled(&[id]).await.unwrap(), vec![Some(handed)]);
        assert_eq!(
            h.broker.request(id).await.unwrap(),
            None,
            "record forgotten"
        );
        let kept = h
            .broker
            .read_responses(id, 0, 10, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(kept.len(), 3, "the stream stays for the worker: {kept:?}");
        // The worker ends the stream it went on writing, and acks.
        let cancelled = ResponseEvent::Error {
            seq: 4,
            status: 499,
            code: "cancelled".into(),
            param: None,
            message: "the request was cancelled".into(),
        };
        h.broker.append_response(id, &cancelled).await.unwrap();
        h.broker.ack(&job).await.unwrap();
    }
    h.stop().await;
}

#[tokio::test]
async fn queued_client_disconnect_withdraws_the_job() {
    let h = Harness::start().await;
    h.put_model("idle", 30_000, 0).await;
    let body = json!({"model": "idle", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let r = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .bearer_auth(&h.key)
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    h.until_backlog("idle", 0).await; // withdrawn
    let got = h
        .broker
        .claim("idle", "late", 10, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(got.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn queued_requests_get_their_id_when_the_gateway_stops() {
    let h = Harness::start().await;
    h.put_model("cold", 60_000, 0).await;
    let body = |stream: bool| {
        json!({"model": "cold", "messages": [{"role": "user", "content": "still here"}], "stream": stream})
            .to_string()
    };
    let (plain, streamed) = (body(false), body(true));
    let detach = async {
        h.until_backlog("cold", 2).await;
        h.gateway.detach_in_flight();
    };
    let (plain, streamed, ()) = tokio::join!(
        h.post("/v1/chat/completions", Some(&h.key), &plain),
        h.post("/v1/chat/completions", Some(&h.key), &streamed),
        detach
    );
    // The plain request: 503 + Retry-After with its id; the stream: its id and one error chunk.
    let plain_id = request_id(&plain);
    assert!(plain.headers().get("retry-after").is_some());
    let e = error(plain, 503).await;
    assert_eq!(e["error"]["code"], "gateway_restarting");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("/v1/requests/{plain_id}/events")),
        "{msg}"
    );
    assert_eq!(streamed.status(), 200);
    let stream_id = request_id(&streamed);
    let events = parse_sse(&streamed.text().await.unwrap());
    assert_eq!(events.len(), 1, "one error chunk, no [DONE]: {events:?}");
    assert_eq!(events[0].id, None, "a reattach starts from the beginning");
    let chunk: Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(chunk["error"]["code"], "gateway_restarting");
    // Neither job was withdrawn or cancelled.
    assert_eq!(h.broker.depth("cold").await.unwrap().backlog, 2);
    for id in [plain_id, stream_id] {
        assert!(!h.broker.is_cancelled(id).await.unwrap());
    }
    // A worker comes; both clients read their whole answers through a new gateway.
    let w = h.worker("cold", 0);
    let (base2, server2) = h.second_gateway().await;
    for id in [plain_id, stream_id] {
        let r = h
            .http
            .get(format!("{base2}/v1/requests/{id}/events"))
            .bearer_auth(&h.key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let events = parse_sse(&r.text().await.unwrap());
        assert_eq!(chunk_text(&events), "still here");
        assert_eq!(events.last().unwrap().data, "[DONE]");
    }
    server2.abort();
    w.stop().await;
    h.stop().await;
}

/// The pieces the fake worker streams for `text` (`"w0"`, `" w1"`, ...).
fn pieces(text: &str) -> Vec<String> {
    text.split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_owned()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

/// Legacy completions' `text_offset` of `pieces` when `before` bytes preceded them.
fn offsets(pieces: &[String], before: usize) -> Vec<usize> {
    pieces
        .iter()
        .scan(before, |at, p| {
            let this = *at;
            *at += p.len();
            Some(this)
        })
        .collect()
}

fn logprob_values(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| f64::from(tidal_gateway::fake_worker::fake_logprob(i)))
        .collect()
}

#[tokio::test]
async fn logprobs_reach_the_client_in_each_endpoints_shape() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let text = "alpha beta gamma delta";
    let want = pieces(text);
    let f32s = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| f64::from(x.as_f64().unwrap() as f32))
            .collect()
    };
    for stream in [false, true] {
        // Chat: one entry per token, with its bytes.
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "logprobs": true, "top_logprobs": 0, "stream": stream}).to_string();
        let r = h.post("/v1/chat/completions", Some(&h.key), &body).await;
        assert_eq!(r.status(), 200);
        let entries: Vec<Value> = if stream {
            let events = parse_sse(&r.text().await.unwrap());
            let chunks: Vec<Value> = events
                .iter()
                .filter(|e| e.data != "[DONE]")
                .map(|e| serde_json::from_str(&e.data).unwrap())
                .collect();
            for c in &chunks {
                let delta = &c["choices"][0]["delta"];
                if delta["content"].as_str().is_some_and(|t| !t.is_empty()) {
                    let lp = c["choices"][0]["logprobs"]["content"].as_array().unwrap();
                    assert_eq!(lp.len(), 1, "each text chunk carries its token: {c}");
                    assert_eq!(lp[0]["token"], delta["content"]);
                }
            }
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
                .flatten()
                .cloned()
                .collect()
        } else {
            let v: Value = r.json().await.unwrap();
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap()
                .clone()
        };
        let tokens: Vec<&str> = entries
            .iter()
            .map(|e| e["token"].as_str().unwrap())
            .collect();
        assert_eq!(tokens, want, "stream {stream}");
        let lps: Vec<f64> = entries
            .iter()
            .map(|e| f64::from(e["logprob"].as_f64().unwrap() as f32))
            .collect();
        assert_eq!(lps, logprob_values(want.len()));
        assert_eq!(entries[1]["bytes"], json!(b" beta".to_vec()));
        assert_eq!(entries[1]["top_logprobs"], json!([]));

        // Legacy completions: parallel arrays, offsets over the text.
        let body =
            json!({"model": MODEL, "prompt": text, "logprobs": 0, "stream": stream}).to_string();
        let r = h.post("/v1/completions", Some(&h.key), &body).await;
        assert_eq!(r.status(), 200);
        let (mut tokens, mut values, mut at) = (vec![], vec![], vec![]);
        let lp_objects: Vec<Value> = if stream {
            parse_sse(&r.text().await.unwrap())
                .iter()
                .filter(|e| e.data != "[DONE]")
                .map(|e| serde_json::from_str::<Value>(&e.data).unwrap())
                .filter(|c| {
                    c["choices"][0]["text"]
                        .as_str()
                        .is_some_and(|t| !t.is_empty())
                })
                .map(|c| c["choices"][0]["logprobs"].clone())
                .collect()
        } else {
            let v: Value = r.json().await.unwrap();
            vec![v["choices"][0]["logprobs"].clone()]
        };
        for lp in &lp_objects {
            for t in lp["tokens"].as_array().unwrap() {
                tokens.push(t.as_str().unwrap().to_owned());
            }
            values.extend(f32s(&lp["token_logprobs"]));
            at.extend(
                lp["text_offset"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize),
            );
            assert_eq!(
                lp["top_logprobs"].as_array().unwrap().len(),
                lp["tokens"].as_array().unwrap().len()
            );
        }
        assert_eq!(tokens, want, "stream {stream}");
        assert_eq!(values, logprob_values(want.len()));
        assert_eq!(at, offsets(&want, 0));
    }
    // Not asked, not sent.
    let r = h
        .post("/v1/chat/completions", Some(&h.key), &chat(text, false))
        .await;
    let v: Value = r.json().await.unwrap();
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
    w.stop().await;
    h.stop().await;
}

/// A streaming request whose first `n` events were read when its gateway stopped (nothing
/// cancelled), and a second gateway to reattach through: (request id, the events seen, the
/// last event id seen, the second gateway's URL and server task).
async fn stopped_mid_stream(
    h: &Harness,
    path: &str,
    body: &str,
    n: usize,
) -> (Uuid, Vec<Sse>, u64, String, tokio::task::JoinHandle<()>) {
    let r = h.post(path, Some(&h.key), body).await;
    let id = request_id(&r);
    let (mut events, stream) = read_events(r, n).await;
    events.truncate(n);
    let last_id = events.iter().filter_map(|e| e.id).max().unwrap();
    h.gateway.detach_in_flight();
    drop(stream);
    let (base2, server2) = h.second_gateway().await;
    (id, events, last_id, base2, server2)
}

/// `GET {base}/v1/requests/{id}/events` as the owner, after event `last_id`.
async fn reattach(h: &Harness, base: &str, id: Uuid, last_id: u64) -> reqwest::Response {
    h.http
        .get(format!("{base}/v1/requests/{id}/events"))
        .bearer_auth(&h.key)
        .header("last-event-id", last_id.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn reattached_completion_logprobs_go_on_at_the_right_offset() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 60);
    let words: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    let text = words.join(" ");
    let body = json!({"model": MODEL, "prompt": text, "logprobs": 1, "stream": true}).to_string();
    let (id, _, last_id, base2, server2) =
        stopped_mid_stream(&h, "/v1/completions", &body, 3).await;
    let r = reattach(&h, &base2, id, last_id).await;
    assert_eq!(r.status(), 200);
    let rest: Vec<Value> = parse_sse(&r.text().await.unwrap())
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(&e.data).unwrap())
        .filter(|c| {
            c["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .collect();
    let all = pieces(&text);
    let seen = usize::try_from(last_id).unwrap();
    let at: Vec<usize> = rest
        .iter()
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .unwrap()
                .clone()
        })
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let before: usize = all[..seen].iter().map(String::len).sum();
    assert_eq!(at, offsets(&all[seen..], before), "{rest:?}");
    server2.abort();
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn reattach_after_a_gateway_restart() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 60);
    let words: Vec<String> = (0..12).map(|i| format!("w{i}")).collect();
    let expected = words.join(" ");
    // The first gateway goes away without cancelling; a second one over the same broker and
    // ledger takes over.
    let (id, events, last_id, base2, server2) =
        stopped_mid_stream(&h, "/v1/chat/completions", &chat(&expected, true), 4).await;
    let seen = chunk_text(&events);
    let url = format!("{base2}/v1/requests/{id}/events");
    // Another tenant, a malformed id and an unknown id: 404.
    let r = h.http.get(&url).bearer_auth(&h.key_b).send().await.unwrap();
    let e = error(r, 404).await;
    assert_eq!(e["error"]["code"], "request_not_found");
    let r = h
        .http
        .get(format!("{base2}/v1/requests/nope/events"))
        .bearer_auth(&h.key)
        .send()
        .await
        .unwrap();
    error(r, 404).await;
    let r = h
        .http
        .get(format!("{base2}/v1/requests/{}/events", Uuid::now_v7()))
        .bearer_auth(&h.key)
        .send()
        .await
        .unwrap();
    error(r, 404).await;
    let r = h
        .http
        .get(&url)
        .bearer_auth(&h.key)
        .header("last-event-id", "x")
        .send()
        .await
        .unwrap();
    error(r, 400).await;
    let r = h.http.get(&url).send().await.unwrap();
    error(r, 401).await;
    // The owner resumes after the last event it saw.
    let r = reattach(&h, &base2, id, last_id).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-request-id"].to_str().unwrap(),
        id.to_string()
    );
    let rest = parse_sse(&r.text().await.unwrap());
    let ids: Vec<u64> = rest.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids.first(), Some(&(last_id + 1)), "no event twice: {ids:?}");
    assert_eq!(format!("{seen}{}", chunk_text(&rest)), expected);
    let usage: Value = serde_json::from_str(&rest[rest.len() - 2].data).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert_eq!(rest.last().unwrap().data, "[DONE]");
    // Delivered: gone.
    let b = h.broker.clone();
    eventually("record forgotten", || {
        let b = b.clone();
        async move { b.request(id).await.unwrap().is_none() }
    })
    .await;
    let r = h.http.get(&url).bearer_auth(&h.key).send().await.unwrap();
    error(r, 404).await;
    server2.abort();
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn every_route_is_served_and_documented() {
    let h = Harness::start().await;
    let doc: Value = h.get("/openapi.json", None).await.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let table = tidal_gateway::route_table();
    for (path, method) in &table {
        let op = &paths
            .get(*path)
            .unwrap_or_else(|| panic!("{path} missing from openapi.json"))
            [method.as_str().to_lowercase()];
        assert!(op.is_object(), "{method} {path} missing from openapi.json");
        assert!(
            op["responses"].is_object(),
            "{method} {path} has no responses"
        );
        // And the router serves it (not the unknown-route or wrong-method fallback).
        let concrete = path
            .replace("{id}", &Uuid::now_v7().to_string())
            .replace("{tenant}", "acme")
            .replace("{key_id}", "k");
        let r = h
            .http
            .request(method.clone(), format!("{}{concrete}", h.base))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert!(
            status != 405 && !body.contains("unknown_url"),
            "{method} {path}: {status} {body}"
        );
    }
    // Nothing documented that is not served.
    for (path, ops) in paths {
        for method in ops
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "parameters")
        {
            assert!(
                table
                    .iter()
                    .any(|(p, m)| p == path && m.as_str().eq_ignore_ascii_case(method)),
                "{method} {path} documented but not routed"
            );
        }
    }
    h.stop().await;
}

#[tokio::test]
async fn health_and_metrics() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    assert_eq!(h.get("/health", None).await.status(), 200);
    assert_eq!(
        h.post("/v1/chat/completions", Some(&h.key), &chat("m", false))
            .await
            .status(),
        200
    );
    error(
        h.post("/v1/chat/completions", None, &chat("m", false))
            .await,
        401,
    )
    .await;
    let text = h.get("/metrics", None).await.text().await.unwrap();
    for name in [
        "tidal_gateway_requests_total",
        "tidal_gateway_request_duration_seconds",
        "tidal_gateway_queue_wait_seconds",
        "tidal_gateway_errors_total",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(text.contains("code=\"invalid_api_key\""), "errors by code");
    w.stop().await;
    h.stop().await;
}
