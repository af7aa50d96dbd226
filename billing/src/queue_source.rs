//! A [`UsageSource`] over the broker's usage stream (`{prefix}usage`, consumer group
//! `billing`): Redis Streams in production, the in-process broker in `tidal up` and tests.
//!
//! Follows the usual Redis Streams consumer-group recipe: `XREADGROUP` (own pending entries
//! first, then new ones), `XAUTOCLAIM` every [`QueueSourceConfig::takeover_every`] for
//! entries a dead consumer left pending longer than [`QueueSourceConfig::claim_timeout`],
//! and `XACK` only after the ledger committed ([`crate::consumer::run`] guarantees that).
//! A restarted billing process normally gets a new consumer name (hostname-pid), so its
//! predecessor's unacked events come back through the takeover.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidal_queue::{
    Broker, BrokerConfig, EntryId, QueueError, RedisBroker, UsageDelivery, UsageEvent,
};
use tokio::time::Instant;

use crate::consumer::{Delivery, SourceError, UsageSource};
use crate::usage::{CapacityType, UsageRecord};

/// Settings of a [`QueueSource`].
#[derive(Debug, Clone)]
pub struct QueueSourceConfig {
    /// This consumer's name in the `billing` group (unique per process).
    pub consumer: String,
    /// Longest one read waits for new events.
    pub block: Duration,
    /// An event pending this long with another consumer is presumed abandoned.
    pub claim_timeout: Duration,
    /// How often to look for abandoned events.
    pub takeover_every: Duration,
}

impl QueueSourceConfig {
    /// Defaults for consumer `consumer`: 1 s reads, 30 s claim timeout, sweep every 5 s.
    pub fn new(consumer: impl Into<String>) -> Self {
        QueueSourceConfig {
            consumer: consumer.into(),
            block: Duration::from_secs(1),
            claim_timeout: Duration::from_secs(30),
            takeover_every: Duration::from_secs(5),
        }
    }
}

/// Why a stream event could not become a [`UsageRecord`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A millisecond timestamp is outside the representable range.
    #[error("{field} {ms} ms is not a representable time")]
    Timestamp {
        /// Which field.
        field: &'static str,
        /// The value.
        ms: u64,
    },
}

fn instant(field: &'static str, ms: u64) -> Result<DateTime<Utc>, ConvertError> {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .ok_or(ConvertError::Timestamp { field, ms })
}

/// Converts a broker usage event to a ledger record (pure).
///
/// The request id becomes its hyphenated UUID text; the ledger validates the rest (token
/// counts, ids, ordering of times) and keeps invalid events as rejects.
pub fn to_record(event: &UsageEvent) -> Result<UsageRecord, ConvertError> {
    Ok(UsageRecord {
        request_id: event.request_id.to_string(),
        segment: event.segment,
        tenant: event.tenant.clone(),
        model: event.model.clone(),
        prompt_tokens: event.prompt_tokens,
        cached_prompt_tokens: event.cached_prompt_tokens,
        completion_tokens: event.completion_tokens,
        worker: event.worker.clone(),
        capacity: match event.capacity_type {
            tidal_queue::CapacityType::Spot => CapacityType::Spot,
            tidal_queue::CapacityType::OnDemand => CapacityType::OnDemand,
        },
        started_at: instant("started_at_ms", event.started_at_ms)?,
        ended_at: instant("ended_at_ms", event.ended_at_ms)?,
        last: event.last,
    })
}

/// Whether a takeover sweep is due (pure): first read, or `every` since the last sweep.
pub fn takeover_due(last_sweep: Option<Instant>, now: Instant, every: Duration) -> bool {
    last_sweep.is_none_or(|last| now.saturating_duration_since(last) >= every)
}

/// Connects to the Redis broker at `url` with key prefix `prefix` (e.g. `tidal:`).
pub async fn redis_broker(url: &str, prefix: &str) -> Result<Arc<dyn Broker>, QueueError> {
    let config = BrokerConfig {
        prefix: prefix.to_string(),
        ..BrokerConfig::default()
    };
    Ok(Arc::new(RedisBroker::connect(url, config).await?))
}

/// Shared view of a source's progress (for health checks and tests).
#[derive(Debug, Clone, Default)]
pub struct SourceProgress {
    idle_sweeps: Arc<AtomicU64>,
}

impl SourceProgress {
    /// Number of takeover sweeps that found nothing to take over and were followed by a
    /// read that found nothing new: moments when the stream was caught up.
    pub fn idle_sweeps(&self) -> u64 {
        self.idle_sweeps.load(Ordering::Relaxed)
    }
}

/// The billing group's consumer over a [`Broker`].
#[derive(Debug)]
pub struct QueueSource {
    broker: Arc<dyn Broker>,
    cfg: QueueSourceConfig,
    last_sweep: Option<Instant>,
    progress: SourceProgress,
}

impl QueueSource {
    /// A consumer over `broker` (the stream and group are created by the first read).
    pub fn new(broker: Arc<dyn Broker>, cfg: QueueSourceConfig) -> Self {
        QueueSource {
            broker,
            cfg,
            last_sweep: None,
            progress: SourceProgress::default(),
        }
    }

    /// A handle on this source's progress.
    pub fn progress(&self) -> SourceProgress {
        self.progress.clone()
    }

