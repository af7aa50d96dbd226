//! The reconciler against kube's mock API service: the exact requests and bodies of a first
//! reconcile, a scale decision, the finaliser's add and delete paths.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use serde_json::json;
use tidal_controller::deployment::{build, WorkerConfig};
use tidal_controller::reconcile::{error_policy, reconcile};
use tidal_controller::Error;
use tidal_crds::Model;
use tidal_queue::{Broker, CapacityType, Job, ModelState, ResponseEvent};
use uuid::Uuid;

const NS: &str = "default";
const NAME: &str = "qwen-0-5b";
const ID: &str = "default/qwen-0-5b";

fn cfg() -> WorkerConfig {
    WorkerConfig {
        queue_url: "redis://redis:6379".into(),
        key_prefix: None,
    }
}

fn model_path() -> String {
    format!("/apis/tidal.dev/v1alpha1/namespaces/{NS}/models/{NAME}")
}

fn job() -> Job {
    Job {
        id: Uuid::now_v7(),
        tenant: "t1".into(),
        model: ID.into(),
        body: json!({"prompt": "hi", "max_tokens": 4}),
        enqueued_at_ms: T0 * 1000,
        deadline_ms: (T0 + 3600) * 1000,
        resume: None,
    }
}

fn apply_query() -> Vec<(&'static str, &'static str)> {
    vec![("fieldManager", "tidal-controller"), ("force", "true")]
}

/// Answers the two server-side applies of a full reconcile, checking them.
async fn expect_applies(h: &mut Harness, m: &Model, spot: u32, on_demand: u32) {
    let src = m.spec.source().unwrap();
    for (cap, suffix, replicas) in [
        (CapacityType::Spot, "spot", spot),
        (CapacityType::OnDemand, "ondemand", on_demand),
    ] {
        let r = next(&mut h.handle).await;
        assert_eq!(r.method, "PATCH");
        assert_eq!(
            r.path,
            format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-{suffix}")
        );
        assert_eq!(r.query_pairs(), apply_query());
        assert_eq!(r.content_type, "application/apply-patch+yaml");
        let want = serde_json::to_value(build(m, &src, cap, replicas, &cfg())).unwrap();
        assert_eq!(r.body, want);
        assert_eq!(r.body["apiVersion"], "apps/v1");
        assert_eq!(r.body["kind"], "Deployment");
        assert_eq!(r.body["spec"]["replicas"], json!(replicas));
        assert_eq!(r.body["metadata"]["ownerReferences"][0]["kind"], "Model");
        assert_eq!(r.body["metadata"]["ownerReferences"][0]["controller"], true);
        // The worker pods are locked down like the chart's own (written out here, not taken
        // from the builder, so a change to either shows).
        let pod = &r.body["spec"]["template"]["spec"];
        assert_eq!(
            pod["securityContext"],
            json!({
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "fsGroup": 65532,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"}
            })
        );
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(
            pod["containers"][0]["securityContext"],
            json!({
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]}
            })
        );
        // file:// weights come from the image: the only writable path is /tmp
        assert_eq!(
            pod["containers"][0]["volumeMounts"],
            json!([{"name": "tmp", "mountPath": "/tmp"}])
        );
        assert_eq!(
            pod["volumes"],
            json!([{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}])
        );
        r.echo();
    }
}

/// Answers the status apply and returns its `status`.
async fn expect_status(h: &mut Harness, m: &Model) -> serde_json::Value {
    let r = next(&mut h.handle).await;
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path, format!("{}/status", model_path()));
    assert_eq!(r.query_pairs(), apply_query());
    assert_eq!(r.content_type, "application/apply-patch+yaml");
    assert_eq!(r.body["apiVersion"], "tidal.dev/v1alpha1");
    assert_eq!(r.body["kind"], "Model");
    assert_eq!(
        r.body.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["apiVersion", "kind", "status"]
    );
    let status = r.body["status"].clone();
    r.reply(200, &serde_json::to_value(m).unwrap());
    status
}

fn deployment_in_cluster(m: &Model, cap: CapacityType, replicas: u32) -> Deployment {
    let mut d = build(m, &m.spec.source().unwrap(), cap, replicas, &cfg());
    d.metadata.resource_version = Some("7".into());
    d
}

