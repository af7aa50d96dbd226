//! The pool worker's loop: what it holds (loading, serving, unloading), the commands and
//! assignment that change it, and the events of load steps and drains that finish. A load
//! is two blocking steps ([`super::loading`]): its plan (checksum, then the memory it will
//! take), checked here against the memory left, then the load itself.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tidal_queue::clock::system_now_ms;
use tidal_queue::Broker;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{interval, MissedTickBehavior};

use super::host_cache::HostCache;
use super::model_dir::{ModelDir, ModelEntry};
use super::{beat, loading, Command, PoolConfig, PoolError, PoolSnapshot};
use crate::load::Loaded;
use crate::server::LoadedModel;
use crate::worker::{AbortOnDrop, Worker, WorkerStatus, WorkerSummary};

type LoadReply = oneshot::Sender<Result<f64, PoolError>>;
type UnloadReply = oneshot::Sender<Result<WorkerSummary, PoolError>>;

/// A model whose worker runs (serving, or draining for an unload).
pub(super) struct Slot {
    pub entry: ModelEntry,
    /// Memory it takes (its plan's weights, KV cache and activations).
    pub bytes: u64,
    pub model: Arc<LoadedModel>,
    pub status: WorkerStatus,
    /// Sent to start the drain; `None` once sent.
    stop: Option<oneshot::Sender<()>>,
    _task: AbortOnDrop,
    pub last_used_ms: u64,
    unload_waiters: Vec<UnloadReply>,
}

/// A model on its way in.
pub(super) struct Loading {
    entry: ModelEntry,
    /// Memory reserved for it: the file's size while its plan is worked out (a first
    /// estimate, so that loads started meanwhile count it), then the plan's total.
    bytes: u64,
    waiters: Vec<LoadReply>,
    /// An unload asked for while loading: done as soon as the current step ends.
    unload_waiters: Vec<UnloadReply>,
    unload: bool,
}

/// Where a held model stands.
pub(super) enum Held {
    Loading(Loading),
    Serving(Slot),
    Unloading(Slot),
}

impl Held {
    /// Memory it takes or has reserved.
    pub fn bytes(&self) -> u64 {
        match self {
            Held::Loading(l) => l.bytes,
            Held::Serving(s) | Held::Unloading(s) => s.bytes,
        }
    }
}

/// Something that finished off the loop.
enum Event {
    /// A load's first step: the bytes the model will take.
    Planned(String, Result<u64, PoolError>),
    Loaded(String, Box<Result<Loaded, PoolError>>),
    Stopped(String, WorkerSummary),
}

/// What [`super::PoolHandle`] reads.
#[derive(Default)]
pub(super) struct View {
    loaded: Vec<(String, WorkerStatus)>,
    loading: Vec<String>,
    unloading: Vec<(String, WorkerStatus)>,
    draining: bool,
}

impl View {
    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            loaded: self.loaded.iter().map(|(m, _)| m.clone()).collect(),
            loading: self.loading.clone(),
            unloading: self.unloading.iter().map(|(m, _)| m.clone()).collect(),
            jobs: self
                .loaded
                .iter()
                .chain(&self.unloading)
                .map(|(_, s)| s.held())
                .sum(),
            draining: self.draining,
        }
    }
}

/// The loop's state.
pub(super) struct Pool {
    pub config: Arc<PoolConfig>,
    pub dir: Arc<ModelDir>,
    pub broker: Arc<dyn Broker>,
    commands: mpsc::UnboundedReceiver<Command>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    view: Arc<Mutex<View>>,
    pub held: BTreeMap<String, Held>,
    /// Models that failed to load, with why; not tried again while they stay assigned.
    pub failed: BTreeMap<String, String>,
    /// The last assignment read (`None`: none written).
    assignment: Option<Vec<String>>,
    pub host_cache: HostCache,
    pub draining: bool,
    summaries: Vec<(String, WorkerSummary)>,
}

