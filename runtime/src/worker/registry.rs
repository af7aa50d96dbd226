//! The jobs a worker holds, shared by the claim loop (admission), the chores (keep-alive,
//! cancel polling, heartbeats) and the job tasks, with one control channel per job through
//! which the chores and the drain tell a job task to stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tidal_queue::{ClaimedJob, EntryId};
use tokio::sync::watch;
use uuid::Uuid;

/// What a job task must do, in rising precedence: a stronger order replaces a weaker one,
/// never the reverse (a cancelled job is not re-enqueued by a drain; a lost job writes
/// nothing more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Control {
    /// Keep generating.
    Run,
    /// Shutdown: stop and re-enqueue with what was delivered.
    Drain,
    /// The client went away after the gateway handed it the response events up to this
    /// seq: stop, bill what those events delivered, write `cancelled`.
    Cancel(u64),
    /// Another worker holds the job now: stop writing at once.
    Lost,
}

struct Held {
    job: ClaimedJob,
    control: watch::Sender<Control>,
}

/// Jobs held by one worker, by entry id.
#[derive(Default, Clone)]
pub(crate) struct Registry {
    inner: Arc<Mutex<HashMap<EntryId, Held>>>,
    /// The most jobs held at once so far.
    most: Arc<AtomicUsize>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<EntryId, Held>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot poison it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a claimed job; returns its control receiver and a guard that unregisters
    /// it when dropped (also when its task is aborted).
    pub fn insert(&self, job: ClaimedJob) -> (watch::Receiver<Control>, HeldGuard) {
        let (tx, rx) = watch::channel(Control::Run);
        let entry = job.entry_id.clone();
        let mut held = self.lock();
        held.insert(entry.clone(), Held { job, control: tx });
        self.most.fetch_max(held.len(), Ordering::Relaxed);
        drop(held);
        let guard = HeldGuard {
            registry: self.clone(),
            entry,
        };
        (rx, guard)
    }

    /// Jobs held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// The most jobs held at once so far.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::Relaxed)
    }

    /// Every held job (for keep-alive).
    pub fn jobs(&self) -> Vec<ClaimedJob> {
        self.lock().values().map(|h| h.job.clone()).collect()
    }

    /// Entry and request id of every held job (for cancel polling).
    pub fn requests(&self) -> Vec<(EntryId, Uuid)> {
        self.lock()
            .iter()
            .map(|(e, h)| (e.clone(), h.job.job.id))
            .collect()
    }

    /// Orders the job at `entry` to `control`, unless it already has a stronger order.
    pub fn signal(&self, entry: &str, control: Control) {
        if let Some(h) = self.lock().get(entry) {
            raise(&h.control, control);
        }
    }

    /// Orders every held job to `control` (unless one has a stronger order).
    pub fn signal_all(&self, control: Control) {
        for h in self.lock().values() {
            raise(&h.control, control);
        }
    }
}

fn raise(tx: &watch::Sender<Control>, control: Control) {
    tx.send_if_modified(|c| {
        if control > *c {
            *c = control;
            true
        } else {
            false
        }
    });
}

/// Unregisters a job when dropped.
pub(crate) struct HeldGuard {
    registry: Registry,
    entry: EntryId,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_queue::Job;

    fn job(entry: &str) -> ClaimedJob {
        ClaimedJob {
            job: Job {
                id: Uuid::now_v7(),
                tenant: "t".into(),
                model: "m".into(),
                body: serde_json::json!({}),
                enqueued_at_ms: 0,
                deadline_ms: 0,
                resume: None,
            },
            entry_id: entry.into(),
            consumer: "w".into(),
            attempt: 1,
        }
    }

    #[test]
    fn guards_unregister_and_orders_only_get_stronger() {
        let r = Registry::default();
        let (a, ga) = r.insert(job("1-0"));
        let (b, gb) = r.insert(job("2-0"));
        assert_eq!(r.len(), 2);
        assert_eq!(r.requests().len(), 2);
        r.signal("1-0", Control::Cancel(3));
        r.signal_all(Control::Drain);
        assert_eq!(
            (*a.borrow(), *b.borrow()),
            (Control::Cancel(3), Control::Drain)
        );
        // a later cancel with more delivered raises the seq, never lowers it
        r.signal("1-0", Control::Cancel(5));
        r.signal("1-0", Control::Cancel(4));
        assert_eq!(*a.borrow(), Control::Cancel(5));
        r.signal("2-0", Control::Lost);
        r.signal("2-0", Control::Cancel(1));
        assert_eq!(*b.borrow(), Control::Lost);
        drop(ga);
        assert_eq!(r.jobs().len(), 1);
        r.signal("1-0", Control::Lost); // gone: ignored
        drop(gb);
        assert_eq!(r.len(), 0);
        // the high-water mark stays at the two held at once
        assert_eq!(r.most(), 2);
        let (_c, _gc) = r.insert(job("3-0"));
        assert_eq!(r.most(), 2);
    }
}
