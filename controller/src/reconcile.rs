//! The reconciler: one tick of one Model.
//!
//! Apply: observe the pods (and the cold start that sizes the time constants a spec leaves
//! out), validate the spec, publish prices to the ledger, read the queue, run the policy,
//! apply both Deployments (server-side apply, on a new generation or when one is missing) or
//! patch only `spec.replicas` (a scale decision), emit Events for changes, record fleet time
//! and export its cost rate, publish the broker's model record, and patch the status
//! subresource.
//! Cleanup (the finaliser): remove the model record so the gateway stops routing to it,
//! delete the Deployments, fail every queued job (the clients get an error), give in-flight
//! jobs the drain timeout to finish, then fail what is left and purge the model's streams.
//! A Model with `spec.pool` takes [`crate::pooled::tick_pooled`] instead of the policy and
//! Deployments.
//! Gone: a reconcile that finds its Model no longer in the API (one queued before the
//! deletion finished) is normal: it forgets the Model and is not retried.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tidal_autoscaler::{decide_at, telemetry, Observed, ScalingSpec};
use tidal_billing::{CapacityType as BillingCapacity, FleetUsage, Prices};
use tidal_crds::{Model, ModelSpec, ModelStatus, TimeConstants, FINALIZER};
use tidal_queue::{CapacityType, ClaimedJob, JobFailure, ModelRecord};
use tracing::Instrument;

use crate::context::{Context, Memory};
use crate::deployment;
use crate::error::{Error, Result};
use crate::fleet_cost;
use crate::names::{
    capacity_value, deployment_name, model_id, CAPACITIES, CAPACITY_LABEL, FIELD_MANAGER,
    MAX_NAME_LEN, MODEL_LABEL,
};
use crate::observe::{epoch, observe_pool, PoolObservation};
use crate::report::{self, Notice, Tick};

/// Most fleet-time rows kept for retry while the ledger is down.
const MAX_UNRECORDED: usize = 10_000;
/// Jobs handled per broker call in the finaliser.
const BATCH: usize = 256;

/// Reconciles one Model (the kube-runtime `Controller`'s reconcile function).
pub async fn reconcile(model: Arc<Model>, ctx: Arc<Context>) -> Result<Action> {
    let ns = model.namespace().ok_or(Error::Incomplete("namespace"))?;
    let id = model_id(&ns, &model.name_any());
    let api: Api<Model> = Api::namespaced(ctx.client.clone(), &ns);
    let span = tracing::info_span!("reconcile", model = %id);
    let result = finalizer(&api, FINALIZER, model.clone(), |event| async {
        match event {
            Event::Apply(m) => apply(m, ctx.clone()).await,
            Event::Cleanup(m) => cleanup(m, ctx.clone()).await,
        }
    })
    .instrument(span.clone())
    .await
    .map_err(|e| match e {
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e,
        // both patch the Model itself
        FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e) => model_request(e),
        other => Error::Finalizer(other.to_string()),
    });
    match result {
        Err(Error::Gone) => {
            gone(&ctx, &id, &model).instrument(span).await;
            Ok(Action::await_change())
        }
        other => other,
    }
}

/// The error of a request on the Model itself: a 404 means it is gone.
fn model_request(e: kube::Error) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 404 => Error::Gone,
        e => Error::Kube(e),
    }
}

/// Forgets what the controller keeps about a Model (memory, open fleet time, `/metrics`
/// series, Events in progress).
fn forget(ctx: &Context, id: &str, model: &Model) {
    ctx.memory().remove(id);
    ctx.meter().forget(id);
    ctx.model_metrics.forget(id);
    if let Some(uid) = model.uid() {
        ctx.events.forget(&uid);
    }
}

/// The Model is no longer in the API: forget it, and take its record off the broker in case
/// this reconcile published it again after the finaliser removed it.
async fn gone(ctx: &Context, id: &str, model: &Model) {
    tracing::debug!("the model is gone; forgetting it");
    forget(ctx, id, model);
    if let Err(e) = ctx.broker.remove_model(id).await {
        tracing::warn!(error = %e, "removing a deleted model's record failed");
    }
}

