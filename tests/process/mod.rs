//! What the root package's process tests share: the default model, free ports, child
//! processes that die with the test, the `tidal` CLI as JSON, and polling until a condition.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Path of the default model (fetched and verified by the project's script).
pub fn default_model() -> PathBuf {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/fetch-model.sh"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (and reaped) when the test ends, passing or not.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tidal ARGS` and parses its stdout as JSON; panics with its stderr on failure.
pub fn tidal_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tidal {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A `tidal gateway` process over Redis `redis_url` (keys under `prefix`) and ledger `db`,
/// once its `/health` answers: the process and its base URL.
pub async fn start_gateway(redis_url: &str, prefix: &str, db: &str) -> (KillOnDrop, String) {
    start_gateway_with(redis_url, prefix, db, std::process::Stdio::null()).await
}

/// [`start_gateway`] with its log (stderr) going to `log`.
pub async fn start_gateway_with(
    redis_url: &str,
    prefix: &str,
    db: &str,
    log: std::process::Stdio,
) -> (KillOnDrop, String) {
    let extra = ["--cache-ttl-ms", "200"];
    start_service("gateway", &extra, redis_url, prefix, db, log).await
}

/// A `tidal billing` process (consumer `billing-test`) over Redis `redis_url` (keys under
/// `prefix`) and ledger `db`, once its `/health` answers: the process and its base URL.
pub async fn start_billing(
    redis_url: &str,
    prefix: &str,
    db: &str,
    log: std::process::Stdio,
) -> (KillOnDrop, String) {
    let extra = ["--consumer", "billing-test"];
    start_service("billing", &extra, redis_url, prefix, db, log).await
}

/// `tidal <command> <extra>` over Redis and ledger `db` on a free port, with its stderr going
/// to `log`, once its `/health` answers: the process and its base URL.
async fn start_service(
    command: &str,
    extra: &[&str],
    redis_url: &str,
    prefix: &str,
    db: &str,
    log: std::process::Stdio,
) -> (KillOnDrop, String) {
    let port = free_port();
    let process = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args([command, "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--redis",
                redis_url,
                "--database",
                db,
                "--key-prefix",
                prefix,
            ])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let health = format!("{base}/health");
    eventually(
        &format!("tidal {command} healthy"),
        Duration::from_secs(60),
        || {
            let health = health.clone();
            async move {
                let r = reqwest::get(health).await.ok()?;
                r.status().is_success().then_some(())
            }
        },
    )
    .await;
    (process, base)
}
