//! Runs the end-to-end metering benchmark on Redis: `cargo run -p tidal-billing --release
//! --example bench_stream_ingest -- [DB_URL] [REDIS_URL] [EVENTS] [BATCH]` (defaults: the
//! local test PostgreSQL, redis://127.0.0.1:6379, 100,000 events, 1,000 per transaction).
//! Uses a fresh key prefix and deletes its keys afterwards.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let db = args
        .next()
        .unwrap_or_else(|| tidal_billing::scratch::DEFAULT_SERVER_URL.to_string());
    let redis_url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    let n = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let batch = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let prefix = format!("tidal-bench:{}:", uuid::Uuid::now_v7());
    let broker = tidal_billing::queue_source::redis_broker(&redis_url, &prefix).await?;
    let report = tidal_billing::bench_stream::bench_stream_ingest(&db, broker, n, batch).await;
    let client = redis::Client::open(redis_url.as_str())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await?;
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<i64>(&mut c)
            .await?;
    }
    println!("{}", report?);
    Ok(())
}