/// Back-off after a failed reconcile.
pub fn error_policy(model: Arc<Model>, err: &Error, ctx: Arc<Context>) -> Action {
    match err {
        Error::Gone => {
            // `reconcile` answers this itself; nothing to retry either way
            tracing::debug!(model = %model.name_any(), "{err}");
            Action::await_change()
        }
        Error::Draining { .. } => {
            tracing::info!(model = %model.name_any(), "{err}");
            Action::requeue(ctx.settings.tick.max(Duration::from_secs(2)))
        }
        _ => {
            tracing::warn!(model = %model.name_any(), error = %err, "reconcile failed");
            metrics::counter!("tidal_controller_reconcile_errors_total").increment(1);
            Action::requeue(Duration::from_secs(10))
        }
    }
}

pub(crate) fn to_time(t: SystemTime) -> Time {
    Time(Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub(crate) fn queue_prices(spec: &ModelSpec) -> tidal_queue::Prices {
    let p = &spec.pricing;
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    tidal_queue::Prices {
        currency: p.currency.clone(),
        input_per_mtok_micros: u(p.input_per_million_micros),
        cached_input_per_mtok_micros: u(p.cached_input_per_million_micros),
        output_per_mtok_micros: u(p.output_per_million_micros),
    }
}

fn ledger_prices(spec: &ModelSpec) -> Prices {
    let p = &spec.pricing;
    Prices {
        input_per_m: p.input_per_million_micros,
        cached_input_per_m: p.cached_input_per_million_micros,
        output_per_m: p.output_per_million_micros,
    }
}

/// Publishes `notice` about `model`; `action` is what the controller did (`Scale`,
/// `Validate`).
async fn publish_event(ctx: &Context, model: &Model, notice: &Notice, action: &'static str) {
    tracing::info!(reason = notice.reason, note = %notice.note, "event");
    let regarding = model.object_ref(&());
    if let Err(e) = ctx
        .events
        .publish(notice, action, &regarding, (ctx.clock)())
        .await
    {
        tracing::warn!(error = %e, "publishing an event failed");
    }
}

pub(crate) async fn patch_status(ctx: &Context, model: &Model, status: &ModelStatus) -> Result<()> {
    let ns = model.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<Model> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "status": status,
    });
    api.patch_status(
        &model.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(model_request)?;
    Ok(())
}

/// Takes the Model's memory out of the shared map for the tick (put back after).
fn take_memory(ctx: &Context, id: &str) -> Memory {
    ctx.memory().remove(id).unwrap_or_default()
}

/// Points the policy's memory at `scaling` when it changed (an edited spec, or time
/// constants sized on a new cold start), keeping the demand it has seen.
fn adopt_scaling(mem: &mut Memory, scaling: &ScalingSpec) {
    if mem.scaling.as_ref() != Some(scaling) {
        mem.policy.respec(scaling);
        mem.scaling = Some(scaling.clone());
    }
}

/// The Model's pools as the tick sees them, and their cold start.
struct Fleet {
    spot: PoolObservation,
    on_demand: PoolObservation,
    /// The slowest cold start of the Ready replicas, else the one the status kept.
    measured_cold_start: Option<Duration>,
}

/// The longest cold start the status records: a longer one is a stuck pod, not a start.
const MAX_COLD_START: Duration = Duration::from_secs(3600);

fn observe_fleet(ctx: &Context, model: &Model, mem: &Memory, ns: &str, name: &str) -> Fleet {
    let spot = observe(ctx, ns, name, CapacityType::Spot);
    let on_demand = observe(ctx, ns, name, CapacityType::OnDemand);
    let kept = mem
        .status
        .as_ref()
        .or(model.status.as_ref())
        .and_then(|s| s.measured_cold_start_seconds)
        .map(|s| Duration::from_secs(u64::from(s)));
    let measured = spot
        .slowest_cold_start
        .max(on_demand.slowest_cold_start)
        // whole seconds, rounded up: the status shows them, and sub-second changes would
        // change the time constants at every new pod
        .map(|d| Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0)))
        .map(|d| d.clamp(Duration::from_secs(1), MAX_COLD_START))
        .or(kept);
    Fleet {
        spot,
        on_demand,
        measured_cold_start: measured,
    }
}

