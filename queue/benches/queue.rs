//! `cargo bench -p tidal-queue --bench queue`: protocol round trip (enqueue → claim → deltas
//! → done → ack → client sees done) on the in-process broker and on Redis
//! (`TIDAL_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`; skipped if unreachable).
//! `TIDAL_BENCH_REQUESTS` (default 5000), `TIDAL_BENCH_CLIENTS` (64, closed loop),
//! `TIDAL_BENCH_RATE` (open loop, requests/s; unset: closed loop), `TIDAL_BENCH_WORKERS` (2),
//! `TIDAL_BENCH_BATCH` (32 jobs per worker at once), `TIDAL_BENCH_DELTAS` (4) shape the load.

use std::sync::Arc;

use tidal_queue::bench::{round_trip, BenchOptions, BenchReport};
use tidal_queue::{Broker, BrokerConfig, MemoryBroker, RedisBroker};
use uuid::Uuid;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn print(name: &str, o: &BenchOptions, r: &BenchReport) {
    println!(
        "{name}: {} requests, {}, {} workers x {} batch, {} deltas: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        r.requests,
        match o.rate_per_s {
            Some(rate) => format!("open loop at {rate} req/s"),
            None => format!("{} closed-loop clients", o.clients),
        },
        o.workers,
        o.batch,
        o.deltas,
        r.requests_per_s,
        r.p50.as_secs_f64() * 1e3,
        r.p99.as_secs_f64() * 1e3,
        r.max.as_secs_f64() * 1e3
    );
}

/// Deletes the run's keys (start gates, usage stream): only keys under its own prefix.
async fn delete_prefix(url: &str, prefix: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .expect("scan");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut c)
                .await
                .expect("del");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a tiny load.
    let quick = !std::env::args().any(|a| a == "--bench");
    let opts = BenchOptions {
        model: format!("bench-{}", Uuid::now_v7()),
        requests: if quick {
            20
        } else {
            env("TIDAL_BENCH_REQUESTS", 5000)
        },
        clients: env("TIDAL_BENCH_CLIENTS", 64),
        rate_per_s: std::env::var("TIDAL_BENCH_RATE")
            .ok()
            .and_then(|v| v.parse().ok()),
        workers: env("TIDAL_BENCH_WORKERS", 2),
        batch: env("TIDAL_BENCH_BATCH", 32),
        deltas: env("TIDAL_BENCH_DELTAS", 4) as u64,
    };
    let memory: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let r = round_trip(memory, opts.clone()).await.expect("memory run");
    print("memory", &opts, &r);

    let url =
        std::env::var("TIDAL_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("tidal-bench-{}:", Uuid::now_v7());
    let config = BrokerConfig {
        prefix: prefix.clone(),
        ..BrokerConfig::default()
    };
    match RedisBroker::connect(&url, config).await {
        Ok(b) => {
            let b: Arc<dyn Broker> = Arc::new(b);
            let r = round_trip(b.clone(), opts.clone()).await;
            delete_prefix(&url, &prefix).await;
            print("redis", &opts, &r.expect("redis run"));
        }
        Err(e) => println!("redis: skipped ({e})"),
    }
}
