//! The `ModelPool` reconciler: validates the pool, gathers the Models that name it (their
//! downloads become the pool pods' init containers), server-side applies `{pool}-spot` and
//! `{pool}-ondemand`, and patches the status (ready workers, models, conditions).
//!
//! The worker count is left where it is once a Deployment exists; a new one starts at the
//! pool's floor (`minWorkers`, with `baseOnDemandReplicas` on demand). Moving models onto
//! workers and sizing the count on the models' summed demand is the assignment loop's
//! (`tidal_autoscaler::pool::plan`), which is not run here. Owner references remove the
//! Deployments with the pool, so a pool needs no finaliser.

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
use crate::names::{deployment_name, CAPACITIES, FIELD_MANAGER, MAX_NAME_LEN};
use crate::pool_deployment::{build_pool, PoolModel};
use crate::reconcile::to_time;
use crate::report::carry_transitions;

/// How often a pool's status is refreshed without a change to watch.
const RESYNC: Duration = Duration::from_secs(30);

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

/// Reconciles one `ModelPool` (the kube-runtime `Controller`'s reconcile function).
pub async fn reconcile_pool(pool: Arc<ModelPool>, ctx: Arc<Context>) -> Result<Action> {
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
            .and_then(|_| pool.spec.cache.volume())
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
        Ok(cache) => {
            let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
            for capacity in CAPACITIES {
                let dep = deployment_name(&name, capacity);
                let existing = ctx.deployments.get(&ObjectRef::new(&dep).within(&ns));
                let replicas = existing
                    .as_ref()
                    .and_then(|d| d.spec.as_ref()?.replicas)
                    .map(|r| u32::try_from(r).unwrap_or(0))
                    .unwrap_or_else(|| floor_workers(&pool, capacity));
                let ready = existing
                    .as_ref()
                    .and_then(|d| d.status.as_ref()?.ready_replicas)
                    .map_or(0, |r| u32::try_from(r).unwrap_or(0));
                let body = build_pool(
                    &pool,
                    &cache,
                    &models,
                    capacity,
                    replicas,
                    &ctx.settings.worker,
                );
                api.patch(
                    &dep,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await?;
                let s = match capacity {
                    CapacityType::Spot => &mut status.spot,
                    CapacityType::OnDemand => &mut status.on_demand,
                };
                s.desired = replicas;
                s.ready = ready;
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
        status.workers = previous.workers.clone();
    }
    status.conditions = conditions;
    if pool.status.as_ref() != Some(&status) {
        patch_pool_status(&ctx, &pool, &status).await?;
    }
    Ok(Action::requeue(RESYNC))
}

/// Back-off after a failed pool reconcile.
pub fn pool_error_policy(pool: Arc<ModelPool>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), error = %err, "pool reconcile failed");
    metrics::counter!("tidal_controller_reconcile_errors_total").increment(1);
    Action::requeue(Duration::from_secs(10))
}
