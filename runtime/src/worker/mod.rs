//! Worker mode (`tidal runtime --queue`, and each in-process worker of `tidal up`): pull
//! one model's jobs from the broker, run them in the engine's batch, stream their deltas into
//! the response streams, bill one usage event per segment, ack (design.md, "Broker
//! protocol" and "Preemption-safe generation").
//!
//! Shape:
//! * The claim loop ([`Worker::run`]) claims only while the engine has room
//!   ([`capacity::claimable`]: free job slots and KV blocks, nothing waiting in the engine,
//!   and, unless the claim budget is off, prefill work queued under it: by default one
//!   second at the engine's measured prefill rate),
//!   and scans for jobs of dead workers: those whose heartbeats stopped (every heartbeat
//!   interval, once this worker's own heartbeats show it can judge, see `contact.rs`) and
//!   those idle past the claim timeout (the backstop for holders that never beat).
//! * One task per held job (`job.rs`) streams it; deltas that pile up while an append is in
//!   flight are merged into one event, and appends of different jobs pipeline on the
//!   broker's connection.
//! * Chores (`chores.rs`): all cancel flags in one round trip every `cancel_poll_interval`,
//!   all held jobs renewed with one keep-alive call well within the claim timeout, and the
//!   heartbeat.
//! * Shutdown: stop claiming, let sequences finish within `drain_timeout`, then bill each
//!   unfinished one's segment and re-enqueue it with what was delivered; the next worker
//!   continues the same response stream (the engine resumes exactly, see
//!   [`crate::engine::ResumeFrom`]).
//! * A dead worker's job is billed for what its holder delivered and re-enqueued by the
//!   worker that takes it over (`takeover.rs` says why). A holder that was only presumed
//!   dead (stalled, cut off) writes nothing more: every append checks that it still holds
//!   the job ([`tidal_queue::Broker::append_held`]), and its first refused one stops it.
//! * Broker calls of a job are retried through a Redis outage, with backoff, for up to
//!   `broker_retry` (`io.rs`); the sequence keeps its place in the batch meanwhile.
//!
//! Each job's prompt is cached in its tenant's own prefix-cache scope, apart from the
//! operator's shared prefixes (`cache_scope.rs`).
//!
//! Log-probabilities are not carried through the queue: response events have no field for
//! them, so a job that asks for them gets its text and tokens without.

pub mod bench;
mod cache_scope;
pub mod capacity;
mod chores;
mod config;
mod contact;
mod io;
mod job;
mod metrics;
pub mod pool;
pub mod probe;
mod registry;
pub mod segment;
pub mod takeover;

pub use cache_scope::SharedPrefix;
pub use config::{ClaimBudget, WorkerConfig, WorkerError, DEFAULT_CLAIM_BUDGET};
pub use metrics::{Outcome, WorkerSummary};

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tidal_queue::clock::system_now_ms;
use tidal_queue::{Broker, ClaimedJob};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::server::LoadedModel;
use cache_scope::SharedPrefixes;
use metrics::Counters;
use registry::Registry;

/// How long the claim loop sleeps when it has no room, unless a job ends first (or, with a
/// prefill budget, the engine steps).
const NO_ROOM_POLL: Duration = Duration::from_millis(50);
/// Pause after a failed claim (broker unreachable).
const CLAIM_RETRY: Duration = Duration::from_secs(1);

/// What every task of one worker shares.
pub(crate) struct Shared {
    model: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    config: WorkerConfig,
    registry: Registry,
    counters: Counters,
    draining: AtomicBool,
    /// This worker's own heartbeat record: whether it may presume others dead.
    contact: Mutex<contact::Contact>,
    /// `config.shared_prefixes`, tokenised.
    shared_prefixes: SharedPrefixes,
}

/// A queue worker for one loaded model. Create it, keep a [`WorkerStatus`] if you want to
/// watch it, then [`Worker::run`] it until shutdown.
pub struct Worker {
    shared: Arc<Shared>,
}

/// A live view of a running worker (for health probes and `tidal up`). It shares the
/// worker's model: drop it too when unloading the model.
#[derive(Clone)]
pub struct WorkerStatus {
    shared: Arc<Shared>,
}

