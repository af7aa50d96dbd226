//! The `Broker` interface: every operation gateway, workers, controller and billing perform
//! on the queue. Implemented by [`crate::RedisBroker`] (production) and
//! [`crate::MemoryBroker`] (`tidal up`, tests) with the same semantics.
//!
//! # Rules both implementations hold
//!
//! * **Start gate.** Each request has a gate that is `started` or `withdrawn`, changed only
//!   atomically. A claim (first delivery or takeover) passes a job to its caller only after
//!   setting the gate to `started`; it drops (acks and deletes) a job whose gate is
//!   `withdrawn`, whose cancel flag is set before it started, or whose deadline has passed
//!   before it started (the deadline is compared with the broker's clock: Redis's `TIME`, or
//!   the in-process broker's [`crate::Clock`]). [`Broker::withdraw`] sets `withdrawn` only while the gate is not
//!   `started`. So when a withdraw races a claim, exactly one wins: either the job never
//!   runs, or the withdrawer learns [`Withdrawal::AlreadyStarted`] and must cancel it instead.
//! * **Response fencing.** Response events must be appended with consecutive seqs starting at 1,
//!   and nothing after `done`/`error`. A worker that gets [`QueueError::SeqConflict`] has lost
//!   the request to another worker (it was taken over) and must stop generating it.
//!   A worker that takes over a job whose stream already ended gets
//!   [`QueueError::ResponseFinished`] on its first append and should just ack the job.
//! * **Ownership.** [`Broker::ack`], [`Broker::requeue`] and [`Broker::append_held`] succeed
//!   only for the consumer that holds the pending entry now ([`QueueError::NotOwner`]
//!   otherwise), so a worker presumed dead can neither drop a job another worker took over
//!   nor write to its stream: it notices at its next write and stops. A live holder renews
//!   its entries with [`Broker::keep_alive`] so that a long generation is never presumed dead.
//! * **Takeover.** A job is taken over when its holder's heartbeat is stale
//!   ([`Broker::take_over_dead`], seconds after a crash) or, for holders that never wrote
//!   one, when it was not renewed for the claim timeout ([`Broker::take_over`]). Either way
//!   the taker becomes the entry's holder atomically, so ownership fences the old one.
//!
//! [`QueueError::SeqConflict`]: crate::QueueError::SeqConflict
//! [`QueueError::NotOwner`]: crate::QueueError::NotOwner
//! [`QueueError::ResponseFinished`]: crate::QueueError::ResponseFinished

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::error::{QueueError, Result};
use crate::keys::DEFAULT_PREFIX;
use crate::pool::PoolHeartbeat;
use crate::types::{
    ClaimedJob, EntryId, Job, ModelRecord, QueueDepth, RequestRecord, ResponseEvent, Resume,
    Submitted, UsageDelivery, UsageEvent, Withdrawal, WorkerHeartbeat,
};

/// Settings shared by both brokers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Key prefix (default `tidal:`).
    pub prefix: String,
    /// A response stream expires this long after its last event.
    pub response_ttl: Duration,
    /// A request's start gate and cancel flag live this long (renewed whenever the job is
    /// claimed or taken over; the gate of an acked job lives only `response_ttl` more).
    /// Must exceed the longest a job can wait plus run between two claims.
    pub request_ttl: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            prefix: DEFAULT_PREFIX.to_owned(),
            response_ttl: Duration::from_secs(600),
            request_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// The error of recording a request id twice.
pub(crate) fn duplicate_request(id: Uuid) -> QueueError {
    QueueError::Invalid(format!("request {id} is already recorded"))
}

/// The queue between gateway, workers, controller and billing.
#[async_trait]
pub trait Broker: Send + Sync + std::fmt::Debug {
    // --- jobs ---

    /// Appends `job` to its model's jobs stream; returns its entry id (keep it to withdraw).
    async fn enqueue(&self, job: &Job) -> Result<EntryId>;

