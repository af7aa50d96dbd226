//! The gateway benchmark without the rest of the `tidal` binary (same code as
//! `tidal bench gateway`): `cargo run --release -p tidal-gateway --example bench_gateway --
//! [clients] [requests] [tokens] [rate]` with Redis from `TIDAL_REDIS_URL`
//! (default `redis://127.0.0.1:6379`) and the ledger from `TIDAL_DATABASE_URL` (default: a
//! temporary SQLite file). Prints the report as JSON.

use tidal_gateway::bench::{bench_gateway, GatewayBenchOptions};

fn arg<T: std::str::FromStr>(i: usize) -> Option<T> {
    std::env::args().nth(i).and_then(|a| a.parse().ok())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = GatewayBenchOptions::default();
    let opts = GatewayBenchOptions {
        redis_url: std::env::var("TIDAL_REDIS_URL").unwrap_or(d.redis_url.clone()),
        database_url: std::env::var("TIDAL_DATABASE_URL").ok(),
        clients: arg(1).unwrap_or(d.clients),
        requests: arg(2).unwrap_or(d.requests),
        tokens: arg(3).unwrap_or(d.tokens),
        rate_per_s: arg(4),
        ..d
    };
    let report = bench_gateway(opts).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