async fn apply(model: Arc<Model>, ctx: Arc<Context>) -> Result<Action> {
    let ns = model.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = model.name_any();
    let id = model_id(&ns, &name);
    let mut mem = take_memory(&ctx, &id);
    let fleet = observe_fleet(&ctx, &model, &mem, &ns, &name);
    let checked = if name.len() > MAX_NAME_LEN {
        Err(format!(
            "the name is longer than {MAX_NAME_LEN} characters (Deployment names and pod labels must fit)"
        ))
    } else {
        model
            .spec
            .validate(model.spec.cold_start(fleet.measured_cold_start))
            .and_then(|s| Ok((s, model.spec.source()?)))
            .map_err(|e| e.to_string())
    };
    let result = match (checked, model.spec.pool.as_deref()) {
        (Ok(_), Some(pool)) => crate::pooled::tick_pooled(&model, &ctx, &mut mem, &ns, pool).await,
        (Ok((scaling, source)), None) => {
            adopt_scaling(&mut mem, &scaling);
            tick(&model, &ctx, &mut mem, &scaling, &source, fleet).await
        }
        (Err(message), _) => invalid(&model, &ctx, &mut mem, message).await,
    };
    ctx.memory().insert(id, mem);
    result
}

async fn invalid(
    model: &Model,
    ctx: &Context,
    mem: &mut Memory,
    message: String,
) -> Result<Action> {
    let generation = model.metadata.generation;
    tracing::warn!(%message, "invalid spec");
    if mem.invalid_generation != generation || generation.is_none() {
        publish_event(
            ctx,
            model,
            &Notice {
                reason: "InvalidSpec",
                note: message.clone(),
                warning: true,
            },
            "Validate",
        )
        .await;
        mem.invalid_generation = generation;
    }
    let previous = mem.status.clone().or_else(|| model.status.clone());
    let status = report::invalid_status(
        message,
        generation,
        to_time((ctx.clock)()),
        previous.as_ref(),
    );
    if mem.status.as_ref() != Some(&status) {
        patch_status(ctx, model, &status).await?;
        mem.status = Some(status);
    }
    Ok(Action::await_change())
}

fn observe(ctx: &Context, ns: &str, name: &str, capacity: CapacityType) -> PoolObservation {
    let value = capacity_value(capacity);
    let pods = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(MODEL_LABEL).map(String::as_str) == Some(name)
            && p.labels().get(CAPACITY_LABEL).map(String::as_str) == Some(value)
    });
    observe_pool(pods.iter().map(|p| p.as_ref()), |node| {
        ctx.nodes.get(&ObjectRef::new(node))
    })
}

pub(crate) async fn publish_prices(
    ctx: &Context,
    id: &str,
    spec: &ModelSpec,
    mem: &mut Memory,
    now: SystemTime,
) -> Result<()> {
    let prices = ledger_prices(spec);
    if mem.published_prices == Some(prices) {
        return Ok(());
    }
    if ctx
        .ledger
        .ensure_price(id, prices, chrono::DateTime::<chrono::Utc>::from(now))
        .await?
    {
        tracing::info!(?prices, "published prices to the ledger");
    }
    mem.published_prices = Some(prices);
    Ok(())
}

async fn record_fleet_time(
    ctx: &Context,
    model: &Model,
    id: &str,
    mem: &mut Memory,
    scheduled: [(CapacityType, u32); 2],
    now: SystemTime,
) -> Result<()> {
    let now_ms = u64::try_from(epoch(now).as_millis()).unwrap_or(u64::MAX);
    for (capacity, count) in scheduled {
        let closed = ctx.meter().sample(id, capacity, count, now_ms);
        let pool = match capacity {
            CapacityType::Spot => &model.spec.capacity.spot,
            CapacityType::OnDemand => &model.spec.capacity.on_demand,
        };
        keep_unrecorded(
            &mut mem.unrecorded,
            closed,
            pool.cost_per_replica_hour_micros,
        );
    }
    flush_fleet_usage(ctx, &mut mem.unrecorded).await
}

