//! Runs the billing ingest benchmark: `cargo run -p tidal-billing --release --example
//! bench_ingest -- [URL] [EVENTS] [BATCH]` (defaults: the local test PostgreSQL, 100,000
//! events, 1,000 events per transaction).

#[tokio::main]
async fn main() -> Result<(), tidal_billing::Error> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| tidal_billing::scratch::DEFAULT_SERVER_URL.to_string());
    let n = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let batch = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(tidal_billing::bench::BENCH_BATCH);
    let report = tidal_billing::bench::bench_ingest_with(&url, n, batch).await?;
    println!("{report}");
    Ok(())
}
