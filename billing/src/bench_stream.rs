//! End-to-end metering benchmark: usage events published to the broker's stream, then
//! consumed by [`crate::consumer::run`] over a [`QueueSource`] into a scratch ledger (read,
//! batch commit, ack), timed until the stream is drained.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tidal_queue::{Broker, CapacityType, UsageEvent};
use uuid::Uuid;

use crate::consumer::{self, ConsumerConfig, ConsumerStats};
use crate::error::Result;
use crate::ledger::Ledger;
use crate::price::Prices;
use crate::queue_source::{QueueSource, QueueSourceConfig};
use crate::scratch::ScratchDb;

/// Result of [`bench_stream_ingest`].
#[derive(Debug, Clone, Serialize)]
pub struct StreamBenchReport {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// Events published and consumed.
    pub events: usize,
    /// Most events per ledger transaction.
    pub batch_size: usize,
    /// Publishing, one `publish_usage` call at a time: events per second.
    pub publish_events_per_sec: f64,
    /// Consuming until drained (includes one idle poll at the end, under 0.1 s): seconds.
    pub consume_secs: f64,
    /// Consuming: events per second.
    pub consume_events_per_sec: f64,
    /// Ledger transactions committed.
    pub batches: u64,
}

impl fmt::Display for StreamBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "billing stream ingest into {}", self.backend)?;
        writeln!(
            f,
            "  publish (1 call/event): {:>10.0} events/s",
            self.publish_events_per_sec
        )?;
        write!(
            f,
            "  consume (≤{}/tx, ack):  {:>10.0} events/s ({} events, {} batches, {:.2} s)",
            self.batch_size,
            self.consume_events_per_sec,
            self.events,
            self.batches,
            self.consume_secs
        )
    }
}

fn event(base: u128, i: usize, start_ms: u64) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::from_u128(base + (i / 2) as u128),
        segment: (i % 2) as u32,
        tenant: format!("tenant-{}", i % 20),
        model: format!("model-{}", i % 3),
        prompt_tokens: 100 + (i % 900) as u64,
        cached_prompt_tokens: (i % 100) as u64,
        completion_tokens: 1 + (i % 500) as u64,
        worker: format!("worker-{}", i % 8),
        capacity_type: if i.is_multiple_of(4) {
            CapacityType::OnDemand
        } else {
            CapacityType::Spot
        },
        started_at_ms: start_ms + i as u64,
        ended_at_ms: start_ms + i as u64,
        last: false,
    }
}

/// Publishes `n` events to `broker`'s usage stream (which should be empty) and consumes
/// them into a scratch database on the server of `db_url` (`postgres://...`) or a temporary
/// SQLite file (`sqlite:...`), `batch` events per transaction at most; drops the database.
pub async fn bench_stream_ingest(
    db_url: &str,
    broker: Arc<dyn Broker>,
    n: usize,
    batch: usize,
) -> Result<StreamBenchReport> {
    let scratch = if db_url.starts_with("sqlite:") {
        ScratchDb::sqlite("bench_stream")
    } else {
        ScratchDb::postgres(db_url, "bench_stream").await?
    };
    let result = run(&scratch.url, broker, n, batch.max(1)).await;
    scratch.drop_db().await?;
    result
}

async fn run(
    url: &str,
    broker: Arc<dyn Broker>,
    n: usize,
    batch: usize,
) -> Result<StreamBenchReport> {
    let ledger = Ledger::connect(url).await?;
    let start_ms: u64 = 1_793_000_000_000;
    let start = chrono::DateTime::from_timestamp_millis(start_ms as i64).unwrap_or_default();
    for m in 0..3 {
        ledger
            .set_price(
                &format!("model-{m}"),
                start - chrono::Duration::days(1),
                Prices {
                    input_per_m: 150_000,
                    cached_input_per_m: 75_000,
                    output_per_m: 600_000,
                },
                start,
            )
            .await?;
    }
    let base = Uuid::now_v7().as_u128();
    let t = Instant::now();
    for i in 0..n {
        broker.publish_usage(&event(base, i, start_ms)).await?;
    }
    let publish_secs = t.elapsed().as_secs_f64();

    let mut source = QueueSource::new(
        broker,
        QueueSourceConfig {
            block: Duration::from_millis(10),
            takeover_every: Duration::from_millis(50),
            ..QueueSourceConfig::new("bench")
        },
    );
    let progress = source.progress();
    let cfg = ConsumerConfig {
        max_batch: batch,
        ..ConsumerConfig::default()
    };
    let t = Instant::now();
    let stats: ConsumerStats = consumer::run(&ledger, &mut source, &cfg, async move {
        // Drained: a takeover sweep and a read both found nothing.
        while progress.idle_sweeps() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    let consume_secs = t.elapsed().as_secs_f64();
    ledger.close().await;
    let rate = |secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    Ok(StreamBenchReport {
        backend: format!("{:?}", ledger.backend_kind()).to_lowercase(),
        events: n,
        batch_size: batch,
        publish_events_per_sec: rate(publish_secs),
        consume_secs,
        consume_events_per_sec: rate(consume_secs),
        batches: stats.batches,
    })
}
