//! The controller's life on a real API server (`scripts/cluster.sh`: etcd, kube-apiserver with
//! RBAC, kube-controller-manager; skipped with a message when `KUBECONFIG` is unset), always
//! running as the chart's ServiceAccount through impersonation (`tests/chart_rbac`), so every
//! request it makes is checked against exactly the chart's Role and ClusterRole:
//!
//! - delete: the finaliser fails the queued jobs with a clear error, and the real garbage
//!   collector removes the worker Deployments, ReplicaSets and pods; with the controller gone
//!   and the finaliser removed by hand, owner references alone clean up;
//! - leader election: of two controllers one leads; SIGKILLed, the other takes over within
//!   the lease duration, and the standby never touches a Deployment while it is not leading;
//! - restart: a controller restarted mid scale-up (backlog queued, pods not Ready) carries on
//!   from the cluster's state without scaling down and up again;
//! - RBAC: no request of the controller is denied, and the impersonated identity is refused
//!   what the chart does not grant;
//! - the chart: rendered with its defaults and every values example of the docs and
//!   `charts/tidal/ci/`, each object is accepted by the API server (server-side apply,
//!   `dryRun=All`).
//!
//! Pods are API objects nothing runs (no kubelet): `tests/cluster`'s NodeSim binds them and
//! marks them Ready; no worker process attaches, so queued jobs stay queued.

mod chart_common;
mod chart_rbac;
mod cluster;
mod crd_setup;
mod process;
mod skip;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chart_rbac::ChartRbac;
use cluster::{gate, Capacity, Cloud, NodeSim, Pool, SimConfig};
use futures::StreamExt;
use process::{eventually, free_port, KillOnDrop};
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use tidal_controller::k8s_openapi::api::coordination::v1::Lease;
use tidal_controller::k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use tidal_controller::k8s_openapi::api::events::v1::Event;
use tidal_controller::kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use tidal_controller::kube::runtime::{watcher, WatchStreamExt};
use tidal_controller::kube::Client;
use tidal_crds::Model;
use tidal_queue::{Broker, BrokerConfig, Job, RedisBroker, ResponseEvent};

/// The Lease duration of `tidal controller` (client-go's default) and its retry period.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// What the election's requests may add to its retry periods on a busy test machine.
const REQUEST_SLACK: Duration = Duration::from_secs(2);

/// One test's namespace, Redis prefix, chart identity and logs.
struct Setup {
    admin: Client,
    redis: String,
    ns: String,
    prefix: String,
    rbac: ChartRbac,
    broker: RedisBroker,
    dir: tempfile::TempDir,
}

impl Drop for Setup {
    /// Removes the test's Redis keys and namespace, passing or not.
    fn drop(&mut self) {
        tidal_queue::testing::delete_prefix(&self.redis, &self.prefix);
        // The test's runtime may be shutting down: a runtime and client of our own.
        let ns = self.ns.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let admin = Client::try_default().await?;
                // The controllers are gone: their finaliser would hold the namespace.
                let models: Api<Model> = Api::namespaced(admin.clone(), &ns);
                for m in models.list(&ListParams::default()).await?.items {
                    let name = m.metadata.name.unwrap_or_default();
                    let unfinalise = json!({"metadata": {"finalizers": null}});
                    let _ = models
                        .patch(&name, &PatchParams::default(), &Patch::Merge(unfinalise))
                        .await;
                }
                drop_namespace(&admin, &ns).await;
                anyhow::Ok(())
            })
        })
        .join();
    }
}

/// The admin client, or `None` after recording a skip when there is no cluster.
async fn admin_or_skip() -> Option<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        skip::skip("set KUBECONFIG to a disposable cluster (scripts/cluster.sh up) to run the Kubernetes lifecycle tests");
        return None;
    }
    Some(Client::try_default().await.expect("kubernetes client"))
}

/// Everything a test needs; `None` when it skips (no cluster, or Helm cannot render).
async fn setup(tag: &str) -> Option<Setup> {
    let admin = admin_or_skip().await?;
    let redis = tidal_queue::testing::ensure_redis().await.expect("redis");
    crd_setup::apply_crds(&admin, "tidal-e2e").await;
    let ns = format!("tidal-lc-{tag}-{}", std::process::id());
    cluster::create_namespace(&admin, &ns)
        .await
        .expect("namespace");
    let Some(rbac) = ChartRbac::install(&admin, &ns, &json!({}))
        .await
        .expect("the chart's RBAC")
    else {
        drop_namespace(&admin, &ns).await;
        return None;
    };
    let prefix = format!("{ns}:");
    let broker = RedisBroker::connect(
        &redis,
        BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        },
    )
    .await
    .expect("broker");
    Some(Setup {
        admin,
        redis,
        ns,
        prefix,
        rbac,
        broker,
        dir: tempfile::tempdir().expect("temp dir"),
    })
}

