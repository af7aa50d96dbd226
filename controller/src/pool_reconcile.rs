//! The `ModelPool` reconciler, every tick: validates the pool, gathers the Models that name
//! it (their downloads become the pool pods' init containers, their files the workers'
//! `--pool-model` entries), runs the assignment loop ([`crate::pool_assign`]: models placed
//! on workers, the worker count decided, fleet time split across models), applies
//! `{pool}-spot` and `{pool}-ondemand` (server-side apply when the rendered Deployment
//! changed, else a patch of `spec.replicas` when the count did), and patches the status
//! (ready workers, each worker's models, conditions). Owner references remove the
//! Deployments with the pool, so a pool needs no finaliser.
//!
//! When the broker cannot be read, the worker count stays where it is (a new Deployment
//! starts at the pool's floor) and the `Placed` condition says why.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;
use tidal_crds::{CapacityMode, Model, ModelPool, ModelPoolStatus};
use tidal_queue::CapacityType;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::names::{deployment_name, model_id, CAPACITIES, FIELD_MANAGER, MAX_NAME_LEN};
use crate::pool_assign::{tick_pool, PoolMemory, PoolOutcome};
use crate::pool_deployment::{build_pool, PoolModel};
use crate::reconcile::flush_fleet_usage;
use crate::reconcile::to_time;
use crate::report::carry_transitions;

/// The Models in `ns` whose `spec.pool` is `pool`, in name order, with a valid spec.
pub fn pool_models<'a>(models: &'a [Arc<Model>], ns: &str, pool: &str) -> Vec<PoolModel<'a>> {
    let mut out: Vec<PoolModel<'a>> = models
        .iter()
        .filter(|m| m.namespace().as_deref() == Some(ns) && m.spec.pool.as_deref() == Some(pool))
        .filter(|m| m.spec.check_pooled().is_ok())
        .filter_map(|m| {
            Some(PoolModel {
                model: m.as_ref(),
                source: m.spec.source().ok()?,
            })
        })
        .collect();
    out.sort_by_key(|m| m.model.name_any());
    out
}