#[tokio::test]
async fn first_reconcile_applies_both_deployments_then_a_scale_patches_only_replicas() {
    let mut h = Harness::new().await;
    let m = Arc::new(model("small", true));

    // --- first reconcile: nothing queued
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_applies(&mut h, &m, 0, 0).await;
    let status = expect_status(&mut h, &m).await;
    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(status["phase"], "ScaledToZero");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["spot"], json!({"desired": 0, "ready": 0}));
    assert_eq!(status["onDemand"], json!({"desired": 0, "ready": 0}));
    assert_eq!(status["backlog"], 0);
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;

    let record = h.broker.model(ID).await.unwrap().unwrap();
    assert_eq!(record.state, ModelState::ScaledToZero);
    assert_eq!(record.prices.output_per_mtok_micros, 80_000);
    assert_eq!(record.max_queue_wait_ms, 120_000);
    let versions = h.ledger.price_versions(Some(ID)).await.unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0].prices.input_per_m, 20_000);
    assert_eq!(versions[0].prices.cached_input_per_m, 10_000);

    // --- the Deployments exist; five requests arrive
    h.add_deployment(deployment_in_cluster(&m, CapacityType::Spot, 0));
    h.add_deployment(deployment_in_cluster(&m, CapacityType::OnDemand, 0));
    for _ in 0..5 {
        h.broker.enqueue(&job()).await.unwrap();
    }
    h.advance(Duration::from_secs(2));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));

    // OnDemand mode, 5 queued, 4 per replica: 2 on-demand replicas, spot untouched.
    let r = next(&mut h.handle).await;
    assert_eq!(r.method, "PATCH");
    assert_eq!(
        r.path,
        format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-ondemand")
    );
    assert_eq!(r.query_pairs(), [("fieldManager", "tidal-controller")]);
    assert_eq!(r.content_type, "application/merge-patch+json");
    assert_eq!(r.body, json!({"spec": {"replicas": 2}}));
    r.reply(
        200,
        &serde_json::to_value(deployment_in_cluster(&m, CapacityType::OnDemand, 2)).unwrap(),
    );

    let ev = next(&mut h.handle).await;
    assert_eq!(ev.method, "POST");
    assert_eq!(
        ev.path,
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")
    );
    assert_eq!(ev.body["reason"], "ScaledUp");
    assert_eq!(ev.body["type"], "Normal");
    assert_eq!(ev.body["regarding"]["kind"], "Model");
    assert_eq!(ev.body["regarding"]["name"], NAME);
    assert_eq!(ev.body["reportingController"], "tidal-controller");
    let body = ev.body.clone();
    ev.reply(201, &body);

    let status = expect_status(&mut h, &m).await;
    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(status["phase"], "Starting");
    assert_eq!(status["onDemand"], json!({"desired": 2, "ready": 0}));
    assert_eq!(status["backlog"], 5);
    assert_eq!(status["lastRequestTime"], "2026-11-30T12:00:02Z");
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
    assert_eq!(
        h.broker.model(ID).await.unwrap().unwrap().state,
        ModelState::Starting
    );

    // --- nothing changed: no request at all
    h.advance(Duration::from_secs(2));
    let mut d = deployment_in_cluster(&m, CapacityType::OnDemand, 2);
    d.metadata.resource_version = Some("8".into());
    h.add_deployment(d);
    let action = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    // the status changes only in lastRequestTime
    let status = expect_status(&mut h, &m).await;
    assert_eq!(status["lastRequestTime"], "2026-11-30T12:00:04Z");
    assert_eq!(
        action.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(2))
    );
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

/// A first reconcile with nothing queued (both Deployments applied at 0 replicas), after
/// which the Deployments exist in the cluster; returns the status it applied.
async fn first_reconcile_of_an_idle_model(h: &mut Harness, m: &Arc<Model>) -> serde_json::Value {
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_applies(h, m, 0, 0).await;
    let status = expect_status(h, m).await;
    task.await.unwrap().unwrap();
    h.add_deployment(deployment_in_cluster(m, CapacityType::Spot, 0));
    h.add_deployment(deployment_in_cluster(m, CapacityType::OnDemand, 0));
    status
}

/// A reconcile, 2 s later, whose only request is the status apply; returns that status.
async fn reconcile_changing_only_the_status(h: &mut Harness, m: &Arc<Model>) -> serde_json::Value {
    h.advance(Duration::from_secs(2));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_status(h, m).await;
    task.await.unwrap().unwrap();
    status
}

