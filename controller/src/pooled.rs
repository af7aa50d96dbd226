//! One tick of a Model served by a `ModelPool` (`spec.pool`): it has no Deployments of its
//! own (those it had before it joined the pool are deleted), its prices go to the ledger and
//! its record to the broker as for any Model (so routing, admission and billing do not
//! change), and its status says which pool serves it. Which pool worker loads it is the
//! pool's assignment, not this tick's.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tidal_crds::{Model, ModelPool, ModelStatus, Phase};
use tidal_queue::{ModelRecord, ModelState, QueueDepth};

use crate::context::{Context, Memory};
use crate::error::Result;
use crate::names::{deployment_name, model_id, CAPACITIES};
use crate::reconcile::{patch_status, publish_prices, queue_prices, to_time};
use crate::report::carry_transitions;

/// Condition type on a pool Model's status.
pub const SERVED_BY_POOL: &str = "ServedByPool";

/// What a pool Model's tick saw of its pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// The pool's name.
    pub pool: String,
    /// Whether the `ModelPool` exists in the Model's namespace.
    pub found: bool,
    /// Its ready workers, spot and on-demand.
    pub ready_workers: u32,
}

/// The broker record of a pool Model: its own prices and admission settings; `Ready` while
/// the pool has a ready worker (which loads the model when it is assigned one).
pub fn pooled_record(model: &Model, id: &str, view: &PoolView) -> ModelRecord {
    ModelRecord {
        id: id.to_string(),
        state: if view.ready_workers > 0 {
            ModelState::Ready
        } else {
            ModelState::ScaledToZero
        },
        prices: queue_prices(&model.spec),
        max_queue_wait_ms: u64::from(model.spec.scaling.max_queue_wait_seconds) * 1000,
        backlog_cap: u64::from(model.spec.scaling.max_backlog),
        context_length: model.spec.runtime.context_length.unwrap_or(0),
    }
}

/// The status of a pool Model: no replicas of its own, its queue, and [`SERVED_BY_POOL`].
pub fn pooled_status(
    view: &PoolView,
    depth: QueueDepth,
    generation: Option<i64>,
    now: Time,
    previous: Option<&ModelStatus>,
) -> ModelStatus {
    let ns_note = |found: bool| {
        if found {
            format!("served by ModelPool {}", view.pool)
        } else {
            format!(
                "ModelPool {} does not exist in this namespace: requests wait in the queue until it does",
                view.pool
            )
        }
    };
    let mut conditions = vec![
        Condition {
            type_: SERVED_BY_POOL.into(),
            status: if view.found { "True" } else { "False" }.into(),
            reason: if view.found {
                "PoolFound"
            } else {
                "PoolNotFound"
            }
            .into(),
            message: ns_note(view.found),
            observed_generation: generation,
            last_transition_time: now.clone(),
        },
        Condition {
            type_: "SpecValid".into(),
            status: "True".into(),
            reason: "Valid".into(),
            message: "the spec is valid".into(),
            observed_generation: generation,
            last_transition_time: now,
        },
    ];
    if let Some(p) = previous {
        carry_transitions(&mut conditions, &p.conditions);
    }
    ModelStatus {
        phase: if view.ready_workers > 0 {
            Phase::Ready
        } else {
            Phase::ScaledToZero
        },
        backlog: depth.backlog,
        in_flight: depth.in_flight,
        decoding: depth.decoding,
        last_request_time: previous.and_then(|p| p.last_request_time.clone()),
        conditions,
        observed_generation: generation,
        ..ModelStatus::default()
    }
}

/// The pool as the Model's tick sees it in the caches.
fn view(ctx: &Context, ns: &str, pool: &str) -> PoolView {
    let found = ctx
        .pools
        .get(&ObjectRef::<ModelPool>::new(pool).within(ns))
        .is_some();
    let ready_workers = CAPACITIES
        .iter()
        .filter_map(|c| {
            ctx.deployments
                .get(&ObjectRef::new(&deployment_name(pool, *c)).within(ns))
        })
        .filter_map(|d| d.status.as_ref().and_then(|s| s.ready_replicas))
        .map(|r| u32::try_from(r).unwrap_or(0))
        .sum();
    PoolView {
        pool: pool.to_string(),
        found,
        ready_workers,
    }
}

/// Deletes the Model's own Deployments that the cache still shows (a Model that joined a
/// pool); only those it owns, so a pool's of the same name is never touched.
async fn delete_own_deployments(ctx: &Context, model: &Model, ns: &str) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let uid = model.uid();
    for capacity in CAPACITIES {
        let name = deployment_name(&model.name_any(), capacity);
        let Some(existing) = ctx.deployments.get(&ObjectRef::new(&name).within(ns)) else {
            continue;
        };
        let owned = existing
            .owner_references()
            .iter()
            .any(|o| o.kind == "Model" && Some(&o.uid) == uid.as_ref());
        if !owned {
            continue;
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(deployment = %name, "deleted: the model is served by a pool"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One tick of a Model whose `spec.pool` is `pool`.
pub(crate) async fn tick_pooled(
    model: &Model,
    ctx: &Context,
    mem: &mut Memory,
    ns: &str,
    pool: &str,
) -> Result<Action> {
    let id = model_id(ns, &model.name_any());
    let now = (ctx.clock)();
    if let Err(e) = publish_prices(ctx, &id, &model.spec, mem, now).await {
        tracing::warn!(error = %e, "publishing prices failed");
    }
    delete_own_deployments(ctx, model, ns).await?;
    // a Model that left its own fleet starts afresh if it leaves the pool again
    mem.applied_generation = None;
    mem.decision = None;
    let view = view(ctx, ns, pool);
    let record = pooled_record(model, &id, &view);
    if mem.record.as_ref() != Some(&record) {
        match ctx.broker.put_model(&record).await {
            Ok(()) => mem.record = Some(record),
            Err(e) => tracing::warn!(error = %e, "publishing the model record failed"),
        }
    }
    let depth = ctx.broker.depth(&id).await.unwrap_or_default();
    let previous = mem.status.clone().or_else(|| model.status.clone());
    let mut status = pooled_status(
        &view,
        depth,
        model.metadata.generation,
        to_time(now),
        previous.as_ref(),
    );
    if depth.backlog + depth.in_flight > 0 {
        status.last_request_time = Some(to_time(now));
    }
    if mem.status.as_ref() != Some(&status) {
        patch_status(ctx, model, &status).await?;
        mem.status = Some(status);
    }
    Ok(Action::requeue(ctx.settings.tick))
}

#[cfg(test)]
#[path = "pooled_tests.rs"]
mod tests;