/// The workers a new Deployment of `capacity` starts with: the pool's floor, split as the
/// capacity mode says.
pub fn floor_workers(pool: &ModelPool, capacity: CapacityType) -> u32 {
    let min = pool.spec.scaling.min_workers;
    let base = pool.spec.capacity.base_on_demand_replicas.min(min);
    match (pool.spec.capacity.mode, capacity) {
        (CapacityMode::OnDemand, CapacityType::OnDemand) => min,
        (CapacityMode::OnDemand, CapacityType::Spot) => 0,
        (_, CapacityType::Spot) => min - base,
        (_, CapacityType::OnDemand) => base,
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

async fn patch_pool_status(
    ctx: &Context,
    pool: &ModelPool,
    status: &ModelPoolStatus,
) -> Result<()> {
    let ns = pool.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<ModelPool> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "ModelPool",
        "status": status,
    });
    api.patch_status(
        &pool.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await?;
    Ok(())
}

/// Forgets the loops of pools no longer in the cache (a pool has no finaliser, so nothing
/// reconciles it once it is deleted): their fleet time not yet in the ledger is recorded
/// first where the ledger takes it, and the pool's own open interval is dropped. Returns
/// the ids forgotten.
pub async fn forget_deleted_pools(ctx: &Context) -> Vec<String> {
    let gone: Vec<(String, PoolMemory)> = {
        let mut memory = ctx.pool_memory();
        let ids: Vec<String> = memory
            .keys()
            .filter(|id| {
                let (ns, name) = id.split_once('/').unwrap_or(("", id.as_str()));
                ctx.pools.get(&ObjectRef::new(name).within(ns)).is_none()
            })
            .cloned()
            .collect();
        ids.into_iter()
            .filter_map(|id| memory.remove(&id).map(|m| (id, m)))
            .collect()
    };
    let mut forgotten = Vec::with_capacity(gone.len());
    for (id, mut mem) in gone {
        if let Err(e) = flush_fleet_usage(ctx, &mut mem.unrecorded).await {
            tracing::warn!(pool = %id, error = %e, lost = mem.unrecorded.len(), "a deleted pool's fleet time could not be recorded");
        }
        ctx.meter().forget(&id);
        tracing::info!(pool = %id, "the pool is gone; its loop is forgotten");
        forgotten.push(id);
    }
    forgotten
}

/// Reconciles one `ModelPool` (the kube-runtime `Controller`'s reconcile function).
pub async fn reconcile_pool(pool: Arc<ModelPool>, ctx: Arc<Context>) -> Result<Action> {
    forget_deleted_pools(&ctx).await;
    let ns = pool.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = pool.name_any();
    let generation = pool.metadata.generation;
    let now = to_time((ctx.clock)());
    let all = ctx.models.state();
    let models = pool_models(&all, &ns, &name);
    let mut status = ModelPoolStatus {
        models: models.iter().map(|m| m.model.name_any()).collect(),
        observed_generation: generation,
        ..ModelPoolStatus::default()
    };
    status.model_count = u32::try_from(status.models.len()).unwrap_or(u32::MAX);
    let checked = if name.len() > MAX_NAME_LEN {
        Err(format!(
            "the name is longer than {MAX_NAME_LEN} characters (Deployment names and pod labels must fit)"
        ))
    } else {
        pool.spec
            .pool_spec()
            .and_then(|spec| Ok((spec, pool.spec.cache.volume()?)))
            .map_err(|e| e.to_string())
    };
    // a Deployment of the pool's name that the pool does not own (a Model's of the same
    // name) is never taken over
    let foreign = CAPACITIES.iter().find_map(|c| {
        let dep = deployment_name(&name, *c);
        let existing = ctx.deployments.get(&ObjectRef::new(&dep).within(&ns))?;
        let owned = existing
            .owner_references()
            .iter()
            .any(|o| o.kind == "ModelPool" && Some(&o.uid) == pool.uid().as_ref());
        (!owned).then(|| format!("Deployment {dep} belongs to another resource (a Model of the same name?): rename the pool"))
    });
    let checked = match (checked, foreign) {
        (Ok(cache), None) => Ok(cache),
        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
    };
    let mut conditions = Vec::new();
    match checked {
        Ok((spec, cache)) => {
            let pool_id = model_id(&ns, &name);
            let ids: Vec<String> = models
                .iter()
                .map(|m| model_id(&ns, &m.model.name_any()))
                .collect();
            let clock_now = (ctx.clock)();
            let mut mem = ctx.pool_memory().remove(&pool_id).unwrap_or_default();
            let due = ctx.settings.pool_tick_due(mem.ticked_at, clock_now);
            let outcome: Result<PoolOutcome, String> = match (&mem.last, due) {
                (Some(last), false) => Ok(last.clone()),
                _ => tick_pool(&ctx, &pool, &pool_id, spec, &ids, &mut mem, clock_now)
                    .await
                    .map_err(|e| {
                        tracing::warn!(pool = %pool_id, error = %e, "pool tick failed");
                        e.to_string()
                    }),
            };
            let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
            let applied = apply_deployments(
                &ctx,
                &api,
                &pool,
                &cache,
                &models,
                outcome.as_ref().ok(),
                &mut mem,
                &mut status,
            )
            .await;
            ctx.pool_memory().insert(pool_id, mem);
            applied?;
            match &outcome {
                Ok(o) => {
                    status.workers = o.workers.clone();
                    conditions.push(if o.problems.is_empty() {
                        condition(
                            "Placed",
                            true,
                            "AllPlaced",
                            "every model with work is placed on a worker".into(),
                            generation,
                            &now,
                        )
                    } else {
                        condition(
                            "Placed",
                            false,
                            "NotPlaced",
                            o.problems.join("; "),
                            generation,
                            &now,
                        )
                    });
                }
                Err(e) => {
                    // no heartbeats read: the workers last seen stand
                    status.workers = pool
                        .status
                        .as_ref()
                        .map(|p| p.workers.clone())
                        .unwrap_or_default();
                    conditions.push(Condition {
                        status: "Unknown".into(),
                        ..condition(
                            "Placed",
                            false,
                            "QueueUnavailable",
                            format!("the broker cannot be read, the worker count is kept: {e}"),
                            generation,
                            &now,
                        )
                    });
                }
            }
            status.ready_workers = status.spot.ready + status.on_demand.ready;
            conditions.push(condition(
                "SpecValid",
                true,
                "Valid",
                "the spec is valid".into(),
                generation,
                &now,
            ));
            let ready = status.ready_workers > 0;
            conditions.push(condition(
                "Ready",
                ready,
                if ready {
                    "WorkersReady"
                } else {
                    "NoReadyWorker"
                },
                format!("{} ready workers", status.ready_workers),
                generation,
                &now,
            ));
        }
        Err(message) => {
            tracing::warn!(pool = %name, %message, "invalid pool");
            conditions.push(condition(
                "SpecValid",
                false,
                "InvalidSpec",
                message,
                generation,
                &now,
            ));
        }
    }
    if let Some(previous) = &pool.status {
        carry_transitions(&mut conditions, &previous.conditions);
    }
    status.conditions = conditions;
    if pool.status.as_ref() != Some(&status) {
        patch_pool_status(&ctx, &pool, &status).await?;
    }
    Ok(Action::requeue(ctx.settings.pool_tick))
}

/// Applies both Deployments of the pool with the outcome's worker counts (without one, the
/// counts they have, or the floor for a new one): the whole object when its rendering
/// changed since the last apply, else only `spec.replicas` when the count changed.
#[allow(clippy::too_many_arguments)]
async fn apply_deployments(
    ctx: &Context,
    api: &Api<Deployment>,
    pool: &ModelPool,
    cache: &tidal_crds::CacheVolume,
    models: &[PoolModel<'_>],
    outcome: Option<&PoolOutcome>,
    mem: &mut crate::pool_assign::PoolMemory,
    status: &mut ModelPoolStatus,
) -> Result<()> {
    let ns = pool.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = pool.name_any();
    for capacity in CAPACITIES {
        let dep = deployment_name(&name, capacity);
        let existing = ctx.deployments.get(&ObjectRef::new(&dep).within(&ns));
        let current = existing
            .as_ref()
            .and_then(|d| d.spec.as_ref()?.replicas)
            .map(|r| u32::try_from(r).unwrap_or(0));
        let replicas = match (outcome, capacity) {
            (Some(o), CapacityType::Spot) => o.spot,
            (Some(o), CapacityType::OnDemand) => o.on_demand,
            (None, _) => current.unwrap_or_else(|| floor_workers(pool, capacity)),
        };
        let ready = existing
            .as_ref()
            .and_then(|d| d.status.as_ref()?.ready_replicas)
            .map_or(0, |r| u32::try_from(r).unwrap_or(0));
        // rendered without the count: a scale is a patch, not a new apply
        let rendered = build_pool(pool, cache, models, capacity, 0, &ctx.settings.worker);
        if existing.is_none() || mem.applied.get(&dep) != Some(&rendered) {
            let mut body = rendered.clone();
            if let Some(spec) = body.spec.as_mut() {
                spec.replicas = Some(i32::try_from(replicas).unwrap_or(i32::MAX));
            }
            api.patch(
                &dep,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
            mem.applied.insert(dep.clone(), rendered);
            tracing::info!(deployment = %dep, replicas, "applied pool deployment");
        } else if current != Some(replicas) {
            api.patch(
                &dep,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
            )
            .await?;
            tracing::info!(deployment = %dep, from = ?current, to = replicas, "scaled pool");
        }
        let s = match capacity {
            CapacityType::Spot => &mut status.spot,
            CapacityType::OnDemand => &mut status.on_demand,
        };
        s.desired = replicas;
        s.ready = ready;
    }
    Ok(())
}

/// Back-off after a failed pool reconcile.
pub fn pool_error_policy(pool: Arc<ModelPool>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), error = %err, "pool reconcile failed");
    metrics::counter!("tidal_controller_reconcile_errors_total").increment(1);
    Action::requeue(Duration::from_secs(10))
}