/// Queues closed fleet-time intervals for the ledger at `price_per_hour_micros` (at most
/// [`MAX_UNRECORDED`] wait while the ledger is down).
pub(crate) fn keep_unrecorded(
    unrecorded: &mut Vec<(String, FleetUsage)>,
    closed: Vec<crate::fleet_time::Interval>,
    price_per_hour_micros: i64,
) {
    for interval in closed {
        let start = chrono::DateTime::<chrono::Utc>::from(
            SystemTime::UNIX_EPOCH + Duration::from_millis(interval.start_ms),
        );
        let usage = FleetUsage {
            model: interval.model.clone(),
            capacity: match interval.capacity {
                CapacityType::Spot => BillingCapacity::Spot,
                CapacityType::OnDemand => BillingCapacity::OnDemand,
            },
            day: start.date_naive(),
            price_per_hour_micros,
            replica_ms: i64::try_from(interval.replica_ms).unwrap_or(i64::MAX),
        };
        if unrecorded.len() < MAX_UNRECORDED {
            unrecorded.push((interval.id, usage));
        }
    }
}

/// Records the queued fleet time in the ledger, oldest first, until one fails.
pub(crate) async fn flush_fleet_usage(
    ctx: &Context,
    unrecorded: &mut Vec<(String, FleetUsage)>,
) -> Result<()> {
    while let Some((interval_id, usage)) = unrecorded.first() {
        ctx.ledger.record_fleet_usage(interval_id, usage).await?;
        unrecorded.remove(0);
    }
    Ok(())
}