async fn drop_namespace(admin: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(admin.clone());
    let _ = api.delete(ns, &DeleteParams::default()).await;
}

/// A `tidal controller` process acting as the chart's ServiceAccount, logging to a file.
struct Controller {
    process: KillOnDrop,
    identity: String,
    log: PathBuf,
    metrics: String,
}

impl Controller {
    fn start(s: &Setup, identity: &str) -> Controller {
        let log = s.dir.path().join(format!("{identity}.log"));
        let ledger = s.dir.path().join(format!("{identity}.db"));
        let port = free_port();
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_tidal"))
            .env("KUBECONFIG", s.rbac.kubeconfig())
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info")
            .args(["controller", "--redis", &s.redis, "--key-prefix", &s.prefix])
            .args(["--ledger", &format!("sqlite:{}", ledger.display())])
            .args(["--namespace", &s.ns, "--lease-namespace", &s.ns])
            .args(["--lease-name", &s.rbac.lease_name])
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .args(["--tick-secs", "1"])
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start tidal controller");
        Controller {
            process: KillOnDrop(child),
            identity: identity.to_string(),
            log,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines that say the controller touched the cluster's workers or Models' Events.
    fn acting_lines(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| {
                l.contains("applied deployment")
                    || l.contains(" scaled")
                    || l.contains(" event ")
                    || l.contains("starting the reconciler")
            })
            .map(str::to_string)
            .collect()
    }

    /// `tidal_controller_reconciles_total` from its `/metrics` (0 before the first).
    async fn reconciles(&self) -> u64 {
        let Ok(r) = reqwest::get(&self.metrics).await else {
            return 0;
        };
        let text = r.text().await.unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with("tidal_controller_reconciles_total"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// Waits until it has reconciled `n` more times than `since`.
    async fn await_reconciles(&self, since: u64, n: u64) -> u64 {
        eventually(
            &format!("{} to reconcile {n} times", self.identity),
            Duration::from_secs(60),
            || async {
                let now = self.reconciles().await;
                (now >= since + n).then_some(now)
            },
        )
        .await
    }

    /// SIGTERM, as a pod's container gets on a restart; waits for the exit.
    async fn terminate(&mut self) -> Duration {
        let t0 = Instant::now();
        let pid = self.process.0.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        eventually("the controller to exit", Duration::from_secs(30), || {
            let exited = self.process.0.try_wait().ok().flatten().is_some();
            async move { exited.then_some(()) }
        })
        .await;
        t0.elapsed()
    }
}

/// No request of `controllers` was refused (a 403 shows up as "forbidden" in kube's errors).
fn assert_never_denied(controllers: &[&Controller]) {
    for c in controllers {
        let denied: Vec<String> = c
            .log()
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .map(str::to_string)
            .collect();
        assert!(
            denied.is_empty(),
            "{} was denied under the chart's RBAC:\n{}",
            c.identity,
            denied.join("\n")
        );
    }
}

/// Prints the controllers' logs when the test fails.
struct LogsOnFailure(Vec<(String, PathBuf)>);

impl LogsOnFailure {
    fn of(controllers: &[&Controller]) -> LogsOnFailure {
        LogsOnFailure(
            controllers
                .iter()
                .map(|c| (c.identity.clone(), c.log.clone()))
                .collect(),
        )
    }
}

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (identity, path) in &self.0 {
                let log = std::fs::read_to_string(path).unwrap_or_default();
                eprintln!("---- log of {identity} ----\n{log}");
            }
        }
    }
}

fn model(ns: &str, name: &str, max_replicas: u32) -> Model {
    serde_json::from_value(json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "source": {"uri": "file:///models/m.gguf"},
            "runtime": {"image": "ghcr.io/tidal/tidal:0.1.0"},
            "resources": {"cpu": "1", "memory": "1Gi"},
            "scaling": {"maxReplicas": max_replicas, "targetInFlightPerReplica": 1,
                        "scaleToZeroAfterSeconds": 600},
            "capacity": {"mode": "OnDemand"},
            "pricing": {"inputPerMillionMicros": 1, "cachedInputPerMillionMicros": 1,
                        "outputPerMillionMicros": 2}
        }
    }))
    .expect("a Model")
}