impl WorkerStatus {
    /// Jobs held now.
    pub fn held(&self) -> usize {
        self.shared.registry.len()
    }

    /// The most jobs held at once since the worker started.
    pub fn most_held(&self) -> usize {
        self.shared.registry.most()
    }

    /// Whether shutdown was asked for (no new claims).
    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::Relaxed)
    }

    /// Totals so far.
    pub fn summary(&self) -> WorkerSummary {
        self.shared.counters.summary()
    }

    /// Completion tokens written to response streams since the worker started.
    pub fn tokens_delivered(&self) -> u64 {
        self.shared.counters.tokens_delivered()
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.shared.config
    }
}

/// Aborts a spawned task when dropped (a worker future dropped mid-run leaves nothing
/// running behind it, like a killed process).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Worker {
    /// A worker serving `model` from `broker` with `config`.
    pub fn new(
        model: Arc<LoadedModel>,
        broker: Arc<dyn Broker>,
        config: WorkerConfig,
    ) -> Result<Self, WorkerError> {
        config.validate()?;
        let shared_prefixes = SharedPrefixes::new(&model, &config.shared_prefixes)?;
        Ok(Worker {
            shared: Arc::new(Shared {
                model,
                broker,
                config,
                registry: Registry::default(),
                counters: Counters::default(),
                draining: AtomicBool::new(false),
                contact: Mutex::new(contact::Contact::default()),
                shared_prefixes,
            }),
        })
    }

    /// A live view of this worker.
    pub fn status(&self) -> WorkerStatus {
        WorkerStatus {
            shared: self.shared.clone(),
        }
    }

    /// Serves jobs until `shutdown` completes, then drains (see the module docs) and returns
    /// what it did. Broker failures are logged and retried, never fatal. Dropping the
    /// returned future stops everything at once without draining (as a crash would: held
    /// jobs are taken over by other workers once its heartbeats are missed).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> WorkerSummary {
        let shared = self.shared;
        let config = &shared.config;
        let (stop_chores, stop_rx) = watch::channel(false);
        let chores = AbortOnDrop(tokio::spawn(chores::run(shared.clone(), stop_rx)));
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut scans = TakeoverScans::new(Instant::now());
        let max_jobs = config
            .max_jobs
            .unwrap_or(shared.model.engine.config().max_num_seqs);
        let block_size = shared.model.engine.config().block_size.max(1);
        // With a prefill budget, room comes back as the engine works through its prefill, so
        // the loop waits for engine steps rather than the poll (which could leave a fast
        // engine without queued prefill); without one, room comes back when a job ends.
        let mut progress = shared.model.engine.stats_updates();
        let mut engine_stepping = config.claim_budget != ClaimBudget::Off;
        let blocks_per_job = config.kv_tokens_per_job.div_ceil(block_size);
        tracing::info!(
            model = %config.model_id,
            worker = %config.name,
            max_jobs,
            claim_budget = %config.claim_budget,
            "worker started"
        );
        loop {
            while tasks.try_join_next().is_some() {}
            // Regardless of room: a taker only bills and re-enqueues, so the jobs wait in the
            // resumed stream (ahead of fresh ones) for whichever worker has room first.
            let taken = scans.run(&shared, max_jobs).await;
            if !taken.is_empty() {
                spawn_all(&shared, &mut tasks, taken, true);
            }
            let stats = shared.model.engine.stats();
            let room = capacity::claimable(
                shared.registry.len(),
                max_jobs,
                &stats,
                blocks_per_job,
                capacity::budget_tokens(&config.claim_budget, &stats),
            );
            if room == 0 {
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tasks.join_next(), if !tasks.is_empty() => {}
                    _ = progress.changed(), if engine_stepping => {}
                    _ = tokio::time::sleep(NO_ROOM_POLL) => {}
                }
                if engine_stepping && progress.has_changed().is_err() {
                    engine_stepping = false; // the engine stopped
                }
                continue;
            }
            // A claim is never abandoned half-way (what it delivered would sit pending until
            // a takeover): when shutdown comes during one, it finishes first.
            let claim =
                shared
                    .broker
                    .claim(&config.model_id, &config.name, room, config.claim_block);
            let mut claim = std::pin::pin!(claim);
            let mut stopping = false;
            let claimed = tokio::select! {
                r = &mut claim => r,
                _ = &mut shutdown => {
                    stopping = true;
                    claim.await
                }
            };
            match claimed {
                Ok(jobs) => spawn_all(&shared, &mut tasks, jobs, false),
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed");
                    if !stopping {
                        tokio::select! {
                            _ = &mut shutdown => stopping = true,
                            _ = tokio::time::sleep(CLAIM_RETRY) => {}
                        }
                    }
                }
            }
            if stopping {
                break;
            }
        }
        drain(&shared, &mut tasks).await;
        let _ = stop_chores.send(true);
        drop(chores);
        chores::heartbeat(&shared).await;
        let summary = shared.counters.summary();
        tracing::info!(?summary, "worker stopped");
        summary
    }
}

