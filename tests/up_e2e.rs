//! `tidal up` as a newcomer runs it: one process on a free port with the real default
//! model; streaming and non-streaming requests; scale to zero after the idle time; a cold
//! start on the next request; Ctrl-C; and `tidal report` on the same ledger adds up to
//! exactly the tokens the responses reported.

mod process;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use process::{default_model, free_port, KillOnDrop as Up};
use serde_json::{json, Value};

const MODEL: &str = "smol";

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn logs(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
}

async fn status(client: &reqwest::Client, base: &str, admin: &str) -> Option<Value> {
    let r = client
        .get(format!("{base}/local/status"))
        .bearer_auth(admin)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn wait_for_state(
    client: &reqwest::Client,
    base: &str,
    admin: &str,
    state: &str,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = status(client, base, admin).await {
            // Scaled to zero counts once the drained worker has also released the model.
            if s["models"][0]["state"] == state && s["models"][0]["stopping"] == 0 {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "model never reached {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (prompt tokens, completion tokens) of a non-streaming chat request.
async fn chat(client: &reqwest::Client, base: &str, key: &str, text: &str) -> (u64, u64) {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 12,
            "temperature": 0.0
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let body: Value = r.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{body}");
    (
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        body["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

/// (prompt tokens, completion tokens) of a streaming completion with usage.
async fn streamed(client: &reqwest::Client, base: &str, key: &str) -> (u64, u64) {
    let r = client
        .post(format!("{base}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({
            "model": MODEL,
            "prompt": "The capital of France is",
            "max_tokens": 10,
            "temperature": 0.0,
            "stream": true,
            "stream_options": {"include_usage": true}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert!(text.contains("Paris"), "{text}");
    let usage = &chunks.last().unwrap()["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn tidal_up_serves_scales_to_zero_cold_starts_and_bills_exactly() {
    run_up(None).await;
}

/// The same with `--postgres` and `--redis`: a scratch database and a fresh key prefix.
#[tokio::test]
async fn tidal_up_on_postgres_and_redis_behaves_the_same() {
    let db = tidal_billing::scratch::ScratchDb::postgres(
        tidal_billing::scratch::DEFAULT_SERVER_URL,
        "up",
    )
    .await
    .expect("PostgreSQL (scripts/services.sh starts it)");
    let redis = tidal_queue::testing::ensure_redis()
        .await
        .expect("test Redis");
    let prefix = format!("tidal-up-{}:", uuid::Uuid::now_v7().simple());
    run_up(Some((db.url.clone(), redis.clone(), prefix.clone()))).await;
    tidal_queue::testing::delete_prefix(&redis, &prefix);
    db.drop_db().await.unwrap();
}

/// Runs the newcomer's path; `backends` = (PostgreSQL URL, Redis URL, key prefix) or the
/// embedded defaults.
async fn run_up(backends: Option<(String, String, String)>) {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidal"));
    command.arg("up");
    if let Some((pg, redis, prefix)) = &backends {
        command.args(["--postgres", pg, "--redis", redis, "--key-prefix", prefix]);
    }
    let spawned = Instant::now();
    let mut up = Up(command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--model")
        .arg(format!("{MODEL}={}", model.display()))
        .args([
            "--scale-to-zero-after",
            "3s",
            "--kv-cache-memory",
            "256MiB",
            "--drain-timeout",
            "5s",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap());
    let client = reqwest::Client::new();

    // The credentials file appears once the ledger is ready; the API once it listens.
    let deadline = Instant::now() + Duration::from_secs(120);
    let creds: Value = loop {
        let path = dir.path().join("data/credentials.json");
        if let Ok(bytes) = std::fs::read(&path) {
            if let Ok(v) = serde_json::from_slice(&bytes) {
                break v;
            }
        }
        assert!(
            up.0.try_wait().unwrap().is_none(),
            "tidal up exited:\n{}",
            logs(dir.path())
        );
        assert!(
            Instant::now() < deadline,
            "no credentials:\n{}",
            logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let key = creds["api_key"].as_str().unwrap().to_owned();
    let admin = creds["admin_token"].as_str().unwrap().to_owned();
    let first = wait_for_state(
        &client,
        &base,
        &admin,
        "scaled_to_zero",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(first["models"][0]["id"], MODEL);

    // Bad key: 401 with an OpenAI error body.
    let r = client
        .get(format!("{base}/v1/models"))
        .bearer_auth("tidal_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // /v1/models shows the model scaled to zero with its prices.
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL, "{models}");

    let mut prompt = 0;
    let mut completion = 0;
    let t0 = Instant::now();
    let (p, c) = chat(&client, &base, &key, "What is the capital of France?").await;
    let first_request = t0.elapsed();
    let up_to_first_response = spawned.elapsed();
    (prompt, completion) = (prompt + p, completion + c);
    let (p, c) = streamed(&client, &base, &key).await;
    (prompt, completion) = (prompt + p, completion + c);
    let rss_loaded = rss_mib(up.0.id());

    // Idle past 3 s: the worker stops and the model's memory is released.
    let zero = wait_for_state(
        &client,
        &base,
        &admin,
        "scaled_to_zero",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(zero["models"][0]["ready"], 0);
    assert_eq!(zero["models"][0]["cold_starts"], 1);
    let rss_zero = rss_mib(up.0.id());
    eprintln!("resident memory: loaded {rss_loaded:.0} MiB, scaled to zero {rss_zero:.0} MiB");
    assert!(rss_zero < rss_loaded, "unloading released no memory");

    let t1 = Instant::now();
    let (p, c) = chat(&client, &base, &key, "Name a colour.").await;
    let cold_request = t1.elapsed();
    (prompt, completion) = (prompt + p, completion + c);
    // The status is a snapshot of the fleet's last tick (every 250 ms).
    let warm = process::eventually("the second cold start", Duration::from_secs(10), || async {
        status(&client, &base, &admin)
            .await
            .filter(|s| s["models"][0]["cold_starts"] == 2)
    })
    .await;
    eprintln!(
        "tidal up to first response {up_to_first_response:?}, first request {first_request:?}, request after scale-to-zero {cold_request:?}, last cold start {} ms",
        warm["models"][0]["last_cold_start_ms"]
    );

    // `tidal status` reads the same figures.
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["status", "--url", &base])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(MODEL) && text.contains("local"), "{text}");
    // the policy's series, under the controller's names
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "tidal_autoscaler_decisions_total{",
        "tidal_autoscaler_in_flight{",
        "tidal_autoscaler_decoding{",
        "tidal_fleet_replicas{",
    ] {
        assert!(
            metrics.contains(series),
            "/metrics lacks {series}:\n{metrics}"
        );
    }

    // Ctrl-C: a clean exit, with every usage event in the ledger.
    let pid = up.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(code) = up.0.try_wait().unwrap() {
            break code;
        }
        assert!(
            Instant::now() < deadline,
            "no exit after SIGINT:\n{}",
            logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(code.success(), "exit {code:?}:\n{}", logs(dir.path()));
    let stdout = {
        use std::io::Read;
        let mut s = String::new();
        up.0.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        s
    };
    assert!(stdout.contains(&key) && stdout.contains("curl"), "{stdout}");

    let ledger = match &backends {
        Some((pg, _, _)) => pg.clone(),
        None => format!(
            "sqlite://{}",
            dir.path().join("data/ledger.sqlite").display()
        ),
    };
    let report = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["report", "--tenant", "local", "--database", &ledger])
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let totals = &report["totals"];
    let billed_prompt =
        totals["input_tokens"].as_u64().unwrap() + totals["cached_input_tokens"].as_u64().unwrap();
    assert_eq!(billed_prompt, prompt, "{report}");
    assert_eq!(
        totals["output_tokens"].as_u64().unwrap(),
        completion,
        "{report}"
    );
    assert_eq!(totals["segments"], 3, "{report}");
    assert!(report["cost_micros"].as_i64().unwrap() > 0, "{report}");
}