async fn create_model(s: &Setup, name: &str, max_replicas: u32) {
    let models: Api<Model> = Api::namespaced(s.admin.clone(), &s.ns);
    models
        .create(&PostParams::default(), &model(&s.ns, name, max_replicas))
        .await
        .expect("create the Model");
}

/// Queues `n` jobs for model `name` straight into Redis (no gateway needed).
async fn enqueue(s: &Setup, name: &str, n: usize) -> Vec<Job> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let mut jobs = Vec::new();
    for _ in 0..n {
        let job = Job {
            id: uuid::Uuid::now_v7(),
            tenant: "e2e".into(),
            model: format!("{}/{name}", s.ns),
            body: json!({"prompt": "hi", "max_tokens": 1}),
            enqueued_at_ms: now_ms,
            deadline_ms: now_ms + 600_000,
            resume: None,
        };
        s.broker.enqueue(&job).await.expect("enqueue");
        jobs.push(job);
    }
    jobs
}

async fn replicas(s: &Setup, deployment: &str) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(s.admin.clone(), &s.ns);
    api.get_opt(deployment).await.ok().flatten()?.spec?.replicas
}

async fn await_replicas(s: &Setup, deployment: &str, want: i32) -> Duration {
    let t0 = Instant::now();
    eventually(
        &format!("{deployment} at {want} replicas"),
        Duration::from_secs(60),
        || async { (replicas(s, deployment).await == Some(want)).then_some(()) },
    )
    .await;
    t0.elapsed()
}

/// Every `spec.replicas` a Deployment has had, in order, from a watch (so no value is
/// missed between two polls).
#[derive(Clone, Default)]
struct ReplicaHistory(Arc<Mutex<Vec<i32>>>);

impl ReplicaHistory {
    fn watch(s: &Setup, deployment: &str) -> (ReplicaHistory, tokio::task::JoinHandle<()>) {
        let history = ReplicaHistory::default();
        let api: Api<Deployment> = Api::namespaced(s.admin.clone(), &s.ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={deployment}"));
        let h = history.clone();
        let task = tokio::spawn(async move {
            let mut stream =
                std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(event) = stream.next().await {
                let Ok(d) = event else { continue };
                if let Some(r) = d.spec.and_then(|s| s.replicas) {
                    let mut v = h.0.lock().unwrap_or_else(|e| e.into_inner());
                    if v.last() != Some(&r) {
                        v.push(r);
                    }
                }
            }
        });
        (history, task)
    }

    fn values(&self) -> Vec<i32> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Names of the objects of `model` (by its pod-template label) still in the namespace.
async fn workers_left(s: &Setup, model: &str) -> Vec<String> {
    let lp = ListParams::default().labels(&format!("tidal.dev/model={model}"));
    let mut left = Vec::new();
    let deployments: Api<Deployment> = Api::namespaced(s.admin.clone(), &s.ns);
    let replicasets: Api<ReplicaSet> = Api::namespaced(s.admin.clone(), &s.ns);
    let pods: Api<Pod> = Api::namespaced(s.admin.clone(), &s.ns);
    for d in deployments
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        left.push(format!(
            "deployment/{}",
            d.metadata.name.unwrap_or_default()
        ));
    }
    for r in replicasets
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        left.push(format!(
            "replicaset/{}",
            r.metadata.name.unwrap_or_default()
        ));
    }
    for p in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        left.push(format!("pod/{}", p.metadata.name.unwrap_or_default()));
    }
    left
}

/// Pods of `model` by phase: (bound to a node, Ready).
async fn pods_of(s: &Setup, model: &str) -> (usize, usize) {
    let pods: Api<Pod> = Api::namespaced(s.admin.clone(), &s.ns);
    let lp = ListParams::default().labels(&format!("tidal.dev/model={model}"));
    let items = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    let live: Vec<&Pod> = items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let bound = live
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count();
    let ready = live
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    (bound, ready)
}

