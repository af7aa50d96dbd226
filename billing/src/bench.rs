//! Ingest benchmark (called by `tidal bench billing`): usage events per second into the
//! ledger, batched transactions versus one transaction per event, side by side.

use std::fmt;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::error::Result;
use crate::ledger::Ledger;
use crate::price::Prices;
use crate::scratch::ScratchDb;
use crate::usage::{CapacityType, UsageRecord};

/// Events per transaction in the batched run (the consumer's default).
pub const BENCH_BATCH: usize = 1000;

/// Most events in the one-transaction-per-event run.
pub const SINGLE_CAP: usize = 10_000;

/// Result of [`bench_ingest`].
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// Events written in each run.
    pub events: usize,
    /// Events per transaction in the batched run.
    pub batch_size: usize,
    /// Batched run: seconds.
    pub batched_secs: f64,
    /// Batched run: events per second.
    pub batched_events_per_sec: f64,
    /// Replaying the batched run's events (all duplicates): events per second.
    pub replay_events_per_sec: f64,
    /// Events in the one-per-event run (`min(events, SINGLE_CAP)`: it is slow by design).
    pub single_events: usize,
    /// One transaction per event: seconds.
    pub single_secs: f64,
    /// One transaction per event: events per second.
    pub single_events_per_sec: f64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "billing ingest on {}", self.backend)?;
        writeln!(
            f,
            "  batched ({}/tx):   {:>10.0} events/s ({} events, {:.2} s)",
            self.batch_size, self.batched_events_per_sec, self.events, self.batched_secs
        )?;
        writeln!(
            f,
            "  replay (all dups):   {:>10.0} events/s",
            self.replay_events_per_sec
        )?;
        write!(
            f,
            "  one per event:       {:>10.0} events/s ({} events, {:.2} s)",
            self.single_events_per_sec, self.single_events, self.single_secs
        )
    }
}

/// `n` distinct synthetic events spread over 20 tenants, 3 models and one day.
pub fn synthetic_events(tag: &str, n: usize, start: DateTime<Utc>) -> Vec<UsageRecord> {
    (0..n)
        .map(|i| {
            let at = start + Duration::milliseconds(i as i64);
            UsageRecord {
                request_id: format!("{tag}-{:08}", i / 2),
                segment: (i % 2) as u32,
                tenant: format!("tenant-{}", i % 20),
                model: format!("model-{}", i % 3),
                prompt_tokens: 100 + (i % 900) as u64,
                cached_prompt_tokens: (i % 100) as u64,
                completion_tokens: 1 + (i % 500) as u64,
                worker: format!("worker-{}", i % 8),
                capacity: if i % 4 == 0 {
                    CapacityType::OnDemand
                } else {
                    CapacityType::Spot
                },
                started_at: at,
                ended_at: at,
                last: false,
            }
        })
        .collect()
}

/// Measures ingest into a scratch database on the server of `url` (`postgres://...`; the
/// database part is ignored) or into a temporary SQLite file (`sqlite:...`), then drops it.
pub async fn bench_ingest(url: &str, n: usize) -> Result<BenchReport> {
    bench_ingest_with(url, n, BENCH_BATCH).await
}

/// [`bench_ingest`] with another batch size (events per transaction).
pub async fn bench_ingest_with(url: &str, n: usize, batch: usize) -> Result<BenchReport> {
    let batch = batch.max(1);
    let scratch = if url.starts_with("sqlite:") {
        ScratchDb::sqlite("bench")
    } else {
        ScratchDb::postgres(url, "bench").await?
    };
    let result = run(&scratch.url, n, batch).await;
    scratch.drop_db().await?;
    result
}

async fn run(url: &str, n: usize, batch: usize) -> Result<BenchReport> {
    let ledger = Ledger::connect(url).await?;
    let start = DateTime::from_timestamp(1_793_000_000, 0).unwrap_or_default();
    let prices = Prices {
        input_per_m: 150_000,
        cached_input_per_m: 75_000,
        output_per_m: 600_000,
    };
    for m in 0..3 {
        ledger
            .set_price(
                &format!("model-{m}"),
                start - Duration::days(1),
                prices,
                start,
            )
            .await?;
    }
    let batched = synthetic_events("batched", n, start);
    let t = Instant::now();
    for chunk in batched.chunks(batch) {
        ledger.record_batch(chunk).await?;
    }
    let batched_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    for chunk in batched.chunks(batch) {
        ledger.record_batch(chunk).await?;
    }
    let replay_secs = t.elapsed().as_secs_f64();

    let single_n = n.min(SINGLE_CAP);
    let single = synthetic_events("single", single_n, start);
    let t = Instant::now();
    for e in &single {
        ledger.record_batch(std::slice::from_ref(e)).await?;
    }
    let single_secs = t.elapsed().as_secs_f64();
    ledger.close().await;

    let rate = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    Ok(BenchReport {
        backend: format!("{:?}", ledger.backend_kind()).to_lowercase(),
        events: n,
        batch_size: batch,
        batched_secs,
        batched_events_per_sec: rate(n, batched_secs),
        replay_events_per_sec: rate(n, replay_secs),
        single_events: single_n,
        single_secs,
        single_events_per_sec: rate(single_n, single_secs),
    })
}