    /// Converts deliveries; acks the ones that cannot be converted (see below).
    async fn convert(
        &self,
        deliveries: Vec<UsageDelivery>,
    ) -> Result<Vec<Delivery<EntryId>>, SourceError> {
        let mut out = Vec::with_capacity(deliveries.len());
        let mut poison = Vec::new();
        for d in deliveries {
            match to_record(&d.event) {
                Ok(record) => out.push(Delivery {
                    id: d.entry_id,
                    record,
                }),
                Err(e) => {
                    // Unacked it would come back first on every read and stall the
                    // consumer; it cannot be billed, so log it whole and drop it.
                    tracing::error!(entry = %d.entry_id, error = %e, event = ?d.event, "undecodable usage event dropped");
                    metrics::counter!("tidal_billing_undecodable_events_total").increment(1);
                    poison.push(d.entry_id);
                }
            }
        }
        if !poison.is_empty() {
            self.broker
                .ack_usage(&poison)
                .await
                .map_err(|e| SourceError::Unavailable(e.to_string()))?;
        }
        Ok(out)
    }
}

impl UsageSource for QueueSource {
    type Id = EntryId;

    async fn read(&mut self, max: usize) -> Result<Vec<Delivery<EntryId>>, SourceError> {
        let unavailable = |e: QueueError| SourceError::Unavailable(e.to_string());
        let now = Instant::now();
        let mut swept_empty = false;
        if takeover_due(self.last_sweep, now, self.cfg.takeover_every) {
            let taken = self
                .broker
                .take_over_usage(&self.cfg.consumer, self.cfg.claim_timeout, max)
                .await
                .map_err(unavailable)?;
            self.last_sweep = Some(now);
            if !taken.is_empty() {
                tracing::info!(
                    events = taken.len(),
                    "took over usage events of a dead consumer"
                );
                metrics::counter!("tidal_billing_taken_over_total").increment(taken.len() as u64);
                return self.convert(taken).await;
            }
            swept_empty = true;
        }
        let got = self
            .broker
            .read_usage(&self.cfg.consumer, max, self.cfg.block)
            .await
            .map_err(unavailable)?;
        if got.is_empty() && swept_empty {
            self.progress.idle_sweeps.fetch_add(1, Ordering::Relaxed);
        }
        self.convert(got).await
    }

    async fn ack(&mut self, ids: &[EntryId]) -> Result<(), SourceError> {
        self.broker
            .ack_usage(ids)
            .await
            .map_err(|e| SourceError::Unavailable(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn event() -> UsageEvent {
        UsageEvent {
            request_id: Uuid::parse_str("0192f0c5-6a4e-7c3b-8d1e-1234567890ab").unwrap(),
            segment: 2,
            tenant: "acme".into(),
            model: "m".into(),
            prompt_tokens: 10,
            cached_prompt_tokens: 4,
            completion_tokens: 7,
            worker: "w1".into(),
            capacity_type: tidal_queue::CapacityType::OnDemand,
            started_at_ms: 1_764_460_800_000,
            ended_at_ms: 1_764_460_801_234,
            last: false,
        }
    }

    #[test]
    fn converts_every_field() {
        let r = to_record(&event()).unwrap();
        assert_eq!(r.request_id, "0192f0c5-6a4e-7c3b-8d1e-1234567890ab");
        assert_eq!(r.segment, 2);
        assert_eq!((r.tenant.as_str(), r.model.as_str()), ("acme", "m"));
        assert_eq!(
            (r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens),
            (10, 4, 7)
        );
        assert_eq!(r.worker, "w1");
        assert_eq!(r.capacity, CapacityType::OnDemand);
        assert_eq!(r.started_at.to_rfc3339(), "2025-11-30T00:00:00+00:00");
        assert_eq!(r.ended_at.timestamp_millis(), 1_764_460_801_234);
        let spot = UsageEvent {
            capacity_type: tidal_queue::CapacityType::Spot,
            ..event()
        };
        assert_eq!(to_record(&spot).unwrap().capacity, CapacityType::Spot);
    }

    #[test]
    fn unrepresentable_times_are_errors() {
        let e = UsageEvent {
            ended_at_ms: u64::MAX,
            ..event()
        };
        assert_eq!(
            to_record(&e),
            Err(ConvertError::Timestamp {
                field: "ended_at_ms",
                ms: u64::MAX
            })
        );
        let e = UsageEvent {
            started_at_ms: i64::MAX as u64,
            ..event()
        };
        assert!(matches!(
            to_record(&e),
            Err(ConvertError::Timestamp {
                field: "started_at_ms",
                ..
            })
        ));
        // The epoch itself is fine.
        let e = UsageEvent {
            started_at_ms: 0,
            ..event()
        };
        assert_eq!(to_record(&e).unwrap().started_at.timestamp_millis(), 0);
    }

    #[test]
    fn takeover_is_due_first_and_then_every_interval() {
        let t0 = Instant::now();
        let every = Duration::from_secs(5);
        assert!(takeover_due(None, t0, every));
        assert!(!takeover_due(Some(t0), t0, every));
        assert!(!takeover_due(
            Some(t0),
            t0 + Duration::from_millis(4_999),
            every
        ));
        assert!(takeover_due(Some(t0), t0 + every, every));
        // A clock that seems to go backwards is not due.
        assert!(!takeover_due(Some(t0 + every), t0, every));
    }
}