/// When the claim loop next looks for jobs of dead workers, by heartbeat and by idle time.
struct TakeoverScans {
    dead: Instant,
    idle: Instant,
}

impl TakeoverScans {
    fn new(now: Instant) -> Self {
        TakeoverScans {
            dead: now,
            idle: now,
        }
    }

    /// Runs the scans that are due; the jobs taken over (up to `max`).
    async fn run(&mut self, shared: &Shared, max: usize) -> Vec<ClaimedJob> {
        let config = &shared.config;
        let now = Instant::now();
        let mut taken = Vec::new();
        if now >= self.dead {
            self.dead = now + config.takeover_every();
            let may_judge = shared
                .contact
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .may_judge(now.into_std(), config.dead_after());
            if may_judge {
                match shared
                    .broker
                    .take_over_dead(
                        &config.model_id,
                        &config.name,
                        system_now_ms(),
                        config.dead_after(),
                        max,
                    )
                    .await
                {
                    Ok(jobs) => taken = jobs,
                    Err(e) => tracing::warn!(error = %e, "scan for dead workers' jobs failed"),
                }
            }
        }
        if now >= self.idle && taken.len() < max {
            self.idle = now + config.idle_takeover_every();
            match shared
                .broker
                .take_over(
                    &config.model_id,
                    &config.name,
                    config.claim_timeout,
                    max - taken.len(),
                )
                .await
            {
                Ok(jobs) => taken.extend(jobs),
                Err(e) => tracing::warn!(error = %e, "takeover scan failed"),
            }
        }
        taken
    }
}

/// Starts a task for each claimed (or taken-over) job.
fn spawn_all(
    shared: &Arc<Shared>,
    tasks: &mut JoinSet<()>,
    jobs: Vec<ClaimedJob>,
    taken_over: bool,
) {
    for claimed in jobs {
        shared.counters.claimed(&shared.config.model_id, taken_over);
        let (control, guard) = shared.registry.insert(claimed.clone());
        tasks.spawn(job::run(shared.clone(), claimed, control, guard));
    }
}

/// Stops claiming, waits up to the drain timeout for held jobs to finish, then has the rest
/// re-enqueued and waits for that.
async fn drain(shared: &Arc<Shared>, tasks: &mut JoinSet<()>) {
    shared.draining.store(true, Ordering::Relaxed);
    let held = shared.registry.len();
    tracing::info!(held, timeout = ?shared.config.drain_timeout, "draining");
    chores::heartbeat(shared).await;
    let deadline = Instant::now() + shared.config.drain_timeout;
    loop {
        tokio::select! {
            next = tasks.join_next() => if next.is_none() { break },
            _ = tokio::time::sleep_until(deadline) => {
                let left = shared.registry.len();
                tracing::info!(left, "drain timeout: re-enqueueing unfinished jobs");
                shared.registry.signal_all(registry::Control::Drain);
                while tasks.join_next().await.is_some() {}
                break;
            }
        }
    }
}

/// Runs a worker for `model` on `broker` until `shutdown` completes (see [`Worker::run`]).
pub async fn run(
    model: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, WorkerError> {
    Ok(Worker::new(model, broker, config)?.run(shutdown).await)
}