    /// Claims up to `max` jobs of `model` for `consumer` that no consumer got before,
    /// waiting up to `block` for the first one (zero: do not wait). May return fewer, or none
    /// before `block` elapses, when delivered jobs were dropped by the start gate.
    /// Re-enqueued jobs come first. (Redis: a job re-enqueued while this claim is already
    /// blocked waits for the next claim, at most `block` later.) Jobs stay pending for
    /// `consumer` until acked, re-enqueued or taken over.
    async fn claim(
        &self,
        model: &str,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<ClaimedJob>>;

    /// Takes over up to `max` jobs of `model` pending for longer than `min_idle` (their
    /// consumer is presumed dead); they become pending for `consumer` with `attempt` raised.
    async fn take_over(
        &self,
        model: &str,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedJob>>;

    /// Takes over up to `max` jobs of `model` pending for consumers whose heartbeat (see
    /// [`Broker::heartbeat`]) is older than `dead_after` at `now_ms` ([`is_stale`]), whatever
    /// their idle time: a worker that stopped beating is presumed dead. `consumer` never
    /// takes its own jobs; consumers without a heartbeat are left to [`Broker::take_over`].
    /// The jobs become pending for `consumer` with `attempt` raised, as with
    /// [`Broker::take_over`]; a holder that was only late is fenced by the ownership rule.
    /// Dead workers left holding nothing are forgotten (heartbeat and stream consumer), so
    /// they do not pile up with every worker a model ever had; one that was only late
    /// reappears with its next heartbeat.
    async fn take_over_dead(
        &self,
        model: &str,
        consumer: &str,
        now_ms: u64,
        dead_after: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedJob>>;

    /// Tells the broker that the holder of `jobs` is alive and still working on them: each
    /// entry's idle time restarts, so [`Broker::take_over`] leaves it alone for another
    /// `min_idle` (Redis: `XCLAIM ... 0 <entry> JUSTID` by the same consumer, after an
    /// ownership check). It is no new delivery: `attempt` does not grow. One answer per job,
    /// in order: `false` when the entry is no longer pending for `job.consumer` (taken over,
    /// acked, withdrawn); its holder has lost it and must stop generating it. Workers call
    /// this well within the claim timeout for every job they hold.
    async fn keep_alive(&self, jobs: &[ClaimedJob]) -> Result<Vec<bool>>;

    /// The consumer `job`'s entry is pending for now, or `None` when it is pending for
    /// nobody (acked, re-enqueued, withdrawn, or lost with the broker's data). A worker
    /// whose write was refused ([`QueueError::NotOwner`]) asks this to tell a takeover (the
    /// taker bills) from a job that no one holds any more (it bills what it delivered).
    async fn holder(&self, job: &ClaimedJob) -> Result<Option<String>>;

    /// Marks a finished job done and removes it from the stream.
    async fn ack(&self, job: &ClaimedJob) -> Result<()>;

    /// Records that `job`'s first token is out: from now on it only decodes, and
    /// [`QueueDepth::decoding`](crate::QueueDepth::decoding) counts it until it is acked,
    /// re-enqueued or taken over (then it waits for a first token again). The autoscaler
    /// weighs such jobs lower than those waiting for prefill. Fails with `NotOwner` when
    /// `job.consumer` no longer holds it.
    async fn mark_decoding(&self, job: &ClaimedJob) -> Result<()>;

    /// Atomically appends the job again with `resume` (its `segments` is set to
    /// `job.segment() + 1`) and acks the old entry; returns the new entry id.
    /// Re-enqueued jobs wait in the model's resumed stream, which every claim and takeover
    /// serves before fresh jobs (a started request is not sent to the back of the queue).
    async fn requeue(&self, job: &ClaimedJob, resume: Resume) -> Result<EntryId>;

    /// Withdraws a job that has not started (max queue wait passed, client gone): it will
    /// never run. See the start-gate rule in the module docs.
    async fn withdraw(&self, model: &str, id: Uuid, entry: &EntryId) -> Result<Withdrawal>;

    /// Depth figures of `model`'s queue, read as one snapshot (on Redis, one script: both
    /// streams and the prompt-token counter).
    async fn depth(&self, model: &str) -> Result<QueueDepth>;

    /// Deletes `model`'s jobs stream and heartbeats (model removed).
    async fn purge_model(&self, model: &str) -> Result<()>;

    // --- responses ---

    /// Appends an event to request `id`'s response stream and renews its expiry.
    async fn append_response(&self, id: Uuid, event: &ResponseEvent) -> Result<()>;

    /// Appends `event` to the response stream of `job`'s request like
    /// [`Broker::append_response`], but only while `job.consumer` holds `job`'s entry:
    /// [`QueueError::NotOwner`] otherwise, and nothing is written. Workers write through
    /// this, so a holder presumed dead stops at its next write.
    async fn append_held(&self, job: &ClaimedJob, event: &ResponseEvent) -> Result<()>;

    /// Reads up to `max` events with seq greater than `after_seq`, waiting up to `block` for
    /// the first (zero: do not wait). Empty when none came in time.
    async fn read_responses(
        &self,
        id: Uuid,
        after_seq: u64,
        max: usize,
        block: Duration,
    ) -> Result<Vec<ResponseEvent>>;

    /// Deletes request `id`'s response stream (the reader has delivered it).
    async fn delete_responses(&self, id: Uuid) -> Result<()>;

    // --- request records ---

    /// Enqueues a new request's `job` and keeps its `record` (whose `entry_id` is set to the
    /// new entry) until `request_ttl` passes or [`Broker::forget_request`], in one atomic
    /// step: a gateway that dies at any point leaves either both or neither.
    ///
    /// With `record.idempotency`, the first call for (tenant, key) does the above and keeps
    /// the key for `request_ttl`; every later call enqueues nothing and answers
    /// [`Submitted::Duplicate`] with the first request (a client retrying after a lost
    /// connection reattaches to it instead of running it twice). [`QueueError::Invalid`]
    /// when the job's id is already recorded.
    async fn submit(&self, job: &Job, record: &RequestRecord) -> Result<Submitted>;

    /// Frees `tenant`'s idempotency key `key` if it still names request `id` and that
    /// request's record is still kept: the request ended without an answer (its client went
    /// away, or it was withdrawn), so a retry with the key must run afresh rather than find
    /// it. A request whose record is gone was answered (through another reader, say) and
    /// keeps its key.
    async fn release_idempotency_key(&self, tenant: &str, key: &str, id: Uuid) -> Result<()>;

    /// The record of request `id`, if it is still kept.
    async fn request(&self, id: Uuid) -> Result<Option<RequestRecord>>;

    /// How long a request's record is kept after [`Broker::submit`] at most
    /// ([`BrokerConfig::request_ttl`]): a record younger than this that is gone was forgotten
    /// (or lost with the broker's data), not expired.
    fn request_ttl(&self) -> Duration;

    /// Forgets request `id` once its answer was delivered or it was withdrawn: its record and
    /// its response stream, in one step. Whether a record was kept. (A started request whose
    /// client went away is forgotten by [`Broker::cancel`], which keeps its stream.)
    async fn forget_request(&self, id: Uuid) -> Result<bool>;

    // --- cancellation ---

    /// Cancels request `id`, whose client went away after the gateway handed it the response
    /// events up to seq `delivered_seq` (0: none), in one step: sets its cancel flag to that
    /// seq (a flag already set keeps the larger one: what any reader was handed) and forgets
    /// its record. Its response stream stays (and expires like any other): the worker that
    /// holds the job, or takes it over, ends it and bills from it the completion tokens of
    /// the deltas up to `delivered_seq`, and no more.
    async fn cancel(&self, id: Uuid, delivered_seq: u64) -> Result<()>;

    /// Whether request `id`'s cancel flag is set.
    async fn is_cancelled(&self, id: Uuid) -> Result<bool>;

    /// The cancel flags of many requests in one round trip (a worker polls all the
    /// requests it runs at once), in the order of `ids`: the delivered seq of each
    /// cancelled request ([`Broker::cancel`]), `None` for one not cancelled.
    async fn cancelled(&self, ids: &[Uuid]) -> Result<Vec<Option<u64>>>;

    // --- usage ---

    /// Appends a usage event to the usage stream.
    async fn publish_usage(&self, event: &UsageEvent) -> Result<EntryId>;

    /// Reads up to `max` usage events for billing consumer `consumer`: first those it read
    /// before and did not ack, else new ones (waiting up to `block`). At least once.
    async fn read_usage(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<UsageDelivery>>;

    /// Takes over usage events another billing consumer left unacked for `min_idle`.
    async fn take_over_usage(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<UsageDelivery>>;

    /// Acks recorded usage events (and removes them from the stream).
    async fn ack_usage(&self, entries: &[EntryId]) -> Result<()>;

    // --- workers ---

    /// Writes a worker's heartbeat.
    async fn heartbeat(&self, beat: &WorkerHeartbeat) -> Result<()>;

    /// Heartbeats of `model`'s workers, by worker name.
    async fn workers(&self, model: &str) -> Result<Vec<WorkerHeartbeat>>;

    /// Removes heartbeats last seen before `now_ms - max_age`; returns the removed workers.
    async fn expire_workers(
        &self,
        model: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>>;

    // --- pools ---

    /// Writes a pool worker's heartbeat into its pool's hash (the per-model heartbeats of
    /// the models it has loaded are written apart, with [`Broker::heartbeat`]).
    async fn pool_heartbeat(&self, beat: &PoolHeartbeat) -> Result<()>;

    /// Heartbeats of `pool`'s workers, by worker name.
    async fn pool_workers(&self, pool: &str) -> Result<Vec<PoolHeartbeat>>;

    /// Removes the heartbeats of `pool`'s workers last seen before `now_ms - max_age`
    /// ([`crate::pool::is_pool_stale`]), and their assignments with them, so that neither
    /// grows with every worker the pool ever had; returns the removed workers. A beat
    /// written between the read and the removal is kept (compare-and-delete).
    async fn expire_pool_workers(
        &self,
        pool: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>>;

    /// Sets the models `worker` of `pool` should hold, replacing its previous assignment
    /// (an empty list: hold nothing). [`QueueError::Invalid`] for an empty or blank model
    /// id or one given twice.
    async fn set_pool_assignment(&self, pool: &str, worker: &str, models: &[String]) -> Result<()>;

    /// The models `worker` of `pool` should hold; `None` when no assignment was written
    /// (or it was removed with the worker's stale heartbeat): the worker keeps what it holds.
    async fn pool_assignment(&self, pool: &str, worker: &str) -> Result<Option<Vec<String>>>;

    /// Every assignment of `pool`: worker → models.
    async fn pool_assignments(&self, pool: &str) -> Result<BTreeMap<String, Vec<String>>>;

    // --- models ---

    /// Writes a model record.
    async fn put_model(&self, record: &ModelRecord) -> Result<()>;

    /// One model's record.
    async fn model(&self, id: &str) -> Result<Option<ModelRecord>>;

    /// All model records, by id.
    async fn models(&self) -> Result<Vec<ModelRecord>>;

    /// Removes a model record; whether it existed.
    async fn remove_model(&self, id: &str) -> Result<bool>;
}

/// Whether heartbeat `beat` is stale at `now_ms` (pure; both brokers use it).
pub fn is_stale(beat: &WorkerHeartbeat, now_ms: u64, max_age: Duration) -> bool {
    now_ms.saturating_sub(beat.last_seen_ms) > max_age.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::CapacityType;

    #[test]
    fn staleness_is_strictly_older_than_max_age() {
        let beat = WorkerHeartbeat {
            worker: "w".into(),
            model: "m".into(),
            running: 0,
            waiting: 0,
            free_kv_blocks: 0,
            capacity_type: CapacityType::Spot,
            draining: false,
            last_seen_ms: 10_000,
        };
        let age = Duration::from_secs(5);
        assert!(!is_stale(&beat, 10_000, age));
        assert!(!is_stale(&beat, 15_000, age));
        assert!(is_stale(&beat, 15_001, age));
        // A heartbeat from a clock ahead of ours is fresh.
        assert!(!is_stale(&beat, 9_000, age));
    }
}