/// A reconcile (`task`) that scales the on-demand Deployment of an idle model up to
/// `replicas`: the replicas patch, the `ScaledUp` event and the status, then nothing more;
/// returns the event's note.
async fn expect_on_demand_scale_up(
    h: &mut Harness,
    m: &Arc<Model>,
    task: tokio::task::JoinHandle<Result<Action, Error>>,
    replicas: u32,
) -> String {
    let r = next(&mut h.handle).await;
    assert_eq!(
        r.path,
        format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-ondemand")
    );
    assert_eq!(r.body, json!({"spec": {"replicas": replicas}}));
    r.reply(
        200,
        &serde_json::to_value(deployment_in_cluster(m, CapacityType::OnDemand, replicas)).unwrap(),
    );
    let ev = next(&mut h.handle).await;
    assert_eq!(ev.body["reason"], "ScaledUp");
    let body = ev.body.clone();
    ev.reply(201, &body);
    let status = expect_status(h, m).await;
    task.await.unwrap().unwrap();
    assert_eq!(status["onDemand"], json!({"desired": replicas, "ready": 0}));
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
    body["note"].as_str().unwrap_or_default().to_string()
}

/// With `prefillTokensPerSecond` set, the prompt tokens the broker counted reach the policy:
/// two long prompts get the replicas their tokens need, not the one their count asks for.
#[tokio::test]
async fn long_prompts_scale_on_their_tokens() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    // one replica prefills 1,500 tokens within the 2 s target at the default 75 %
    m.spec.scaling.prefill_tokens_per_second = 1_000;
    m.spec.scaling.ttft_target_milliseconds = 2_000;
    let m = Arc::new(m);
    first_reconcile_of_an_idle_model(&mut h, &m).await;
    for _ in 0..2 {
        // 12,000 bytes of prompt: about 3,000 tokens
        let long = Job {
            body: json!({"prompt": "x".repeat(12_000), "max_tokens": 4}),
            ..job()
        };
        h.broker.enqueue(&long).await.unwrap();
    }
    assert_eq!(
        h.broker.depth(ID).await.unwrap().arrived_prompt_tokens,
        6_000
    );
    h.advance(Duration::from_secs(2));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    // 6,000 tokens / 1,500 per replica - 1.2 tolerance = 2.8: 3 replicas (2 requests at 4
    // per replica alone would be 1)
    let note = expect_on_demand_scale_up(&mut h, &m, task, 3).await;
    assert!(
        note.contains("(stable;") || note.contains("(activation;"),
        "{note}"
    );
}

/// A `floorSchedule` window raises the floor when the wall clock enters it, on the clock of
/// its time zone: idle at 12:00 UTC (13:00 in Berlin; the window starts at 14:00 there), two
/// replicas at 13:00 UTC with nothing queued.
#[tokio::test]
async fn a_scheduled_floor_starts_replicas_when_its_window_opens() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    // T0 is Monday 2026-11-30 12:00 UTC, 13:00 CET
    m.spec.scaling.floor_schedule = vec![tidal_crds::ScheduledFloor {
        days: vec![tidal_crds::Weekday::Mon],
        start: "14:00".into(),
        end: "19:00".into(),
        min_replicas: 2,
        time_zone: Some("Europe/Berlin".into()),
    }];
    let m = Arc::new(m);
    first_reconcile_of_an_idle_model(&mut h, &m).await;
    h.advance(Duration::from_secs(3600));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let note = expect_on_demand_scale_up(&mut h, &m, task, 2).await;
    assert!(note.contains("(scheduled-floor;"), "{note}");
}

#[tokio::test]
async fn a_new_model_gets_the_finaliser_first() {
    let mut h = Harness::new().await;
    let m = Arc::new(model("small", false));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let r = next(&mut h.handle).await;
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path, model_path());
    assert_eq!(r.content_type, "application/json-patch+json");
    assert_eq!(
        r.body,
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["tidal.dev/cleanup"]}
        ])
    );
    r.reply(200, &serde_json::to_value(model("small", true)).unwrap());
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

fn deleting(m: &mut Model) {
    m.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(T0 as i64).unwrap()));
}

async fn expect_deletes(h: &mut Harness, spot_status: u16) {
    for (suffix, code) in [("spot", spot_status), ("ondemand", 200)] {
        let r = next(&mut h.handle).await;
        assert_eq!(r.method, "DELETE");
        assert_eq!(
            r.path,
            format!("/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-{suffix}")
        );
        assert_eq!(r.body["propagationPolicy"], "Background");
        if code == 404 {
            r.reply(404, &status_error(404, "NotFound"));
        } else {
            r.reply(200, &status_error(200, "Success"));
        }
    }
}

