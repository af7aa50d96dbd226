//! Support for tests that talk to a real Redis (this crate's and those of crates built on it):
//! the test server's URL, starting that server when it is down, and deleting a test's keys.
//! A running server is never restarted: other tests share it.

use std::process::Command;
use std::time::Duration;

/// `TIDAL_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("TIDAL_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut c) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut c)
        .await
        .is_ok()
}

/// Returns the test URL once Redis answers there, starting a local `redis-server` on 6379
/// (the same flags as `scripts/services.sh`) if nothing answers.
pub async fn ensure_redis() -> Result<String, String> {
    let url = redis_url();
    if ping(&url).await {
        return Ok(url);
    }
    let status = Command::new("redis-server")
        .args([
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ])
        .status()
        .map_err(|e| format!("cannot run redis-server: {e}"))?;
    if !status.success() {
        return Err(format!("redis-server exited with {status}"));
    }
    for _ in 0..50 {
        if ping(&url).await {
            return Ok(url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("redis at {url} did not come up"))
}

/// Deletes every key under `prefix` (never anything else: the test server is shared).
/// Synchronous, so a test can call it from `Drop` when it panics; errors are ignored.
pub fn delete_prefix(url: &str, prefix: &str) {
    let _ = scan_prefix(url, prefix, true);
}

/// Every key under `prefix`, sorted. Panics when Redis cannot be read: for tests only.
pub fn keys_under(url: &str, prefix: &str) -> Vec<String> {
    let mut keys = scan_prefix(url, prefix, false).expect("scanning the test Redis");
    keys.sort();
    keys
}

/// The keys under `prefix` (SCAN), deleting each page found when `delete`.
fn scan_prefix(url: &str, prefix: &str, delete: bool) -> redis::RedisResult<Vec<String>> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_connection()?;
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut c)?;
        if delete && !keys.is_empty() {
            redis::cmd("DEL").arg(&keys).query::<i64>(&mut c)?;
        }
        found.extend(keys);
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

/// Every usage event published so far on `broker`, read and acked as the billing consumer
/// would (consumer group `test-billing`). Panics on a broker error: for tests only.
pub async fn drain_usage(broker: &dyn crate::Broker) -> Vec<crate::UsageEvent> {
    let mut out = Vec::new();
    loop {
        let got = broker
            .read_usage("test-billing", 1000, Duration::ZERO)
            .await
            .expect("read usage");
        if got.is_empty() {
            return out;
        }
        let entries: Vec<String> = got.iter().map(|d| d.entry_id.clone()).collect();
        broker.ack_usage(&entries).await.expect("ack usage");
        out.extend(got.into_iter().map(|d| d.event));
    }
}

/// Reads request `id`'s stream as a reconnecting gateway would (from the last seq seen)
/// until its last event. Panics on a broker error or after `timeout`: for tests only.
pub async fn read_to_end(
    broker: &dyn crate::Broker,
    id: uuid::Uuid,
    timeout: Duration,
) -> Vec<crate::ResponseEvent> {
    let deadline = std::time::Instant::now() + timeout;
    let mut out: Vec<crate::ResponseEvent> = Vec::new();
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "stream {id} incomplete after {timeout:?}: {out:?}"
        );
        let after = out.last().map_or(0, crate::ResponseEvent::seq);
        let page = broker
            .read_responses(id, after, 100, Duration::from_millis(100))
            .await
            .expect("read responses");
        let end = page.iter().any(crate::ResponseEvent::is_terminal);
        out.extend(page);
        if end {
            return out;
        }
    }
}