async fn tick(
    model: &Model,
    ctx: &Context,
    mem: &mut Memory,
    scaling: &ScalingSpec,
    source: &tidal_crds::Source,
    fleet: Fleet,
) -> Result<Action> {
    let ns = model.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = model.name_any();
    let id = model_id(&ns, &name);
    let now = (ctx.clock)();
    let generation = model.metadata.generation;
    let mut degraded: Vec<String> = Vec::new();

    if let Err(e) = publish_prices(ctx, &id, &model.spec, mem, now).await {
        tracing::warn!(error = %e, "publishing prices failed");
        degraded.push(format!("prices not published: {e}"));
    }

    let depth = match ctx.broker.depth(&id).await {
        Ok(d) => d,
        Err(e) => {
            // Without the queue there is nothing to scale on: keep the fleet as it is.
            tracing::warn!(error = %e, "reading the queue failed");
            let previous = mem
                .status
                .clone()
                .or_else(|| model.status.clone())
                .unwrap_or_default();
            let mut status = previous.clone();
            status.phase = tidal_crds::Phase::Degraded;
            status.observed_generation = generation;
            if mem.status.as_ref() != Some(&status) {
                patch_status(ctx, model, &status).await?;
                mem.status = Some(status);
            }
            return Err(e.into());
        }
    };
    let Fleet {
        spot,
        on_demand,
        measured_cold_start,
    } = fleet;
    let memory_refusal = spot
        .memory_refusal
        .clone()
        .or_else(|| on_demand.memory_refusal.clone());
    // Before any API call, so a failing apply does not leave the gauge behind the pods.
    for (capacity, pool) in [
        (CapacityType::Spot, &spot),
        (CapacityType::OnDemand, &on_demand),
    ] {
        ctx.model_metrics
            .record(|| fleet_cost::record(&id, model, capacity, pool.scheduled));
    }
    if depth.backlog + depth.in_flight > 0 {
        mem.last_request = Some(now);
    }
    let observed = Observed {
        backlog: depth.backlog,
        in_flight: depth.in_flight,
        spot: spot.capacity.clone(),
        on_demand: on_demand.capacity.clone(),
        last_request_at: mem.last_request.map(epoch),
        arrived_prompt_tokens: depth.arrived_prompt_tokens,
        decoding: depth.decoding,
    };
    let due = ctx.settings.tick_due(mem.decided_at, now);
    let decision = match (&mem.decision, due) {
        (Some(previous), false) => previous.clone(),
        _ => {
            // The controller's clock is the wall clock, which the floor schedule reads.
            let at = epoch(now);
            let d = decide_at(&observed, scaling, &mut mem.policy, at, at.as_secs());
            mem.decided_at = Some(now);
            ctx.model_metrics
                .record(|| telemetry::record(&id, &observed, &d));
            d
        }
    };
    metrics::counter!("tidal_controller_reconciles_total").increment(1);

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let full = mem.applied_generation.is_none() || mem.applied_generation != generation;
    for capacity in CAPACITIES {
        let want = match capacity {
            CapacityType::Spot => decision.spot,
            CapacityType::OnDemand => decision.on_demand,
        };
        let dep_name = deployment_name(&name, capacity);
        let existing = ctx.deployments.get(&ObjectRef::new(&dep_name).within(&ns));
        if full || existing.is_none() {
            let body = deployment::build(model, source, capacity, want, &ctx.settings.worker);
            deployments
                .patch(
                    &dep_name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await?;
            tracing::info!(deployment = %dep_name, replicas = want, "applied deployment");
        } else {
            let current = existing
                .as_ref()
                .and_then(|d| d.spec.as_ref())
                .and_then(|s| s.replicas);
            if current != Some(i32::try_from(want).unwrap_or(i32::MAX)) {
                deployments
                    .patch(
                        &dep_name,
                        &PatchParams {
                            field_manager: Some(FIELD_MANAGER.into()),
                            ..PatchParams::default()
                        },
                        &Patch::Merge(json!({ "spec": { "replicas": want } })),
                    )
                    .await?;
                tracing::info!(deployment = %dep_name, from = ?current, to = want, reason = %decision.reason, "scaled");
            }
        }
    }
    mem.applied_generation = generation;

    for notice in report::notices(mem.decision.as_ref(), &decision) {
        publish_event(ctx, model, &notice, "Scale").await;
    }

    if let Err(e) = record_fleet_time(
        ctx,
        model,
        &id,
        mem,
        [
            (CapacityType::Spot, spot.scheduled),
            (CapacityType::OnDemand, on_demand.scheduled),
        ],
        now,
    )
    .await
    {
        tracing::warn!(error = %e, "recording fleet time failed");
        degraded.push(format!("fleet time not recorded: {e}"));
    }

    let record = ModelRecord {
        id: id.clone(),
        state: report::record_state(&observed, &decision),
        prices: queue_prices(&model.spec),
        max_queue_wait_ms: u64::from(model.spec.scaling.max_queue_wait_seconds) * 1000,
        backlog_cap: u64::from(model.spec.scaling.max_backlog),
        context_length: model.spec.runtime.context_length.unwrap_or(0),
    };
    if mem.record.as_ref() != Some(&record) {
        match ctx.broker.put_model(&record).await {
            Ok(()) => mem.record = Some(record),
            Err(e) => {
                tracing::warn!(error = %e, "publishing the model record failed");
                degraded.push(format!("model record not published: {e}"));
            }
        }
    }

    let previous = mem.status.clone().or_else(|| model.status.clone());
    let status = report::status(
        &Tick {
            observed: &observed,
            decision: &decision,
            generation,
            last_request: mem.last_request.map(to_time),
            degraded: (!degraded.is_empty()).then(|| degraded.join("; ")),
            memory_refusal,
            now: to_time(now),
            measured_cold_start,
            time_constants: TimeConstants::of(scaling, model.spec.cold_start(measured_cold_start)),
        },
        previous.as_ref(),
    );
    mem.decision = Some(decision);
    if mem.status.as_ref() != Some(&status) {
        patch_status(ctx, model, &status).await?;
        mem.status = Some(status);
    }
    Ok(Action::requeue(ctx.settings.tick))
}

/// Fails one job: its client gets `model_not_found`, and the entry is acked.
async fn fail_job(ctx: &Context, id: &str, job: &ClaimedJob) -> Result<()> {
    let failure = JobFailure {
        status: 404,
        code: "model_not_found".into(),
        param: Some("model".into()),
        message: format!("the model `{id}` was deleted before this request finished"),
    };
    Ok(tidal_queue::fail_job(ctx.broker.as_ref(), job, &failure).await?)
}

/// The finaliser's work; an error keeps the finaliser and retries.
async fn cleanup(model: Arc<Model>, ctx: Arc<Context>) -> Result<Action> {
    let ns = model.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = model.name_any();
    let id = model_id(&ns, &name);
    let consumer = ctx.settings.consumer.as_str();
    ctx.broker.remove_model(&id).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    for capacity in CAPACITIES {
        match deployments
            .delete(
                &deployment_name(&name, capacity),
                &DeleteParams::background(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut failed = 0usize;
    loop {
        let jobs = ctx
            .broker
            .claim(&id, consumer, BATCH, Duration::ZERO)
            .await?;
        if jobs.is_empty() {
            break;
        }
        for job in &jobs {
            fail_job(&ctx, &id, job).await?;
        }
        failed += jobs.len();
    }
    let depth = ctx.broker.depth(&id).await?;
    if depth.in_flight > 0 {
        let deleted = model
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .unwrap_or_else(|| (ctx.clock)());
        let deadline = deleted
            + Duration::from_secs(u64::from(model.spec.drain_timeout_seconds))
            + ctx.settings.delete_grace;
        if (ctx.clock)() < deadline {
            return Err(Error::Draining {
                model: id,
                in_flight: depth.in_flight,
            });
        }
        loop {
            let jobs = ctx
                .broker
                .take_over(&id, consumer, Duration::ZERO, BATCH)
                .await?;
            if jobs.is_empty() {
                break;
            }
            for job in &jobs {
                fail_job(&ctx, &id, job).await?;
            }
            failed += jobs.len();
        }
    }
    ctx.broker.purge_model(&id).await?;
    forget(&ctx, &id, &model);
    tracing::info!(
        failed_jobs = failed,
        "model deleted: queue withdrawn and purged"
    );
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_autoscaler::{decide, CapacityObserved, PolicyState, StableAggregate};

    fn serving(in_flight: u64) -> Observed {
        Observed {
            in_flight,
            on_demand: CapacityObserved {
                ready: 4,
                ..CapacityObserved::default()
            },
            last_request_at: Some(Duration::ZERO),
            ..Observed::default()
        }
    }

    #[test]
    fn new_time_constants_keep_the_demand_the_policy_has_seen() {
        let measured = |c| ScalingSpec {
            target_in_flight_per_replica: 10.0,
            max_scale_down_rate: 1000.0,
            capacity_mode: tidal_autoscaler::CapacityMode::OnDemand,
            ..ScalingSpec::default().with_cold_start(Duration::from_secs(c))
        };
        let (before, after) = (measured(60), measured(90));
        assert_eq!(before.stable_aggregate, StableAggregate::Max);
        let mut mem = Memory::default();
        adopt_scaling(&mut mem, &before);
        let s = Duration::from_secs;
        for t in 0..10 {
            decide(&serving(40), &before, &mut mem.policy, s(t));
        }
        for t in 10..100 {
            decide(&serving(10), &before, &mut mem.policy, s(t));
        }
        // a new measurement: the peak of 40 in flight stays in the windows and the delay
        // (a fresh state would see 10 in flight and ask for 1 replica)
        adopt_scaling(&mut mem, &after);
        assert_eq!(mem.scaling.as_ref(), Some(&after));
        let d = decide(&serving(10), &after, &mut mem.policy, s(100));
        assert_eq!(d.on_demand, 4, "{d:?}");
        let mut fresh = PolicyState::new(&after);
        assert_eq!(
            decide(&serving(10), &after, &mut fresh, s(100)).on_demand,
            1
        );
        // the same spec again changes nothing
        let kept = mem.policy.clone();
        adopt_scaling(&mut mem, &after);
        assert_eq!(mem.policy, kept);
    }
}