fn sim_config(s: &Setup, tag: &str) -> SimConfig {
    let mut config = SimConfig::new(&format!("lc-{tag}-{}", std::process::id()), &[&s.ns]);
    config.pools = vec![Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1)];
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_fails_queued_jobs_and_the_garbage_collector_removes_the_workers() {
    let Some(s) = setup("del").await else { return };
    let sim = NodeSim::start(s.admin.clone(), sim_config(&s, "del"))
        .await
        .expect("node simulator");
    let mut ctl = Controller::start(&s, "ctl-del");
    let _logs = LogsOnFailure::of(&[&ctl]);
    create_model(&s, "doomed", 2).await;
    create_model(&s, "orphan", 1).await;
    let jobs = enqueue(&s, "doomed", 2).await;
    enqueue(&s, "orphan", 1).await;
    await_replicas(&s, "doomed-ondemand", 2).await;
    await_replicas(&s, "orphan-ondemand", 1).await;
    eventually(
        "the workers' pods Ready",
        Duration::from_secs(60),
        || async {
            (pods_of(&s, "doomed").await.1 == 2 && pods_of(&s, "orphan").await.1 == 1).then_some(())
        },
    )
    .await;

    // Deleted while the controller runs: the finaliser.
    let models: Api<Model> = Api::namespaced(s.admin.clone(), &s.ns);
    let t0 = Instant::now();
    models
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        "the finaliser to finish",
        Duration::from_secs(60),
        || async { models.get_opt("doomed").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let finalised = t0.elapsed();
    for job in &jobs {
        let events = s
            .broker
            .read_responses(job.id, 0, 10, Duration::ZERO)
            .await
            .expect("responses");
        match events.as_slice() {
            [ResponseEvent::Error {
                status,
                code,
                message,
                ..
            }] => {
                assert_eq!((*status, code.as_str()), (404, "model_not_found"));
                let want = format!("the model `{}/doomed` was deleted", s.ns);
                assert!(message.contains(&want), "{message}");
            }
            other => panic!("job {}: {other:?}", job.id),
        }
    }
    eventually(
        "the garbage collector to remove doomed's workers",
        Duration::from_secs(60),
        || async { workers_left(&s, "doomed").await.is_empty().then_some(()) },
    )
    .await;
    let collected = t0.elapsed();

    // The controller gone first (as after `helm uninstall`): the Model stays Terminating
    // until its finaliser is removed by hand; then owner references alone clean up.
    ctl.process.0.kill().expect("kill");
    let _ = ctl.process.0.wait();
    models
        .delete("orphan", &DeleteParams::default())
        .await
        .expect("delete");
    let terminating = models.get("orphan").await.expect("still there");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        terminating.metadata.finalizers.as_deref(),
        Some(&[tidal_crds::FINALIZER.to_string()][..])
    );
    let t1 = Instant::now();
    models
        .patch(
            "orphan",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the finaliser");
    eventually(
        "owner references to remove orphan's workers",
        Duration::from_secs(60),
        || async { workers_left(&s, "orphan").await.is_empty().then_some(()) },
    )
    .await;
    let orphan_collected = t1.elapsed();
    assert_never_denied(&[&ctl]);
    eprintln!(
        "delete: finaliser done in {:.1}s, workers collected {:.1}s after the delete; \
         without the controller, owner references collected them {:.1}s after the finaliser \
         was removed",
        finalised.as_secs_f64(),
        collected.as_secs_f64(),
        orphan_collected.as_secs_f64()
    );
    sim.shutdown().await.expect("sim shutdown");
}

/// The Lease's holder, if any.
async fn holder(s: &Setup) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(s.admin.clone(), &s.ns);
    leases
        .get_opt(&s.rbac.lease_name)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The Events about model `name`: (reason, note, reporting instance).
async fn events_about(s: &Setup, name: &str) -> Vec<(String, String, String)> {
    let api: Api<Event> = Api::namespaced(s.admin.clone(), &s.ns);
    let mut events: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
        .into_iter()
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.reporting_instance.unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_from_a_killed_leader_within_the_lease_duration() {
    let Some(s) = setup("lead").await else { return };
    let a = Controller::start(&s, "ctl-a");
    let b = Controller::start(&s, "ctl-b");
    let _logs = LogsOnFailure::of(&[&a, &b]);
    let first = eventually("a leader", Duration::from_secs(60), || holder(&s)).await;
    let (mut leader, standby) = if first == a.identity { (a, b) } else { (b, a) };
    assert_eq!(first, leader.identity);
    let (history, watch) = ReplicaHistory::watch(&s, "lead-ondemand");
    create_model(&s, "lead", 4).await;
    enqueue(&s, "lead", 2).await;
    await_replicas(&s, "lead-ondemand", 2).await;
    assert!(
        standby.acting_lines().is_empty(),
        "the standby acted while not leading: {:?}",
        standby.acting_lines()
    );

    let t0 = Instant::now();
    leader.process.0.kill().expect("SIGKILL");
    let _ = leader.process.0.wait();
    let new = eventually("a new leader", Duration::from_secs(60), || async {
        holder(&s).await.filter(|h| *h != leader.identity)
    })
    .await;
    let takeover = t0.elapsed();
    assert_eq!(new, standby.identity);
    // The candidate takes the Lease once the record it observed has not changed for the
    // lease duration; it observes at most one retry period after the last renewal, which
    // was at most one retry period before the kill, and tries every retry period (plus the
    // requests' own time, allowed for below on a loaded machine).
    assert!(
        takeover <= LEASE_DURATION + 2 * RETRY_PERIOD + REQUEST_SLACK,
        "takeover took {takeover:?}"
    );
    enqueue(&s, "lead", 2).await;
    await_replicas(&s, "lead-ondemand", 4).await;
    let to_four = t0.elapsed();

    // The replicas only ever rose (a second scaler would have fought over them), and each
    // step was reported by the one who held the Lease then.
    let seen = history.values();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "replicas went {seen:?}"
    );
    assert_eq!(seen.last(), Some(&4), "{seen:?}");
    let events = events_about(&s, "lead").await;
    let reporters: Vec<&str> = events.iter().map(|e| e.2.as_str()).collect();
    let handover = reporters
        .iter()
        .position(|r| *r == standby.identity)
        .unwrap_or(reporters.len());
    assert!(
        handover > 0
            && reporters[..handover].iter().all(|r| *r == leader.identity)
            && reporters[handover..].iter().all(|r| *r == standby.identity),
        "events out of turn: {events:?}"
    );
    assert!(
        !reporters[handover..].is_empty(),
        "the new leader reported nothing: {events:?}"
    );
    let standby_log = standby.log();
    let acquired = standby_log
        .find("acquired leadership")
        .expect("the standby's log says it acquired leadership");
    for line in standby.acting_lines() {
        let at = standby_log.find(&line).unwrap_or(0);
        assert!(at > acquired, "the standby acted before leading: {line}");
    }
    assert_never_denied(&[&leader, &standby]);
    eprintln!(
        "leader election: {} led; SIGKILLed, {} took over after {:.1}s (lease {}s, retry {}s); \
         scaled to 4 {:.1}s after the kill; replicas {seen:?}; events by {reporters:?}",
        leader.identity,
        standby.identity,
        takeover.as_secs_f64(),
        LEASE_DURATION.as_secs(),
        RETRY_PERIOD.as_secs(),
        to_four.as_secs_f64()
    );
    watch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_mid_scale_up_does_not_flap() {
    let Some(s) = setup("restart").await else {
        return;
    };
    // Pods turn Ready only when the test says so: the restart happens mid cold start.
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let mut config = sim_config(&s, "restart");
    config.cold_start = Duration::from_millis(200);
    config.on_start = Some(gate(move |_pod| {
        let mut rx = release_rx.clone();
        async move {
            let _ = rx.wait_for(|released| *released).await;
        }
    }));
    let sim = NodeSim::start(s.admin.clone(), config)
        .await
        .expect("node simulator");
    let (history, watch) = ReplicaHistory::watch(&s, "rs-ondemand");
    let mut first = Controller::start(&s, "ctl-1");
    create_model(&s, "rs", 3).await;
    enqueue(&s, "rs", 3).await;
    await_replicas(&s, "rs-ondemand", 3).await;
    eventually(
        "three pods bound, none Ready",
        Duration::from_secs(60),
        || async { (pods_of(&s, "rs").await == (3, 0)).then_some(()) },
    )
    .await;

    let stopped = first.terminate().await;
    let t0 = Instant::now();
    let second = Controller::start(&s, "ctl-2");
    let _logs = LogsOnFailure::of(&[&first, &second]);
    eventually(
        "the new controller to lead",
        Duration::from_secs(60),
        || async { (holder(&s).await.as_deref() == Some("ctl-2")).then_some(()) },
    )
    .await;
    let leading = t0.elapsed();
    // Several ticks with the pods still starting, then with them Ready: the backlog stays.
    let n = second.await_reconciles(0, 5).await;
    assert_eq!(pods_of(&s, "rs").await, (3, 0));
    release_tx.send(true).expect("release the pods");
    eventually("three pods Ready", Duration::from_secs(60), || async {
        (pods_of(&s, "rs").await == (3, 3)).then_some(())
    })
    .await;
    second.await_reconciles(n, 3).await;
    let depth = s
        .broker
        .depth(&format!("{}/rs", s.ns))
        .await
        .expect("depth");
    assert_eq!(depth.backlog, 3);
    let seen = history.values();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "the replicas went down and up again across the restart: {seen:?}"
    );
    assert_eq!(replicas(&s, "rs-ondemand").await, Some(3));
    assert_never_denied(&[&first, &second]);
    eprintln!(
        "restart: SIGTERM to exit {:.1}s; the new process led {:.1}s after its start \
         (the old one released the Lease); replicas across the restart {seen:?}",
        stopped.as_secs_f64(),
        leading.as_secs_f64()
    );
    watch.abort();
    sim.shutdown().await.expect("sim shutdown");
}

/// Whether `result` is the API server's 403.
fn forbidden<T: std::fmt::Debug>(result: Result<T, tidal_controller::kube::Error>) -> bool {
    matches!(result, Err(tidal_controller::kube::Error::Api(ref e)) if e.code == 403)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_impersonated_controller_gets_the_charts_rules_and_nothing_else() {
    let Some(s) = setup("rbac").await else { return };
    let as_controller = s.rbac.client().await.expect("impersonating client");

    // Who the API server thinks this is.
    let reviews = chart_rbac::api_for(
        &as_controller,
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        None,
    )
    .await
    .expect("SelfSubjectReview");
    let review: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}),
    )
    .expect("review");
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .expect("review");
    assert_eq!(
        answer.data["status"]["userInfo"]["username"], s.rbac.user,
        "{answer:?}"
    );

    // Granted: what the controller does.
    let models: Api<Model> = Api::namespaced(as_controller.clone(), &s.ns);
    models
        .list(&ListParams::default())
        .await
        .expect("list Models");
    let nodes: Api<Node> = Api::all(as_controller.clone());
    nodes
        .list(&ListParams::default())
        .await
        .expect("list Nodes");
    let leases: Api<Lease> = Api::namespaced(as_controller.clone(), &s.ns);
    assert!(leases.get_opt(&s.rbac.lease_name).await.is_ok());

    // Refused: what the chart does not grant.
    let secrets: Api<Secret> = Api::namespaced(as_controller.clone(), &s.ns);
    assert!(
        forbidden(secrets.list(&ListParams::default()).await),
        "list Secrets"
    );
    assert!(
        forbidden(models.delete("any", &DeleteParams::default()).await),
        "delete a Model"
    );
    assert!(
        forbidden(leases.get("another-lease").await),
        "read another Lease"
    );
    let pods: Api<Pod> = Api::namespaced(as_controller.clone(), &s.ns);
    assert!(
        forbidden(pods.delete("any", &DeleteParams::default()).await),
        "delete a Pod"
    );
    assert!(
        forbidden(nodes.delete("any", &DeleteParams::default()).await),
        "delete a Node"
    );
    let elsewhere: Api<Deployment> = Api::namespaced(as_controller.clone(), "default");
    assert!(
        forbidden(elsewhere.list(&ListParams::default()).await),
        "Deployments outside the watched namespace"
    );
    let everywhere: Api<Model> = Api::all(as_controller.clone());
    assert!(
        forbidden(everywhere.list(&ListParams::default()).await),
        "Models of every namespace"
    );
}