async fn expect_finaliser_removed(h: &mut Harness, m: &Model) {
    let r = next(&mut h.handle).await;
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path, model_path());
    assert_eq!(r.content_type, "application/json-patch+json");
    assert_eq!(
        r.body,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "tidal.dev/cleanup"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ])
    );
    let mut gone = m.clone();
    gone.metadata.finalizers = None;
    r.reply(200, &serde_json::to_value(gone).unwrap());
}

fn assert_failed_for_deletion(events: &[ResponseEvent]) {
    match events {
        [ResponseEvent::Error {
            seq: 1,
            status: 404,
            code,
            ..
        }] => assert_eq!(code, "model_not_found"),
        other => panic!("unexpected response events {other:?}"),
    }
}

#[tokio::test]
async fn delete_withdraws_queued_jobs_purges_and_removes_the_finaliser() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    deleting(&mut m);
    let m = Arc::new(m);
    h.broker
        .put_model(&tidal_queue::ModelRecord {
            id: ID.into(),
            state: ModelState::Ready,
            prices: tidal_queue::Prices {
                currency: "USD".into(),
                input_per_mtok_micros: 1,
                cached_input_per_mtok_micros: 1,
                output_per_mtok_micros: 1,
            },
            max_queue_wait_ms: 1,
            backlog_cap: 1,
            context_length: 0,
        })
        .await
        .unwrap();
    let jobs = [job(), job()];
    for j in &jobs {
        h.broker.enqueue(j).await.unwrap();
    }

    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_deletes(&mut h, 404).await;
    expect_finaliser_removed(&mut h, &m).await;
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;

    assert_eq!(h.broker.model(ID).await.unwrap(), None);
    for j in &jobs {
        let events = h
            .broker
            .read_responses(j.id, 0, 10, Duration::ZERO)
            .await
            .unwrap();
        assert_failed_for_deletion(&events);
    }
    let depth = h.broker.depth(ID).await.unwrap();
    assert_eq!((depth.backlog, depth.in_flight), (0, 0));
}

#[tokio::test]
async fn delete_waits_for_in_flight_jobs_until_the_drain_deadline() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    deleting(&mut m);
    let m = Arc::new(m);
    let running = job();
    h.broker.enqueue(&running).await.unwrap();
    let claimed = h
        .broker
        .claim(ID, "worker-1", 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    // within drainTimeoutSeconds (30) + grace (30): the finaliser waits
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_deletes(&mut h, 200).await;
    match task.await.unwrap() {
        Err(Error::Draining { in_flight: 1, .. }) => {}
        other => panic!("expected Draining, got {other:?}"),
    }
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;

    // past the deadline: the job is taken over and failed, then the finaliser goes
    h.advance(Duration::from_secs(61));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_deletes(&mut h, 404).await;
    expect_finaliser_removed(&mut h, &m).await;
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    let events = h
        .broker
        .read_responses(running.id, 0, 10, Duration::ZERO)
        .await
        .unwrap();
    assert_failed_for_deletion(&events);
}

#[tokio::test]
async fn invalid_spec_reports_and_waits_for_a_change() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    m.spec.scaling.min_replicas = 5; // above maxReplicas 3
    let m = Arc::new(m);
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let ev = next(&mut h.handle).await;
    assert_eq!(ev.method, "POST");
    assert_eq!(ev.body["reason"], "InvalidSpec");
    assert_eq!(ev.body["type"], "Warning");
    let body = ev.body.clone();
    ev.reply(201, &body);
    let status = expect_status(&mut h, &m).await;
    assert_eq!(status["phase"], "Degraded");
    assert_eq!(status["conditions"][0]["type"], "SpecValid");
    assert_eq!(status["conditions"][0]["status"], "False");
    assert!(status["conditions"][0]["message"]
        .as_str()
        .unwrap()
        .contains("minReplicas (5) is greater than maxReplicas (3)"));
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

