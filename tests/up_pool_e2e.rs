//! `tidal up --pool-memory` with two models: one pool worker starts for the first request,
//! loads each model when a request for it arrives, answers both, and the pool goes back to
//! zero once both models are idle.

mod process;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use process::{default_model, free_port, KillOnDrop as Up};
use serde_json::{json, Value};

const MODELS: [&str; 2] = ["alpha", "beta"];

async fn status(client: &reqwest::Client, base: &str, admin: &str) -> Option<Value> {
    let r = client
        .get(format!("{base}/local/status"))
        .bearer_auth(admin)
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(())?;
    r.json().await.ok()
}

/// The completion tokens of a greedy chat request to `model`.
async fn chat(client: &reqwest::Client, base: &str, key: &str, model: &str) -> u64 {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": "Name one sea."}],
            "max_tokens": 6,
            "temperature": 0.0
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{model}: {:?}", r.text().await);
    let body: Value = r.json().await.unwrap();
    body["usage"]["completion_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn one_pool_worker_serves_two_models_and_the_pool_returns_to_zero() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log_path = dir.path().join("up.log");
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidal"));
    command
        .arg("up")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--pool-memory", "2GiB", "--pool-idle-unload-after", "2s"])
        .args(["--scale-to-zero-after", "3s", "--kv-cache-memory", "64MiB"])
        .args(["--drain-timeout", "5s", "--threads", "1"]);
    for name in MODELS {
        command
            .arg("--model")
            .arg(format!("{name}={}", model.display()));
    }
    let mut up = Up(command
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap());
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let creds: Value = loop {
        if let Ok(bytes) = std::fs::read(dir.path().join("data/credentials.json")) {
            if let Ok(v) = serde_json::from_slice(&bytes) {
                break v;
            }
        }
        assert!(
            up.0.try_wait().unwrap().is_none(),
            "tidal up exited:\n{}",
            logs()
        );
        assert!(Instant::now() < deadline, "no credentials:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let key = creds["api_key"].as_str().unwrap().to_owned();
    let admin = creds["admin_token"].as_str().unwrap().to_owned();
    while status(&client, &base, &admin).await.is_none() {
        assert!(Instant::now() < deadline, "no status:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    for name in MODELS {
        let t0 = Instant::now();
        assert_eq!(chat(&client, &base, &key, name).await, 6, "{}", logs());
        eprintln!(
            "up-pool: {name} answered in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
    }
    // one pool worker did it all
    let text = logs();
    assert_eq!(text.matches("starting worker").count(), 1, "{text}");

    // idle: both models unload, then the pool goes to zero
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(&client, &base, &admin).await.unwrap_or_default();
        let models = s["models"].as_array().cloned().unwrap_or_default();
        let idle = models.len() == MODELS.len()
            && models
                .iter()
                .all(|m| m["state"] == "scaled_to_zero" && m["ready"] == 0);
        if idle {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never back to zero: {s}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = Command::new("kill")
        .args(["-INT", &up.0.id().to_string()])
        .status();
    let _ = up.0.wait();
}
