//! An in-memory usage stream with Redis-Streams consumer-group semantics and injectable
//! crash points, for the consumer's own tests. Production and `tidal up` read the broker's
//! stream through [`crate::queue_source::QueueSource`] (Redis, or the in-process broker).
//!
//! Entries read but not acked stay pending; a new consumer (a restart) gets the pending
//! entries first, then new ones, like `XREADGROUP` from id `0` and then `>`. A consumer can
//! be given a crash point: after that many operations its reads and acks fail with
//! [`SourceError::Closed`] and nothing more is acked, as if the process died there.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::consumer::{Delivery, SourceError, UsageSource};
use crate::usage::UsageRecord;

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    new: VecDeque<(u64, UsageRecord)>,
    pending: BTreeMap<u64, UsageRecord>,
    acked: u64,
    available: bool,
}

/// The stream (shared; clone freely).
#[derive(Debug, Clone)]
pub struct MemoryStream {
    state: Arc<Mutex<State>>,
    idle_wait: Duration,
}

impl Default for MemoryStream {
    fn default() -> Self {
        MemoryStream::new()
    }
}

impl MemoryStream {
    /// An empty stream.
    pub fn new() -> Self {
        MemoryStream {
            state: Arc::new(Mutex::new(State {
                available: true,
                ..Default::default()
            })),
            idle_wait: Duration::from_millis(5),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent (single assignments).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event; returns its entry id.
    pub fn push(&self, record: UsageRecord) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.new.push_back((id, record));
        id
    }

    /// A consumer; pending entries are redelivered to it first.
    pub fn consumer(&self) -> MemoryConsumer {
        MemoryConsumer {
            stream: self.clone(),
            ops_left: None,
            dead: false,
            redeliver: true,
        }
    }

    /// A consumer that "crashes" after `ops` reads and acks.
    pub fn consumer_crashing_after(&self, ops: usize) -> MemoryConsumer {
        MemoryConsumer {
            ops_left: Some(ops),
            ..self.consumer()
        }
    }

    /// Makes reads fail with [`SourceError::Unavailable`] (a broker outage) or succeed again.
    pub fn set_available(&self, available: bool) {
        self.lock().available = available;
    }

    /// Entries not yet delivered.
    pub fn new_len(&self) -> usize {
        self.lock().new.len()
    }

    /// Entries delivered but not acked.
    pub fn pending_len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Entries acked so far.
    pub fn acked(&self) -> u64 {
        self.lock().acked
    }

    /// Whether every entry has been acked.
    pub fn is_drained(&self) -> bool {
        let s = self.lock();
        s.new.is_empty() && s.pending.is_empty()
    }
}

/// One consumer of a [`MemoryStream`].
#[derive(Debug)]
pub struct MemoryConsumer {
    stream: MemoryStream,
    ops_left: Option<usize>,
    dead: bool,
    redeliver: bool,
}

impl MemoryConsumer {
    fn step(&mut self) -> Result<(), SourceError> {
        if self.dead {
            return Err(SourceError::Closed);
        }
        if let Some(n) = self.ops_left.as_mut() {
            if *n == 0 {
                self.dead = true;
                return Err(SourceError::Closed);
            }
            *n -= 1;
        }
        Ok(())
    }
}

impl UsageSource for MemoryConsumer {
    type Id = u64;

    async fn read(&mut self, max: usize) -> Result<Vec<Delivery<u64>>, SourceError> {
        self.step()?;
        let batch = {
            let mut s = self.stream.lock();
            if !s.available {
                return Err(SourceError::Unavailable(
                    "memory stream marked unavailable".into(),
                ));
            }
            let mut batch = Vec::new();
            if self.redeliver {
                batch.extend(s.pending.iter().take(max).map(|(&id, r)| Delivery {
                    id,
                    record: r.clone(),
                }));
                if batch.len() < max {
                    self.redeliver = false;
                }
            }
            while batch.len() < max {
                let Some((id, record)) = s.new.pop_front() else {
                    break;
                };
                s.pending.insert(id, record.clone());
                batch.push(Delivery { id, record });
            }
            batch
        };
        if batch.is_empty() {
            // Like XREADGROUP BLOCK: wait a little before reporting nothing.
            tokio::time::sleep(self.stream.idle_wait).await;
        }
        Ok(batch)
    }

    async fn ack(&mut self, ids: &[u64]) -> Result<(), SourceError> {
        self.step()?;
        let mut s = self.stream.lock();
        for id in ids {
            if s.pending.remove(id).is_some() {
                s.acked += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::tests::record;
    use chrono::Utc;

    #[tokio::test]
    async fn unacked_entries_are_redelivered_to_the_next_consumer() {
        let s = MemoryStream::new();
        for i in 0..5 {
            s.push(record(&format!("r{i}"), 0, "t", Utc::now()));
        }
        let mut c = s.consumer();
        let first = c.read(3).await.unwrap();
        assert_eq!(first.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2, 3]);
        c.ack(&[1]).await.unwrap();
        assert_eq!((s.new_len(), s.pending_len(), s.acked()), (2, 2, 1));

        let mut restarted = s.consumer();
        let again = restarted.read(10).await.unwrap();
        assert_eq!(
            again.iter().map(|d| d.id).collect::<Vec<_>>(),
            [2, 3, 4, 5],
            "pending first, then new"
        );
        restarted.ack(&[2, 3, 4, 5, 5]).await.unwrap();
        assert!(s.is_drained());
        assert_eq!(s.acked(), 5);
        assert!(restarted.read(10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn crash_point_stops_reads_and_acks() {
        let s = MemoryStream::new();
        s.push(record("r", 0, "t", Utc::now()));
        let mut c = s.consumer_crashing_after(1);
        let got = c.read(10).await.unwrap();
        assert!(matches!(
            c.ack(&[got[0].id]).await,
            Err(SourceError::Closed)
        ));
        assert!(matches!(c.read(10).await, Err(SourceError::Closed)));
        assert_eq!(s.pending_len(), 1, "the crash lost the ack, not the entry");
    }

    #[tokio::test]
    async fn outage_is_transient() {
        let s = MemoryStream::new();
        s.set_available(false);
        let mut c = s.consumer();
        assert!(matches!(c.read(1).await, Err(SourceError::Unavailable(_))));
        s.set_available(true);
        assert!(c.read(1).await.unwrap().is_empty());
    }
}