#[tokio::test]
async fn a_reconcile_within_the_tick_reuses_the_decision() {
    let mut h = Harness::new().await;
    let m = Arc::new(model("small", true));
    first_reconcile_of_an_idle_model(&mut h, &m).await;
    for _ in 0..5 {
        h.broker.enqueue(&job()).await.unwrap();
    }
    // a Deployment event 1 s later: no new decision, so no scale patch yet
    h.advance(Duration::from_secs(1));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let status = expect_status(&mut h, &m).await;
    assert_eq!(status["onDemand"]["desired"], 0);
    assert_eq!(status["backlog"], 5);
    task.await.unwrap().unwrap();
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
    // the next tick decides
    h.advance(Duration::from_secs(1));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    let r = next(&mut h.handle).await;
    assert_eq!(r.body, json!({"spec": {"replicas": 2}}));
    r.echo();
    let ev = next(&mut h.handle).await;
    let body = ev.body.clone();
    ev.reply(201, &body);
    expect_status(&mut h, &m).await;
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn time_constants_left_out_follow_the_measured_cold_start() {
    let mut h = Harness::new().await;
    // the example gives only scaleToZeroAfterSeconds (120) of the five time constants
    let m = Arc::new(model("small", true));

    // no replica has started yet: sized on the assumed 60 s (longer than the 2 s TTFT
    // target, so the holds of a restart that misses it)
    let status = first_reconcile_of_an_idle_model(&mut h, &m).await;
    assert_eq!(status.get("measuredColdStartSeconds"), None);
    assert_eq!(
        status["timeConstants"],
        json!({
            "coldStartSeconds": 60,
            "coldStartSource": "Assumed",
            "stableWindowSeconds": 300,
            "stableAggregate": "Max",
            "panicWindowSeconds": 30.0,
            "scaleDownDelaySeconds": 300,
            "scaleToZeroAfterSeconds": 120
        })
    );

    // a replica that took 90.2 s from creation to Ready (one that restarted a container
    // is left out: observe.rs tests that)
    let mut pod = worker_pod("od-a", NAME, CapacityType::OnDemand, Some("n1"), true);
    pod.metadata.namespace = Some(NS.into());
    pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = Some(Time(
        Timestamp::from_millisecond(T0 as i64 * 1000 + 90_200).unwrap(),
    ));
    h.add_pod(pod.clone());
    let status = reconcile_changing_only_the_status(&mut h, &m).await;
    assert_eq!(status["readyReplicas"], 1);
    assert_eq!(status["measuredColdStartSeconds"], 91);
    assert_eq!(
        status["timeConstants"],
        json!({
            "coldStartSeconds": 91,
            "coldStartSource": "Measured",
            "stableWindowSeconds": 455,
            "stableAggregate": "Max",
            "panicWindowSeconds": 45.5,
            "scaleDownDelaySeconds": 455,
            "scaleToZeroAfterSeconds": 120
        })
    );

    // the replicas go: the measurement stays
    h.remove_pod(pod);
    let status = reconcile_changing_only_the_status(&mut h, &m).await;
    assert_eq!(status["readyReplicas"], 0);
    assert_eq!(status["measuredColdStartSeconds"], 91);
    assert_eq!(status["timeConstants"]["coldStartSource"], "Measured");
    assert_eq!(status["timeConstants"]["stableWindowSeconds"], 455);

    // the spec's cold start wins over the measurement
    let mut given = (*m).clone();
    given.spec.scaling.cold_start_seconds = Some(10);
    given.spec.scaling.ttft_target_milliseconds = 30_000;
    given.metadata.generation = Some(2);
    let given = Arc::new(given);
    h.advance(Duration::from_secs(2));
    let task = tokio::spawn(reconcile(given.clone(), h.ctx.clone()));
    expect_applies(&mut h, &given, 0, 0).await;
    let status = expect_status(&mut h, &given).await;
    task.await.unwrap().unwrap();
    assert_eq!(status["measuredColdStartSeconds"], 91);
    assert_eq!(
        status["timeConstants"],
        json!({
            "coldStartSeconds": 10,
            "coldStartSource": "Spec",
            "stableWindowSeconds": 60,
            "stableAggregate": "Max",
            "panicWindowSeconds": 6.0,
            "scaleDownDelaySeconds": 50,
            "scaleToZeroAfterSeconds": 120
        })
    );
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

/// Three scale-ups within a minute: three Events, each with its own transition (kube-runtime's
/// recorder made the second and third a series of the first, showing `0 -> 1` three times).
#[tokio::test]
async fn each_scale_up_is_its_own_event() {
    let mut h = Harness::new().await;
    let m = Arc::new(model("small", true));
    first_reconcile_of_an_idle_model(&mut h, &m).await;
    let mut seen = Vec::new();
    // 4 in flight per replica, at most 3 replicas
    for (queued, replicas) in [(1, 1), (5, 2), (9, 3)] {
        while h.broker.depth(ID).await.unwrap().backlog < queued {
            h.broker.enqueue(&job()).await.unwrap();
        }
        h.advance(Duration::from_secs(2));
        let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
        let r = next(&mut h.handle).await;
        assert_eq!(r.body, json!({"spec": {"replicas": replicas}}));
        r.echo();
        h.add_deployment(deployment_in_cluster(&m, CapacityType::OnDemand, replicas));
        let ev = next(&mut h.handle).await;
        assert_eq!(
            (ev.method.as_str(), ev.path.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/default/events"),
            "{}",
            ev.body
        );
        assert_eq!(ev.body["reason"], "ScaledUp");
        seen.push((
            ev.body["metadata"]["name"].as_str().unwrap().to_string(),
            ev.body["note"].as_str().unwrap().to_string(),
        ));
        let body = ev.body.clone();
        ev.reply(201, &body);
        expect_status(&mut h, &m).await;
        task.await.unwrap().unwrap();
    }
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
    for (i, (from, to)) in [(0, 1), (1, 2), (2, 3)].into_iter().enumerate() {
        assert!(
            seen[i]
                .1
                .starts_with(&format!("serving replicas {from} -> {to} (")),
            "{seen:?}"
        );
    }
    assert!(seen[0].0 != seen[1].0 && seen[1].0 != seen[2].0, "{seen:?}");
}

/// A Deployment event after the finaliser ran reconciles the cached, deleting Model once
/// more: its cleanup is done again, and removing the finaliser finds the Model gone. That is
/// the end of the Model, not a failure: no error, no retry, nothing kept.
#[tokio::test]
async fn a_late_reconcile_of_a_deleted_model_is_not_an_error() {
    let mut h = Harness::new().await;
    let mut m = model("small", true);
    deleting(&mut m);
    let m = Arc::new(m);
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_deletes(&mut h, 404).await;
    let r = next(&mut h.handle).await;
    assert_eq!((r.method.as_str(), r.path.clone()), ("PATCH", model_path()));
    r.reply(404, &status_error(404, "NotFound"));
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
}

/// A tick whose status patch finds the Model gone: no error, and nothing of it is kept (no
/// broker record, no `/metrics` series, no memory: the next reconcile of a Model with that
/// name starts over with both applies).
#[tokio::test]
async fn a_tick_that_finds_its_model_gone_forgets_it() {
    let mut h = Harness::new().await;
    let m = Arc::new(model("small", true));
    h.broker.enqueue(&job()).await.unwrap();
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_applies(&mut h, &m, 0, 1).await;
    let ev = next(&mut h.handle).await;
    let body = ev.body.clone();
    ev.reply(201, &body);
    let r = next(&mut h.handle).await;
    assert_eq!(r.path, format!("{}/status", model_path()));
    r.reply(404, &status_error(404, "NotFound"));
    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_quiet(&mut h.handle, Duration::from_millis(100)).await;
    assert_eq!(h.broker.model(ID).await.unwrap(), None);
    let text = h.ctx.model_metrics.render();
    assert!(!text.contains(ID), "{text}");

    // the name is created again: a first reconcile
    h.advance(Duration::from_secs(2));
    let task = tokio::spawn(reconcile(m.clone(), h.ctx.clone()));
    expect_applies(&mut h, &m, 0, 1).await;
    let ev = next(&mut h.handle).await;
    assert_eq!(ev.body["reason"], "ScaledUp");
    let body = ev.body.clone();
    ev.reply(201, &body);
    expect_status(&mut h, &m).await;
    task.await.unwrap().unwrap();
    assert_eq!(
        h.broker.model(ID).await.unwrap().unwrap().state,
        ModelState::Starting
    );
}

#[tokio::test]
async fn a_gone_model_is_not_retried_and_other_failures_are() {
    let h = Harness::new().await;
    let m = Arc::new(model("small", true));
    assert_eq!(
        error_policy(m.clone(), &Error::Gone, h.ctx.clone()),
        Action::await_change()
    );
    assert_eq!(
        error_policy(m, &Error::Incomplete("namespace"), h.ctx.clone()),
        Action::requeue(Duration::from_secs(10))
    );
}