/// The values the chart is installed with in the docs and in `charts/tidal/ci/`: (what,
/// values over `ci/minimal-values.yaml` where the example alone would not install).
fn documented_values(ns: &str) -> Vec<(String, Value)> {
    let minimal = chart_common::ci_values("minimal-values.yaml");
    let over = |v: Value| {
        let mut m = minimal.clone();
        chart_common::coalesce(&mut m, &v);
        m
    };
    let mut variants = vec![
        (
            "ci/minimal-values.yaml (the defaults and the two URLs)".to_string(),
            minimal.clone(),
        ),
        (
            "ci/full-values.yaml".to_string(),
            chart_common::ci_values("full-values.yaml"),
        ),
        (
            "docs: `helm install` with existing Secrets".to_string(),
            docs_install_values(),
        ),
        (
            "docs: controller.watchNamespace".to_string(),
            over(json!({"controller": {"watchNamespace": format!("{ns}-models")}})),
        ),
        (
            "docs: controller.clusterWide".to_string(),
            over(json!({"controller": {"clusterWide": true}})),
        ),
        (
            "docs: redis.workerUrl, keyPrefix, gateway.adminToken".to_string(),
            over(
                json!({"redis": {"workerUrl": "redis://workers.db.svc:6379/0"},
                        "keyPrefix": "prod:", "gateway": {"adminToken": {"value": "t"}}}),
            ),
        ),
        (
            "docs: gateway.ingress".to_string(),
            over(json!({"gateway": {"ingress": {"enabled": true}}})),
        ),
        (
            "docs: exampleModel, monitors and dashboard".to_string(),
            over(
                json!({"exampleModel": {"enabled": true}, "serviceMonitor": {"enabled": true},
                        "workerPodMonitor": {"enabled": true}, "grafanaDashboard": {"enabled": true}}),
            ),
        ),
        (
            "docs: upgrade with image.tag".to_string(),
            over(json!({"image": {"tag": "0.2.0"}})),
        ),
    ];
    let ci = chart_common::chart_dir().join("ci");
    let known: BTreeSet<&str> = ["minimal-values.yaml", "full-values.yaml"].into();
    for entry in std::fs::read_dir(&ci).expect("charts/tidal/ci").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !known.contains(name.as_str()) {
            variants.push((format!("ci/{name}"), chart_common::ci_values(&name)));
        }
    }
    variants
}

