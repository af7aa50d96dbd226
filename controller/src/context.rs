//! What every reconcile shares: clients, caches of the cluster, the per-Model memory, the
//! clock, and the settings that come from the command line.
//!
//! The policy's window state lives here, in memory, per Model: a restarted (or newly
//! elected) controller starts with empty windows, so for one stable window it decides from
//! fewer samples. That is acceptable: activation and scale-to-zero depend on the current
//! queue, not on history.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::Store;
use kube::Client;
use tidal_autoscaler::{Decision, PolicyState, ScalingSpec};
use tidal_billing::{FleetUsage, Ledger, Prices};
use tidal_crds::{Model, ModelPool, ModelStatus};
use tidal_queue::{Broker, ModelRecord};

use crate::deployment::WorkerConfig;
use crate::events::Events;
use crate::fleet_time::FleetMeter;
use crate::model_metrics::ModelMetrics;
use crate::pool_assign::PoolMemory;

/// A clock the controller reads (injected so tests control time).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often each Model is reconciled (the autoscaler's tick), and how often a pool's
    /// worker count is decided.
    pub tick: Duration,
    /// How often each ModelPool places its models (assignments written): a model with
    /// queued work and no holder waits up to this long before a worker is told to load it.
    pub pool_tick: Duration,
    /// The workers' settings.
    pub worker: WorkerConfig,
    /// Consumer name the finaliser uses to withdraw queued jobs.
    pub consumer: String,
    /// Extra time after `drainTimeoutSeconds` that a deleted Model's in-flight jobs get
    /// before the finaliser takes them over and fails them.
    pub delete_grace: Duration,
}

impl Settings {
    /// Whether a decision last made at `last` is due again at `now`: other events reconcile
    /// an object too, but the policy decides once per tick (its rate limits are per
    /// decision); a tenth of the tick is slack for a reconcile that runs a little early.
    pub fn tick_due(&self, last: Option<SystemTime>, now: SystemTime) -> bool {
        due(self.tick, last, now)
    }

    /// Whether a pool placed last at `last` places again at `now` (as [`Self::tick_due`],
    /// at `pool_tick`).
    pub fn pool_tick_due(&self, last: Option<SystemTime>, now: SystemTime) -> bool {
        due(self.pool_tick, last, now)
    }
}

fn due(every: Duration, last: Option<SystemTime>, now: SystemTime) -> bool {
    last.is_none_or(|t| now.duration_since(t).unwrap_or_default() >= every.mul_f64(0.9))
}

/// What the controller remembers about one Model between ticks.
#[derive(Debug)]
pub struct Memory {
    /// The autoscaling policy's windows.
    pub policy: PolicyState,
    /// The scaling spec the windows were made for.
    pub scaling: Option<ScalingSpec>,
    /// The last decision.
    pub decision: Option<Decision>,
    /// When it was made: Deployment changes also trigger reconciles, but the policy decides
    /// once per tick (its rate limits are per decision).
    pub decided_at: Option<SystemTime>,
    /// The generation whose Deployments were last applied.
    pub applied_generation: Option<i64>,
    /// Prices known to be in the ledger.
    pub published_prices: Option<Prices>,
    /// The record last written to the broker.
    pub record: Option<ModelRecord>,
    /// The status last written.
    pub status: Option<ModelStatus>,
    /// When work was last seen.
    pub last_request: Option<SystemTime>,
    /// The generation an InvalidSpec event was emitted for.
    pub invalid_generation: Option<i64>,
    /// Closed fleet-time intervals the ledger has not taken yet (retried each tick).
    pub unrecorded: Vec<(String, FleetUsage)>,
}

/// Nothing remembered yet: the policy's windows take their size from the first spec adopted
/// (`PolicyState::respec`).
impl Default for Memory {
    fn default() -> Self {
        Memory {
            policy: PolicyState::new(&ScalingSpec::default()),
            scaling: None,
            decision: None,
            decided_at: None,
            applied_generation: None,
            published_prices: None,
            record: None,
            status: None,
            last_request: None,
            invalid_generation: None,
            unrecorded: Vec::new(),
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// The queue.
    pub broker: Arc<dyn Broker>,
    /// The ledger (prices, fleet time).
    pub ledger: Ledger,
    /// The Models' Kubernetes Events.
    pub events: Events,
    /// The per-Model series of `/metrics` (`run` shares it with the HTTP server).
    pub model_metrics: Arc<ModelMetrics>,
    /// The Models' pods (label `tidal.dev/model`).
    pub pods: Store<Pod>,
    /// Nodes (for interruption signals).
    pub nodes: Store<Node>,
    /// The controller's Deployments.
    pub deployments: Store<Deployment>,
    /// The `ModelPool`s (empty until `run` sets its cache).
    pub pools: Store<ModelPool>,
    /// The pools' pods (label `tidal.dev/pool`; empty until `run` sets its cache).
    pub pool_pods: Store<Pod>,
    /// The Models, as the pool reconciler reads them (empty until `run` sets its cache).
    pub models: Store<Model>,
    /// Settings.
    pub settings: Settings,
    /// The clock.
    pub clock: Clock,
    memory: Mutex<HashMap<String, Memory>>,
    pool_memory: Mutex<HashMap<String, PoolMemory>>,
    meter: Mutex<FleetMeter>,
}

impl Context {
    /// A context over these clients and caches.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        broker: Arc<dyn Broker>,
        ledger: Ledger,
        pods: Store<Pod>,
        nodes: Store<Node>,
        deployments: Store<Deployment>,
        settings: Settings,
        clock: Clock,
    ) -> Self {
        Context {
            events: Events::new(
                client.clone(),
                "tidal-controller",
                std::env::var("POD_NAME").ok(),
            ),
            model_metrics: Arc::new(ModelMetrics::new()),
            client,
            broker,
            ledger,
            pods,
            nodes,
            deployments,
            pools: kube::runtime::reflector::store().0,
            pool_pods: kube::runtime::reflector::store().0,
            models: kube::runtime::reflector::store().0,
            settings,
            clock,
            memory: Mutex::new(HashMap::new()),
            pool_memory: Mutex::new(HashMap::new()),
            meter: Mutex::new(FleetMeter::default()),
        }
    }

    /// The per-Model memory (a poisoned lock is recovered: the memory is a cache).
    pub fn memory(&self) -> MutexGuard<'_, HashMap<String, Memory>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The per-pool memory (a poisoned lock is recovered: the memory is a cache).
    pub fn pool_memory(&self) -> MutexGuard<'_, HashMap<String, PoolMemory>> {
        self.pool_memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fleet meter.
    pub fn meter(&self) -> MutexGuard<'_, FleetMeter> {
        self.meter.lock().unwrap_or_else(|p| p.into_inner())
    }
}
