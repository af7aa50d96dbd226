//! Counters of queue operations (`metrics` crate), labelled by model.

/// Jobs enqueued.
pub const ENQUEUED: &str = "tidal_queue_jobs_enqueued_total";
/// Jobs claimed by a worker (first deliveries).
pub const CLAIMED: &str = "tidal_queue_jobs_claimed_total";
/// Jobs acked (finished).
pub const ACKED: &str = "tidal_queue_jobs_acked_total";
/// Jobs re-enqueued with resume state by a draining worker.
pub const REENQUEUED: &str = "tidal_queue_jobs_reenqueued_total";
/// Jobs taken over from a dead consumer.
pub const TAKEN_OVER: &str = "tidal_queue_jobs_taken_over_total";
/// Jobs withdrawn before they started (deadline, client gone, cancelled).
pub const WITHDRAWN: &str = "tidal_queue_jobs_withdrawn_total";

/// Adds `n` to counter `name` for `model`.
pub(crate) fn count(name: &'static str, model: &str, n: u64) {
    if n > 0 {
        metrics::counter!(name, "model" => model.to_owned()).increment(n);
    }
}

/// Registers descriptions of the counters with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(ENQUEUED, "Jobs enqueued");
    metrics::describe_counter!(CLAIMED, "Jobs claimed by a worker");
    metrics::describe_counter!(ACKED, "Jobs acked");
    metrics::describe_counter!(REENQUEUED, "Jobs re-enqueued with resume state");
    metrics::describe_counter!(TAKEN_OVER, "Jobs taken over from a dead consumer");
    metrics::describe_counter!(WITHDRAWN, "Jobs withdrawn before they started");
}