/// The `--set key=value` flags of the `helm install` in docs/kubernetes.md, as values.
fn docs_install_values() -> Value {
    let docs = std::fs::read_to_string(chart_common::root().join("docs/kubernetes.md"))
        .expect("docs/kubernetes.md");
    let install = docs
        .split("helm install ")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/kubernetes.md shows a `helm install`");
    let mut values = json!({});
    for flag in install.split("--set ").skip(1) {
        let pair = flag.split_whitespace().next().unwrap_or_default();
        let (key, value) = pair.split_once('=').expect("--set key=value");
        let mut v = Value::String(value.to_string());
        for part in key.rsplit('.') {
            v = json!({ part: v });
        }
        chart_common::coalesce(&mut values, &v);
    }
    assert!(
        values != json!({}),
        "no --set flags in the docs' helm install"
    );
    values
}

/// Kinds whose API comes from an operator this cluster does not run.
const THIRD_PARTY: [&str; 2] = ["ServiceMonitor", "PodMonitor"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_install_is_accepted_by_the_api_server() {
    let Some(admin) = admin_or_skip().await else {
        return;
    };
    let Some(renderer) =
        chart_common::renderer_or_skip("every_documented_install_is_accepted_by_the_api_server")
    else {
        return;
    };
    // The chart's CRD first, as Helm installs crds/ before the templates.
    let crd = chart_common::chart_yaml("crds/model.yaml");
    chart_rbac::apply(&admin, &crd, "default", false)
        .await
        .expect("the chart's CRD");
    crd_setup::apply_crds(&admin, "tidal-e2e").await;
    let ns = format!("tidal-lc-chart-{}", std::process::id());
    for n in [ns.clone(), format!("{ns}-models")] {
        cluster::create_namespace(&admin, &n)
            .await
            .expect("namespace");
    }
    let mut accepted = 0;
    let mut not_checked = BTreeSet::new();
    for (what, values) in documented_values(&ns) {
        let manifests = chart_common::render_release(&renderer, &values, "tidal", &ns)
            .unwrap_or_else(|e| panic!("{what}: Helm refused: {e}"));
        assert!(!manifests.is_empty(), "{what}: nothing rendered");
        for m in &manifests {
            if THIRD_PARTY.contains(&m.kind.as_str()) {
                not_checked.insert(m.kind.clone());
                continue;
            }
            chart_rbac::apply(&admin, &m.doc, &ns, true)
                .await
                .unwrap_or_else(|e| panic!("{what}: {} {} refused: {e:#}", m.kind, m.name));
            accepted += 1;
        }
    }
    eprintln!(
        "chart: {accepted} objects accepted (server-side apply, dryRun=All); not checked \
         (their CRDs come with prometheus-operator): {not_checked:?}"
    );
    for n in [ns.clone(), format!("{ns}-models")] {
        drop_namespace(&admin, &n).await;
    }
}
