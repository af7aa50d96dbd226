//! `tidal gateway` as a process over real Redis and a SQLite ledger, its tenant and key made
//! with `tidal keys`, served by a fake worker (no model), driven by the official `openai`
//! Python package from PyPI: chat and completions, streaming and not, and its error types.
//! The package is installed into a venv by `scripts/python-venv.sh` when missing; the test
//! is skipped (with a message) only when pip cannot install it.

mod process;
mod skip;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use process::tidal_json as tidal;
use tidal_gateway::fake_worker::{FakeWorker, FakeWorkerConfig};
use tidal_queue::testing::ensure_redis;
use tidal_queue::{Broker, BrokerConfig, ModelRecord, ModelState, Prices, RedisBroker};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MODEL: &str = "fake-echo";

fn venv() -> Option<PathBuf> {
    let out = Command::new("bash")
        .arg(format!("{ROOT}/scripts/python-venv.sh"))
        .output()
        .ok()?;
    if !out.status.success() {
        skip::skip(&format!(
            "cannot install the openai package with pip:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
        return None;
    }
    Some(PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_against_tidal_gateway() {
    let Some(venv) = venv() else { return };
    let redis = ensure_redis().await.unwrap();
    let prefix = format!("tidal-test-oai-{}:", uuid::Uuid::now_v7().simple());
    let dir = std::env::temp_dir().join(format!("tidal-gw-oai-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("ledger.db").display());

    // Tenant and key through the CLI.
    tidal(&["keys", "--database", &db, "create-tenant", "pyco"]);
    let key = tidal(&["keys", "--database", &db, "issue", "pyco"]);
    let secret = key["secret"].as_str().unwrap().to_owned();
    tidal(&[
        "keys",
        "--database",
        &db,
        "set-limits",
        "pyco",
        "--requests-per-min",
        "1000",
    ]);
    let listed = tidal(&["keys", "--database", &db, "list"]);
    assert_eq!(listed[0]["limits"]["requests_per_min"], 1000);

    // The model record and a fake worker on the same Redis prefix.
    let broker: Arc<dyn Broker> = Arc::new(
        RedisBroker::connect(
            &redis,
            BrokerConfig {
                prefix: prefix.clone(),
                ..BrokerConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    broker
        .put_model(&ModelRecord {
            id: MODEL.into(),
            state: ModelState::Ready,
            prices: Prices {
                currency: "USD".into(),
                input_per_mtok_micros: 100_000,
                cached_input_per_mtok_micros: 50_000,
                output_per_mtok_micros: 400_000,
            },
            max_queue_wait_ms: 30_000,
            backlog_cap: 0,
            context_length: 4096,
        })
        .await
        .unwrap();
    let worker = FakeWorker::spawn(broker.clone(), FakeWorkerConfig::new(MODEL, "py-w"));

    let (gateway, base) = process::start_gateway(&redis, &prefix, &db).await;

    let out = tokio::process::Command::new(venv.join("bin/python"))
        .arg(format!("{ROOT}/scripts/openai_client_check.py"))
        .args([&base, &secret, MODEL])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all checks passed"));

    // Budget and revocation through `tidal keys` reach the running gateway (after its
    // 2 s cache).
    let http = reqwest::Client::new();
    let ask = || {
        http.post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&secret)
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}]}}"#
            ))
            .send()
    };
    tidal(&[
        "keys",
        "--database",
        &db,
        "set-budget",
        "pyco",
        "--micros",
        "0",
    ]);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(ask().await.unwrap().status(), 402);
    tidal(&[
        "keys",
        "--database",
        &db,
        "set-budget",
        "pyco",
        "--unlimited",
    ]);
    let key_id = key["key_id"].as_str().unwrap();
    let revoked = tidal(&["keys", "--database", &db, "revoke", key_id]);
    assert_eq!(revoked["revoked"], true);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(ask().await.unwrap().status(), 401);

    drop(gateway);
    worker.stop().await;
    let client = redis::Client::open(redis.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
