//! The metering consumer: reads usage events from a stream, writes them to the ledger in
//! batches, and acknowledges them only after the ledger transaction committed.
//!
//! At-least-once delivery from the stream (a Redis Streams consumer group, or
//! [`crate::memory_source`]) plus the ledger's idempotent `(request_id, segment)` key gives
//! exactly-once accounting: a crash before commit leaves the events pending (they are
//! redelivered); a crash between commit and ack redelivers events the ledger then ignores.
//! While the database is down the batch is retried with capped exponential backoff and
//! nothing is acked, so the events stay in the stream.
//!
//! Budget delay: tenant spend is updated in the same transaction as the events, so the
//! gateway sees a segment's cost at most one read wait (`UsageSource::read`'s block time)
//! plus one batch commit after the worker published the event, while the database is up.

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::ledger::Ledger;
use crate::usage::UsageRecord;

/// One delivered event and the id to acknowledge it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<Id> {
    /// Stream entry id.
    pub id: Id,
    /// The event.
    pub record: UsageRecord,
}

/// Why a source failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source is gone for good (shutdown, or a test's simulated crash): stop consuming.
    #[error("source closed")]
    Closed,
    /// A transient failure (broker unreachable): retry later.
    #[error("source unavailable: {0}")]
    Unavailable(String),
}

/// A stream of usage events with consumer-group semantics: delivered entries stay pending
/// until acked and are redelivered to a restarted consumer.
pub trait UsageSource: Send {
    /// Entry id type.
    type Id: Clone + Send + Sync + 'static;

    /// Reads up to `max` entries: first this consumer's pending ones after a restart, then
    /// new ones. Waits a bounded time when there are none and returns an empty batch.
    fn read(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery<Self::Id>>, SourceError>> + Send;

    /// Acknowledges entries after they are durably recorded.
    fn ack(&mut self, ids: &[Self::Id]) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Most events per ledger transaction.
    pub max_batch: usize,
    /// First retry delay after a failed write or read.
    pub initial_backoff: Duration,
    /// Retry delay cap.
    pub max_backoff: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            max_batch: 1000,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Totals of one consumer run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Batches committed.
    pub batches: u64,
    /// Events delivered (redeliveries included).
    pub delivered: u64,
    /// Events newly recorded.
    pub inserted: u64,
    /// Events ignored as already recorded.
    pub duplicates: u64,
    /// Ledger write attempts that failed and were retried.
    pub write_retries: u64,
}

fn next_backoff(current: Duration, cfg: &ConsumerConfig) -> Duration {
    (current * 2).min(cfg.max_backoff)
}

/// Runs the consumer until `shutdown` completes or the source closes.
///
/// Never acks an event whose batch has not committed. Returns what it did; a source that
/// closes is a normal end (`Ok`), since its pending events will be redelivered.
pub async fn run<S: UsageSource>(
    ledger: &Ledger,
    source: &mut S,
    cfg: &ConsumerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<ConsumerStats, Error> {
    let mut stats = ConsumerStats::default();
    tokio::pin!(shutdown);
    let mut read_backoff = cfg.initial_backoff;
    loop {
        let batch = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(stats),
            r = source.read(cfg.max_batch) => r,
        };
        let batch = match batch {
            Ok(b) => {
                read_backoff = cfg.initial_backoff;
                b
            }
            Err(SourceError::Closed) => return Ok(stats),
            Err(SourceError::Unavailable(why)) => {
                tracing::warn!(%why, "usage source unavailable; retrying");
                tokio::select! {
                    biased;
                    _ = &mut shutdown => return Ok(stats),
                    _ = tokio::time::sleep(read_backoff) => {}
                }
                read_backoff = next_backoff(read_backoff, cfg);
                continue;
            }
        };
        if batch.is_empty() {
            continue;
        }
        stats.delivered += batch.len() as u64;
        let records: Vec<UsageRecord> = batch.iter().map(|d| d.record.clone()).collect();
        let ids: Vec<S::Id> = batch.into_iter().map(|d| d.id).collect();

        let mut backoff = cfg.initial_backoff;
        let outcome = loop {
            match ledger.record_batch(&records).await {
                Ok(o) => break o,
                Err(e) => {
                    stats.write_retries += 1;
                    metrics::counter!("tidal_billing_write_retries_total").increment(1);
                    tracing::warn!(error = %e, retry_in = ?backoff, events = records.len(), "ledger write failed; events stay pending");
                    tokio::select! {
                        biased;
                        // Unacked: the events are redelivered to the next consumer.
                        _ = &mut shutdown => return Ok(stats),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = next_backoff(backoff, cfg);
                }
            }
        };
        stats.batches += 1;
        stats.inserted += outcome.inserted as u64;
        stats.duplicates += outcome.duplicates as u64;
        match source.ack(&ids).await {
            Ok(()) => {}
            Err(SourceError::Closed) => return Ok(stats),
            // Committed but unacked: redelivery is harmless (idempotent ledger).
            Err(SourceError::Unavailable(why)) => {
                tracing::warn!(%why, "ack failed; events will be redelivered")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let cfg = ConsumerConfig {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(300),
            ..Default::default()
        };
        let mut b = cfg.initial_backoff;
        let mut seen = vec![];
        for _ in 0..5 {
            seen.push(b.as_millis());
            b = next_backoff(b, &cfg);
        }
        assert_eq!(seen, [50, 100, 200, 300, 300]);
    }
}
