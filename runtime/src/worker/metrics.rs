//! The worker's Prometheus metrics (exported on `/metrics` of `tidal runtime --queue`), and
//! the counters behind [`super::WorkerSummary`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// How a held job ended on this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Generated to the end: `done` written, usage published, acked.
    Completed,
    /// The request was invalid for this model: one 4xx `error` event, acked.
    Rejected,
    /// The engine failed it: a 5xx `error` event, acked.
    Failed,
    /// Its client went away: `cancelled` written, usage published, acked.
    Cancelled,
    /// Drained: usage published, re-enqueued with what was delivered.
    Requeued,
    /// Another worker holds it now; this worker stopped writing.
    Lost,
    /// A dead worker's job: its segment billed, re-enqueued (or acked if it had ended).
    TakenOver,
    /// The broker kept failing; the job stays pending and is taken over after the claim
    /// timeout.
    Abandoned,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Requeued => "requeued",
            Outcome::Lost => "lost",
            Outcome::TakenOver => "taken_over",
            Outcome::Abandoned => "abandoned",
        }
    }
}

/// What a worker did, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WorkerSummary {
    /// Jobs claimed fresh or resumed.
    pub claimed: u64,
    /// Dead workers' jobs taken over (billed and re-enqueued).
    pub taken_over: u64,
    /// Jobs generated to the end.
    pub completed: u64,
    /// Jobs refused with a 4xx.
    pub rejected: u64,
    /// Jobs the engine failed.
    pub failed: u64,
    /// Jobs whose client cancelled.
    pub cancelled: u64,
    /// Jobs re-enqueued by the drain.
    pub requeued: u64,
    /// Jobs lost to another worker.
    pub lost: u64,
    /// Jobs left pending after broker failures.
    pub abandoned: u64,
    /// Completion tokens written to response streams.
    pub tokens_delivered: u64,
}

/// Live counters of one worker.
#[derive(Debug, Default)]
pub struct Counters {
    claimed: AtomicU64,
    taken_over: AtomicU64,
    completed: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    requeued: AtomicU64,
    lost: AtomicU64,
    abandoned: AtomicU64,
    tokens_delivered: AtomicU64,
}

impl Counters {
    /// A job was claimed (`taken_over`: from a dead worker).
    pub fn claimed(&self, model: &str, taken_over: bool) {
        let c = if taken_over {
            &self.taken_over
        } else {
            &self.claimed
        };
        c.fetch_add(1, Ordering::Relaxed);
        let kind = if taken_over { "taken_over" } else { "claimed" };
        metrics::counter!("tidal_worker_claims_total", "model" => model.to_owned(), "kind" => kind)
            .increment(1);
    }

    /// A job ended with `outcome`.
    pub fn ended(&self, model: &str, outcome: Outcome) {
        let c = match outcome {
            Outcome::Completed => &self.completed,
            Outcome::Rejected => &self.rejected,
            Outcome::Failed => &self.failed,
            Outcome::Cancelled => &self.cancelled,
            Outcome::Requeued => &self.requeued,
            Outcome::Lost => &self.lost,
            Outcome::Abandoned => &self.abandoned,
            // Counted when claimed.
            Outcome::TakenOver => &self.taken_over,
        };
        if outcome != Outcome::TakenOver {
            c.fetch_add(1, Ordering::Relaxed);
        }
        metrics::counter!(
            "tidal_worker_jobs_total",
            "model" => model.to_owned(),
            "outcome" => outcome.label()
        )
        .increment(1);
    }

    /// `tokens` completion tokens were written to a response stream in one event that took
    /// `took` to append.
    pub fn delivered(&self, model: &str, tokens: usize, took: Duration) {
        self.tokens_delivered
            .fetch_add(tokens as u64, Ordering::Relaxed);
        metrics::counter!("tidal_worker_tokens_delivered_total", "model" => model.to_owned())
            .increment(tokens as u64);
        metrics::histogram!("tidal_worker_append_seconds", "model" => model.to_owned())
            .record(took.as_secs_f64());
    }

    /// Completion tokens delivered so far (a live read of one counter, cheaper than
    /// [`Counters::summary`]).
    pub fn tokens_delivered(&self) -> u64 {
        self.tokens_delivered.load(Ordering::Relaxed)
    }

    /// The totals so far.
    pub fn summary(&self) -> WorkerSummary {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerSummary {
            claimed: g(&self.claimed),
            taken_over: g(&self.taken_over),
            completed: g(&self.completed),
            rejected: g(&self.rejected),
            failed: g(&self.failed),
            cancelled: g(&self.cancelled),
            requeued: g(&self.requeued),
            lost: g(&self.lost),
            abandoned: g(&self.abandoned),
            tokens_delivered: g(&self.tokens_delivered),
        }
    }
}

/// Publishes the held-jobs and draining gauges.
pub fn load(model: &str, held: usize, draining: bool) {
    metrics::gauge!("tidal_worker_jobs_held", "model" => model.to_owned()).set(held as f64);
    metrics::gauge!("tidal_worker_draining", "model" => model.to_owned()).set(if draining {
        1.0
    } else {
        0.0
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_each_outcome() {
        let c = Counters::default();
        c.claimed("m", false);
        c.claimed("m", false);
        c.claimed("m", true);
        c.ended("m", Outcome::Completed);
        c.ended("m", Outcome::Requeued);
        c.ended("m", Outcome::TakenOver);
        c.delivered("m", 5, Duration::from_millis(1));
        assert_eq!(c.tokens_delivered(), 5);
        let s = c.summary();
        assert_eq!(
            (
                s.claimed,
                s.taken_over,
                s.completed,
                s.requeued,
                s.tokens_delivered
            ),
            (2, 1, 1, 1, 5)
        );
    }
}
