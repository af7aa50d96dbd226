//! Log-probabilities through the pay-per-token path equal the direct runtime's: a
//! `tidal gateway` with one `tidal runtime --queue` worker, and a `tidal runtime --listen`
//! server on the same model and settings, each sent the same greedy requests in the same
//! order (chat and legacy completions, whole and streamed). Tokens, bytes and offsets must
//! match exactly; log-probabilities to 1e-4 (both run the same kernels on one thread, so
//! they agree to the bit in practice; the margin keeps the test about plumbing, not
//! floating point).

mod platform_common;
mod process;
mod worker_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use platform_common::{key_for, platform};
use process::KillOnDrop;
use serde_json::{json, Value};
use worker_common::*;

/// A direct `tidal runtime --listen` server with the workers' engine settings.
async fn direct_runtime() -> (KillOnDrop, String) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["runtime", "--model"])
        .arg(default_model())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--model-name", MODEL_ID])
        .args(["--threads", "1", "--kv-cache-memory", "256MiB"])
        .args(["--max-num-seqs", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !reqwest::get(format!("{base}/health"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "runtime never became healthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (KillOnDrop(child), base)
}

/// The `choices[0].logprobs` of a response: the object itself, or every chunk's merged
/// (chat: `content` concatenated; completions: the parallel arrays concatenated).
async fn logprobs_of(r: reqwest::Response, stream: bool) -> Value {
    assert_eq!(r.status(), 200);
    if !stream {
        let v: Value = r.json().await.unwrap();
        return v["choices"][0]["logprobs"].clone();
    }
    let text = r.text().await.unwrap();
    let mut merged = serde_json::Map::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let Some(lp) = chunk["choices"][0]["logprobs"].as_object() else {
            continue;
        };
        for (k, v) in lp {
            let into = merged.entry(k.clone()).or_insert_with(|| json!([]));
            into.as_array_mut()
                .unwrap()
                .extend(v.as_array().unwrap().iter().cloned());
        }
    }
    Value::Object(merged)
}

/// Equal, with numbers within 1e-4.
fn assert_close(a: &Value, b: &Value, at: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-4, "{at}: {x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: lengths");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert_close(x, y, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(x), keys(y), "{at}: keys");
            for (k, v) in x {
                assert_close(v, &y[k], &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_logprobs_equal_the_direct_runtimes() {
    let p = platform("platlogprobs", 120_000).await;
    let key = key_for(&p.db, "acme");
    let worker = WorkerProcess::start(&default_model(), &p.queue, "w1", "30s", "10s");
    let (_direct, direct) = direct_runtime().await;
    wait_ready(&*p.queue.broker, &["w1"]).await;

    let client = reqwest::Client::new();
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "logprobs": true, "top_logprobs": 3}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "The capital of France is", "logprobs": 3}),
        ),
    ];
    for (path, base_body) in cases {
        for stream in [false, true] {
            let mut body = base_body.clone();
            let o = body.as_object_mut().unwrap();
            o.insert("model".into(), json!(MODEL_ID));
            o.insert("max_tokens".into(), json!(8));
            o.insert("temperature".into(), json!(0));
            o.insert("stream".into(), json!(stream));
            let via_gateway = client
                .post(format!("{}{path}", p.base))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let via_gateway = logprobs_of(via_gateway, stream).await;
            let direct_r = client
                .post(format!("{direct}{path}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let direct_lp = logprobs_of(direct_r, stream).await;
            let at = format!("{path} stream={stream}");
            assert!(
                via_gateway.as_object().is_some_and(|o| !o.is_empty()),
                "{at}: no logprobs through the gateway: {via_gateway}"
            );
            assert_close(&via_gateway, &direct_lp, &at);
            let n = via_gateway
                .get("content")
                .or_else(|| via_gateway.get("tokens"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            assert!(n >= 1, "{at}: {via_gateway}");
        }
    }
    drop(worker);
}
