//! One tick of a `ModelPool`'s assignment loop ([`tidal_pool::PoolDriver`]): the pool's pods
//! counted per capacity type, the workers' heartbeats and the models' queues read, models
//! placed on workers (assignments written to the broker), the worker count decided, and
//! each worker's time split across the models it served into the fleet-time ledger.
//!
//! The fleet-time rows of a pool are per model, at the pool's replica-hour price, so the
//! platform cost report shows each model's share as if it had its own fleet; the time no
//! model used (a worker starting, or up with nothing loaded) is a row under the pool's own
//! id (`namespace/pool`).

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tidal_autoscaler::pool::{Condition as Placement, Payer, PoolSpec};
use tidal_billing::FleetUsage;
use tidal_crds::{ModelPool, PoolWorkerStatus};
use tidal_pool::{PoolDriver, PoolTick};
use tidal_queue::CapacityType;

use crate::context::Context;
use crate::error::Result;
use crate::names::{capacity_value, CAPACITY_LABEL, POOL_LABEL};
use crate::observe::{observe_pool, PoolObservation};
use crate::reconcile::{flush_fleet_usage, keep_unrecorded};

/// What the controller remembers about one pool between ticks.
#[derive(Debug, Default)]
pub struct PoolMemory {
    /// The assignment loop (created at the first tick).
    pub driver: Option<PoolDriver>,
    /// When the loop last ran: other events reconcile the pool too, but it runs once per
    /// `pool_tick` (and decides the worker count once per `tick`).
    pub ticked_at: Option<SystemTime>,
    /// The last outcome, reused between ticks.
    pub last: Option<PoolOutcome>,
    /// Payers (model or pool id, capacity type) charged fleet time so far: each is charged
    /// every tick, 0 when it has no share, so that its last minute closes.
    pub payers: HashSet<(String, CapacityType)>,
    /// Closed fleet-time intervals the ledger has not taken yet (retried each tick).
    pub unrecorded: Vec<(String, FleetUsage)>,
    /// Each Deployment as last applied, rendered with no replicas.
    pub applied: HashMap<String, Deployment>,
}

/// What a tick decided and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOutcome {
    /// Desired spot workers.
    pub spot: u32,
    /// Desired on-demand workers.
    pub on_demand: u32,
    /// Each live worker and the models it holds.
    pub workers: Vec<PoolWorkerStatus>,
    /// Models the pool cannot serve as asked (too large, at the worker limit, failed
    /// loads), for operators; empty when every model with work is placed.
    pub problems: Vec<String>,
}

/// The pool's pods of `capacity`, as a Model's fleet is observed.
pub fn observe_pool_pods(
    ctx: &Context,
    ns: &str,
    pool: &str,
    capacity: CapacityType,
) -> PoolObservation {
    let value = capacity_value(capacity);
    let pods: Vec<std::sync::Arc<Pod>> = ctx.pool_pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(POOL_LABEL).map(String::as_str) == Some(pool)
            && p.labels().get(CAPACITY_LABEL).map(String::as_str) == Some(value)
    });
    observe_pool(pods.iter().map(|p| p.as_ref()), |node| {
        ctx.nodes.get(&ObjectRef::new(node))
    })
}

/// The status of the live workers, from their heartbeats.
pub fn worker_statuses(tick: &PoolTick) -> Vec<PoolWorkerStatus> {
    tick.beats
        .iter()
        .map(|b| {
            let mut models: Vec<String> = b
                .loaded
                .iter()
                .map(|l| l.model.clone())
                .chain(b.loading.iter().cloned())
                .collect();
            models.sort();
            PoolWorkerStatus {
                name: b.worker.clone(),
                node: (!b.node.is_empty()).then(|| b.node.clone()),
                models,
            }
        })
        .collect()
}

/// Why models are not served as asked: the placement's conditions and the workers' failed
/// loads, one line each.
pub fn problems(tick: &PoolTick) -> Vec<String> {
    let mut out: Vec<String> = tick
        .plan
        .conditions
        .iter()
        .map(|c| match c {
            Placement::TooLarge {
                model,
                memory_bytes,
                worker_memory_bytes,
            } => format!(
                "{model} needs {memory_bytes} bytes, more than a worker's {worker_memory_bytes} (workerMemoryBytes)"
            ),
            Placement::AtMaxWorkers { model } => {
                format!("{model} has work and no worker: the pool is at maxWorkers")
            }
        })
        .collect();
    for b in &tick.beats {
        for f in &b.failed {
            out.push(format!(
                "{} could not load {}: {}",
                b.worker, f.model, f.error
            ));
        }
    }
    out
}

/// Runs one tick of `pool` (id `pool_id`) serving `models` (ids) at `now`.
pub async fn tick_pool(
    ctx: &Context,
    pool: &ModelPool,
    pool_id: &str,
    spec: PoolSpec,
    models: &[String],
    mem: &mut PoolMemory,
    now: SystemTime,
) -> Result<PoolOutcome> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let spot = observe_pool_pods(ctx, &ns, &name, CapacityType::Spot);
    let on_demand = observe_pool_pods(ctx, &ns, &name, CapacityType::OnDemand);
    let driver = mem
        .driver
        .get_or_insert_with(|| PoolDriver::new(pool_id, spec.clone()));
    driver.respec(spec);
    driver.decide_every = ctx.settings.tick;
    let tick = driver
        .tick(
            ctx.broker.as_ref(),
            models,
            spot.capacity,
            on_demand.capacity,
            now,
        )
        .await?;
    mem.ticked_at = Some(now);
    if let Some(shares) = &tick.shares {
        let mut charged: Vec<(String, CapacityType, u64)> = shares
            .parts
            .iter()
            .map(|(payer, capacity, ms)| {
                let id = match payer {
                    Payer::Model(m) => m.clone(),
                    Payer::Pool => pool_id.to_string(),
                };
                (id, *capacity, *ms)
            })
            .collect();
        for (id, capacity) in &mem.payers {
            if !charged.iter().any(|(i, c, _)| i == id && c == capacity) {
                charged.push((id.clone(), *capacity, 0));
            }
        }
        for (id, capacity, ms) in charged {
            let closed = ctx
                .meter()
                .charge(&id, capacity, ms, shares.from_ms, shares.to_ms);
            let price = match capacity {
                CapacityType::Spot => pool.spec.capacity.spot.cost_per_replica_hour_micros,
                CapacityType::OnDemand => pool.spec.capacity.on_demand.cost_per_replica_hour_micros,
            };
            keep_unrecorded(&mut mem.unrecorded, closed, price);
            mem.payers.insert((id, capacity));
        }
    }
    if let Err(e) = flush_fleet_usage(ctx, &mut mem.unrecorded).await {
        tracing::warn!(pool = %pool_id, error = %e, "recording the pool's fleet time failed");
    }
    let outcome = PoolOutcome {
        spot: tick.plan.workers.spot,
        on_demand: tick.plan.workers.on_demand,
        workers: worker_statuses(&tick),
        problems: problems(&tick),
    };
    mem.last = Some(outcome.clone());
    Ok(outcome)
}