impl Pool {
    pub fn new(
        config: Arc<PoolConfig>,
        dir: Arc<ModelDir>,
        broker: Arc<dyn Broker>,
        commands: mpsc::UnboundedReceiver<Command>,
        view: Arc<Mutex<View>>,
    ) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        Pool {
            host_cache: HostCache::new(config.host_cache_bytes),
            config,
            dir,
            broker,
            commands,
            events_tx,
            events,
            view,
            held: BTreeMap::new(),
            failed: BTreeMap::new(),
            assignment: None,
            draining: false,
            summaries: Vec::new(),
        }
    }

    /// Memory that models may still take.
    pub fn free_bytes(&self) -> u64 {
        let used: u64 = self.held.values().map(Held::bytes).sum();
        self.config.memory_bytes.saturating_sub(used)
    }

    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Vec<(String, WorkerSummary)> {
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut beat = interval(self.config.worker.heartbeat_interval);
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut poll = interval(self.config.assignment_poll);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut commands_open = true;
        tracing::info!(
            pool = %self.config.pool,
            worker = %self.config.worker.name,
            memory_bytes = self.config.memory_bytes,
            model_dir = %self.dir.root().display(),
            "pool worker started"
        );
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                cmd = self.commands.recv(), if commands_open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => commands_open = false,
                },
                Some(event) = self.events.recv() => self.event(event),
                _ = poll.tick() => self.follow_assignment().await,
                _ = beat.tick() => beat::write(&mut self).await,
            }
            self.publish();
        }
        self.shut_down().await
    }

    /// Stops claiming everywhere, drains every model and waits for the loads in flight.
    async fn shut_down(mut self) -> Vec<(String, WorkerSummary)> {
        self.draining = true;
        tracing::info!(held = self.held.len(), "pool worker draining");
        let models: Vec<String> = self.held.keys().cloned().collect();
        for m in models {
            self.unload(&m, None);
        }
        self.publish();
        beat::write(&mut self).await;
        while !self.held.is_empty() {
            match self.events.recv().await {
                Some(event) => self.event(event),
                None => break,
            }
            self.publish();
        }
        beat::write(&mut self).await;
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Load(_, r) => drop(r.send(Err(PoolError::Stopped))),
                Command::Unload(_, r) => drop(r.send(Ok(WorkerSummary::default()))),
            }
        }
        tracing::info!("pool worker stopped");
        std::mem::take(&mut self.summaries)
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Load(model, reply) => {
                // An explicit command tries a failed model again.
                self.failed.remove(&model);
                self.load(&model, Some(reply));
            }
            Command::Unload(model, reply) => self.unload(&model, Some(reply)),
        }
    }

    /// Reads this worker's assignment and loads and unloads to match it.
    async fn follow_assignment(&mut self) {
        if self.draining {
            return;
        }
        let got = self
            .broker
            .pool_assignment(&self.config.pool, &self.config.worker.name)
            .await;
        let assigned = match got {
            Ok(Some(a)) => a,
            Ok(None) => {
                self.assignment = None;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pool assignment");
                return;
            }
        };
        let want: BTreeSet<&String> = assigned.iter().collect();
        self.failed.retain(|m, _| want.contains(m));
        let drop: Vec<String> = self
            .held
            .keys()
            .filter(|m| !want.contains(m))
            .cloned()
            .collect();
        for m in drop {
            self.unload(&m, None);
        }
        for m in &assigned {
            if !self.held.contains_key(m) && !self.failed.contains_key(m) {
                self.load(m, None);
            }
        }
        self.assignment = Some(assigned);
    }

    fn fail(&mut self, model: &str, e: PoolError, reply: Option<LoadReply>) {
        tracing::warn!(model, error = %e, "model not loaded");
        super::beat::load_failed(model);
        self.failed.insert(model.to_owned(), e.to_string());
        if let Some(r) = reply {
            let _ = r.send(Err(e));
        }
    }

    /// Starts loading `model` on a blocking thread (nothing when it is loading or loaded).
    fn load(&mut self, model: &str, reply: Option<LoadReply>) {
        if self.draining {
            if let Some(r) = reply {
                let _ = r.send(Err(PoolError::Stopped));
            }
            return;
        }
        match self.held.get_mut(model) {
            Some(Held::Serving(_)) => {
                if let Some(r) = reply {
                    let _ = r.send(Ok(0.0));
                }
                return;
            }
            Some(Held::Loading(l)) => {
                l.waiters.extend(reply);
                return;
            }
            Some(Held::Unloading(_)) => {
                if let Some(r) = reply {
                    let _ = r.send(Err(PoolError::Unloading(model.to_owned())));
                }
                return;
            }
            None => {}
        }
        let entry = match self.dir.resolve(model) {
            Ok(e) => e,
            Err(e) => return self.fail(model, e, reply),
        };
        tracing::info!(model, path = %entry.path.display(), file_bytes = entry.bytes, "loading");
        let (dir, engine, quantize) = (
            self.dir.clone(),
            self.config.engine.clone(),
            self.config.quantize,
        );
        let events = self.events_tx.clone();
        let (id, job_entry) = (model.to_owned(), entry.clone());
        // Not aborted on shutdown (a blocking step cannot be): its result is dropped.
        tokio::task::spawn_blocking(move || {
            let planned = loading::plan(&dir, &job_entry, &engine, quantize);
            let _ = events.send(Event::Planned(id, planned));
        });
        self.held.insert(
            model.to_owned(),
            Held::Loading(Loading {
                bytes: entry.bytes,
                entry,
                waiters: reply.into_iter().collect(),
                unload_waiters: Vec::new(),
                unload: false,
            }),
        );
    }

    /// A load's plan is done: refuse it when it does not fit the memory left (nothing is
    /// allocated yet), else start its second step.
    fn planned(&mut self, model: String, result: Result<u64, PoolError>) {
        let Some(Held::Loading(mut l)) = self.held.remove(&model) else {
            return;
        };
        // Its own reservation is already out of `held`.
        let free = self.free_bytes();
        let failed = match result {
            Err(e) => Some(e),
            Ok(bytes) if bytes > free => Some(PoolError::DoesNotFit {
                model: model.clone(),
                bytes,
                free,
            }),
            Ok(bytes) => {
                l.bytes = bytes;
                None
            }
        };
        // Unloaded or shut down meanwhile: the weights are not loaded at all.
        let cancelled = (l.unload || self.draining || self.unassigned(&model)).then(|| {
            if self.draining {
                PoolError::Stopped
            } else {
                PoolError::Unloading(model.clone())
            }
        });
        let refused = match (&failed, cancelled) {
            (Some(e), _) => e.clone(),
            (None, Some(e)) => e,
            (None, None) => return self.load_weights(model, l),
        };
        // What a waiter sees in the snapshot once it has its answer: the load is gone.
        self.publish();
        for w in l.waiters {
            let _ = w.send(Err(refused.clone()));
        }
        for w in l.unload_waiters {
            let _ = w.send(Ok(WorkerSummary::default()));
        }
        if let Some(e) = failed {
            self.fail(&model, e, None);
        }
    }

    /// A load's second step: the weights into an engine, on a blocking thread.
    fn load_weights(&mut self, model: String, l: Loading) {
        tracing::info!(
            model,
            bytes = l.bytes,
            "memory plan fits: loading the weights"
        );
        let (engine, quantize) = (self.config.engine.clone(), self.config.quantize);
        let events = self.events_tx.clone();
        let (id, entry) = (model.clone(), l.entry.clone());
        tokio::task::spawn_blocking(move || {
            let loaded = loading::load(&entry, engine, quantize);
            let _ = events.send(Event::Loaded(id, Box::new(loaded)));
        });
        self.held.insert(model, Held::Loading(l));
    }

    /// Whether an assignment is followed and leaves `model` out.
    fn unassigned(&self, model: &str) -> bool {
        self.assignment
            .as_ref()
            .is_some_and(|a| !a.iter().any(|m| m == model))
    }

    /// Starts unloading `model`: its worker drains.
    fn unload(&mut self, model: &str, reply: Option<UnloadReply>) {
        match self.held.remove(model) {
            None => {
                if let Some(r) = reply {
                    let _ = r.send(Ok(WorkerSummary::default()));
                }
            }
            Some(Held::Loading(mut l)) => {
                l.unload_waiters.extend(reply);
                l.unload = true;
                self.held.insert(model.to_owned(), Held::Loading(l));
            }
            Some(Held::Serving(mut slot)) | Some(Held::Unloading(mut slot)) => {
                if let Some(stop) = slot.stop.take() {
                    tracing::info!(model, jobs = slot.status.held(), "unloading: draining");
                    let _ = stop.send(());
                }
                slot.unload_waiters.extend(reply);
                self.held.insert(model.to_owned(), Held::Unloading(slot));
            }
        }
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Planned(model, result) => self.planned(model, result),
            Event::Loaded(model, result) => self.loaded(model, *result),
            Event::Stopped(model, summary) => {
                // Serving too: a worker that ended by itself is gone all the same.
                let slot = match self.held.remove(&model) {
                    Some(Held::Unloading(slot)) | Some(Held::Serving(slot)) => slot,
                    Some(other) => {
                        self.held.insert(model, other);
                        return;
                    }
                    None => return,
                };
                tracing::info!(model, ?summary, "unloaded");
                self.host_cache
                    .unloaded(&model, slot.entry.path.clone(), slot.entry.bytes);
                for w in slot.unload_waiters {
                    let _ = w.send(Ok(summary));
                }
                self.summaries.push((model, summary));
                // `slot.model` drops here: the engine stops once its worker's handles are gone.
            }
        }
    }

    /// A load ended: start the model's worker, or record why it failed.
    fn loaded(&mut self, model: String, result: Result<Loaded, PoolError>) {
        let Some(Held::Loading(Loading {
            entry,
            bytes,
            waiters,
            unload_waiters,
            unload,
        })) = self.held.remove(&model)
        else {
            return;
        };
        let loaded = match result {
            Ok(l) => l,
            Err(e) => {
                for w in waiters {
                    let _ = w.send(Err(e.clone()));
                }
                for w in unload_waiters {
                    let _ = w.send(Ok(WorkerSummary::default()));
                }
                return self.fail(&model, e, None);
            }
        };
        let seconds = loaded.load_seconds;
        let lm = Arc::new(loaded.into_model());
        let worker = match Worker::new(
            lm.clone(),
            self.broker.clone(),
            self.config.worker_config(&model),
        ) {
            Ok(w) => w,
            Err(e) => {
                let e = PoolError::Load {
                    model: model.clone(),
                    reason: e.to_string(),
                };
                for w in waiters {
                    let _ = w.send(Err(e.clone()));
                }
                return self.fail(&model, e, None);
            }
        };
        let status = worker.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let events = self.events_tx.clone();
        let id = model.clone();
        let task = tokio::spawn(async move {
            let summary = worker
                .run(async move {
                    let _ = stopped.await;
                })
                .await;
            let _ = events.send(Event::Stopped(id, summary));
        });
        tracing::info!(model, seconds = format!("{seconds:.3}"), "model serving");
        super::beat::loaded(&model, seconds);
        self.host_cache.loaded(&model);
        self.held.insert(
            model.clone(),
            Held::Serving(Slot {
                entry,
                bytes,
                model: lm,
                status,
                stop: Some(stop),
                _task: AbortOnDrop(task),
                last_used_ms: system_now_ms(),
                unload_waiters,
            }),
        );
        // What a waiter sees in the snapshot once it has its answer: the model is serving.
        self.publish();
        for w in waiters {
            let _ = w.send(Ok(seconds));
        }
        if unload || self.unassigned(&model) || self.draining {
            self.unload(&model, None);
        }
    }

    /// Updates what [`super::PoolHandle`] shows.
    fn publish(&self) {
        let mut view = self.view.lock().unwrap_or_else(|e| e.into_inner());
        view.loaded.clear();
        view.loading.clear();
        view.unloading.clear();
        for (m, h) in &self.held {
            match h {
                Held::Loading(_) => view.loading.push(m.clone()),
                Held::Serving(s) => view.loaded.push((m.clone(), s.status.clone())),
                Held::Unloading(s) => view.unloading.push((m.clone(), s.status.clone())),
            }
        }
        view.draining = self.draining;
    }
}

/// When a model was last used: now if it holds jobs, else as before.
pub(super) fn touch(slot: &mut Slot, now_ms: u64) -> u64 {
    if slot.status.held() > 0 {
        slot.last_used_ms = now_ms;
    }
    slot.last_used_ms
}
