//! The direct HTTP server on the real default model: OpenAI shapes, SSE, errors, disconnects.

mod common;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tidal_runtime::engine::{Engine, EngineConfig};
use tidal_runtime::server::{router, LoadedModel, ServerState};

const MODEL: &str = "smollm2";

struct Server {
    base: String,
    engine: Engine,
    client: reqwest::Client,
}

async fn start() -> Server {
    let (engine, chat_template) = common::engine(EngineConfig {
        kv_cache_memory: 64 << 20,
        ..EngineConfig::default()
    });
    let state = ServerState::new(MODEL, None);
    state.set_loaded(LoadedModel {
        engine: engine.clone(),
        chat_template,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    Server {
        base: format!("http://{addr}"),
        engine,
        client: reqwest::Client::new(),
    }
}

impl Server {
    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// SSE `data:` payloads of a streamed response, in order.
    async fn stream(&self, path: &str, body: Value) -> Vec<String> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let text = resp.text().await.unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn chat(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 12})
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_openai_errors_never_5xx() {
    let s = start().await;
    let long_prompt = "word ".repeat(9000);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, None),
        ("/v1/chat/completions", r#"{"model":"smollm2","messages":"hi"}"#.into(), 400, None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": []}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({"model": "nope", "messages": [{"role":"user","content":"x"}]}).to_string(), 404, Some("model")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "max_tokens": -5}).to_string(), 400, Some("max_tokens")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "temperature": 3}).to_string(), 400, Some("temperature")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "top_p": 0}).to_string(), 400, Some("top_p")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "n": 3}).to_string(), 400, Some("n")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"user","content":"x"}], "max_tokens": 8000}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role":"wizard","content":"x"}]}).to_string(), 400, Some("messages[0].role")),
        ("/v1/completions", json!({"model": MODEL, "prompt": long_prompt, "max_tokens": 10}).to_string(), 400, Some("messages")),
        ("/v1/completions", json!({"model": MODEL, "prompt": [1, 2, 999999]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": ""}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "frequency_penalty": 9}).to_string(), 400, Some("frequency_penalty")),
        ("/v1/completions", json!({"model": MODEL}).to_string(), 400, None),
        ("/v1/nowhere", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let (got, value) = s.post(path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {value}");
        assert!(
            value["error"]["message"].is_string(),
            "{path} {body}: no OpenAI error body: {value}"
        );
        assert!(value["error"]["type"].is_string(), "{value}");
        if let Some(param) = param {
            assert_eq!(value["error"]["param"], param, "{path} {body}: {value}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_non_streaming_and_streaming_agree() {
    let s = start().await;
    let (status, full) = s
        .post("/v1/chat/completions", chat("What is 2+2?").to_string())
        .await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    let content = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &full["usage"];
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    let mut body = chat("What is 2+2?");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", body).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        streamed, content,
        "greedy stream must equal the non-streamed reply"
    );
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter(|ch| !ch["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(
        last["usage"]["completion_tokens"],
        full["usage"]["completion_tokens"]
    );
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "second identical prompt should hit the prefix cache"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn completions_with_logprobs() {
    let s = start().await;
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (status, v) = s.post("/v1/completions", body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(
        v["choices"][0]["text"].as_str().unwrap().contains("Paris"),
        "{v}"
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_frees_the_sequence() {
    let s = start().await;
    let body = json!({"model": MODEL, "prompt": "Count: 1 2 3", "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let resp = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut bytes = resp.bytes_stream();
    let first = bytes.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    // The stats snapshot is taken after the step that produced the first token.
    let mut running = false;
    for _ in 0..100 {
        if s.engine.stats().num_running == 1 {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        running,
        "the request never showed as running: {:?}",
        s.engine.stats()
    );
    drop(bytes);
    let mut freed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = s.engine.stats();
        if stats.num_running == 0 && stats.num_waiting == 0 {
            freed = true;
            break;
        }
    }
    assert!(
        freed,
        "the sequence kept running after the client left: {:?}",
        s.engine.stats()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_models() {
    let s = start().await;
    let health = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let models: Value = s
        .client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["context_length"], 8192);

    // Before the model is loaded, health says 503 and requests get an OpenAI error.
    let state = ServerState::new("loading", None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    let resp = s
        .client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let resp = s
        .client
        .post(format!("http://{addr}/v1/completions"))
        .json(&json!({"model": "loading", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
}
