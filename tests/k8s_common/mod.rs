//! A Tidal installation on the control plane of `scripts/cluster.sh`, for end-to-end tests
//! from the user's side: the CRD applied, `tidal controller`, `tidal gateway` and
//! `tidal billing` processes over the test Redis (a key prefix of their own) and a scratch
//! PostgreSQL ledger, a tenant with an API key, and the node simulator of `tests/cluster`
//! playing scheduler and kubelet. A pod it makes Ready runs as a `tidal runtime --queue`
//! process outside the cluster, started with the pod's own arguments ([`PodWorkers`]), and
//! gets SIGTERM when the pod is deleted.
//!
//! The controller acts as the chart's ServiceAccount (impersonated, with exactly the chart's
//! RBAC: `tests/chart_rbac`) wherever the chart can be rendered (`helm`, or
//! `$TIDAL_HELM_PYTHON`), else with the admin credentials, which the test output says.
//!
//! The test crate declares `mod chart_common; mod chart_rbac; mod cluster; mod process;
//! mod skip;` beside this module.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::{json, Value};
use tidal_billing::scratch::{ScratchDb, DEFAULT_SERVER_URL};
use tidal_controller::k8s_openapi::api::apps::v1::Deployment;
use tidal_controller::k8s_openapi::api::core::v1::{Event, Namespace};
use tidal_controller::kube::api::{Api, DeleteParams, ListParams, PostParams};
use tidal_controller::kube::runtime::{watcher, WatchStreamExt};
use tidal_controller::kube::Client;
use tidal_crds::{Model, ModelPool};
use tidal_queue::{Broker, BrokerConfig, RedisBroker};

use crate::chart_rbac::ChartRbac;
use crate::cluster::{gate, Gate, PodInfo};
use crate::process::{eventually, free_port, tidal_json, KillOnDrop};

/// Field manager of what the tests apply.
const MANAGER: &str = "tidal-k8s-e2e";

/// A client of the cluster in `KUBECONFIG`, or `None` after recording the skip.
pub async fn client_or_skip() -> Option<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        crate::skip::skip(
            "set KUBECONFIG (eval \"$(bash scripts/cluster.sh up)\") to run the Kubernetes end-to-end tests",
        );
        return None;
    }
    Some(
        Client::try_default()
            .await
            .expect("a client of the cluster in KUBECONFIG"),
    )
}

/// Milliseconds since the Unix epoch (unique names).
fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// A file for a process's log, removed with the test's temporary directory.
fn log_file(path: &Path) -> Stdio {
    std::fs::File::create(path)
        .expect("create a log file")
        .into()
}

/// The last `n` lines of the file at `path`.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One installation: namespace, processes, tenant. Dropping it stops the processes and
/// removes the queue's keys; [`Stack::teardown`] also deletes the Models and the namespace.
pub struct Stack {
    pub client: Client,
    /// The namespace of the test's Models and pods.
    pub ns: String,
    /// Redis URL (the machine's test Redis).
    pub redis: String,
    /// Key prefix of this installation's queue.
    pub prefix: String,
    /// The broker, as the test reads it.
    pub broker: Arc<dyn Broker>,
    /// Ledger URL.
    pub ledger: String,
    /// Gateway base URL.
    pub gateway: String,
    /// `tidal billing` base URL.
    pub billing: String,
    /// Tenant of the test's requests, and its API key.
    pub tenant: String,
    pub key: String,
    /// Where the processes' logs go.
    pub dir: tempfile::TempDir,
    /// The chart's controller identity the controller runs as (`None`: admin).
    pub rbac: Option<ChartRbac>,
    processes: Vec<KillOnDrop>,
    scratch: Option<ScratchDb>,
}

impl Stack {
    /// Applies the CRD, creates namespace `k8s-<tag>-<pid>`, and starts the controller (tick
    /// 1 s, this namespace only), the gateway and billing on a fresh key prefix and scratch
    /// ledger; makes tenant `<tag>` and its key.
    pub async fn start(client: Client, tag: &str) -> Stack {
        crate::crd_setup::apply_crds(&client, MANAGER).await;
        let ns = format!("k8s-{tag}-{}", std::process::id());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create the test namespace");
        let rbac = match crate::chart_common::renderer() {
            Ok(_) => {
                let rbac = ChartRbac::install(&client, &ns, &json!({}))
                    .await
                    .expect("install the chart's controller RBAC");
                if let Some(r) = &rbac {
                    println!("(the controller acts as {} with the chart's RBAC)", r.user);
                }
                rbac
            }
            Err(why) => {
                println!("(the controller runs with the admin credentials: cannot render the chart: {why})");
                None
            }
        };

        let redis = tidal_queue::testing::ensure_redis()
            .await
            .expect("the test Redis (scripts/services.sh starts it)");
        let prefix = format!("tidal-k8s-{tag}-{}-{}:", std::process::id(), nanos());
        let broker: Arc<dyn Broker> = Arc::new(
            RedisBroker::connect(
                &redis,
                BrokerConfig {
                    prefix: prefix.clone(),
                    ..BrokerConfig::default()
                },
            )
            .await
            .expect("connect to the test Redis"),
        );
        let server =
            std::env::var("TIDAL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.into());
        let scratch = ScratchDb::postgres(&server, "k8s")
            .await
            .expect("a scratch ledger on PostgreSQL (scripts/services.sh starts it)");
        let ledger = scratch.url.clone();
        let dir = tempfile::Builder::new()
            .prefix(&format!("tidal-k8s-{tag}-"))
            .tempdir()
            .expect("a temporary directory");

        let mut stack = Stack {
            client,
            ns,
            redis,
            prefix,
            broker,
            ledger,
            gateway: String::new(),
            billing: String::new(),
            tenant: tag.to_string(),
            key: String::new(),
            dir,
            rbac,
            processes: Vec::new(),
            scratch: Some(scratch),
        };
        // The controller first: it migrates the ledger the others then share.
        stack.start_controller().await;
        let (gateway, base) = crate::process::start_gateway_with(
            &stack.redis,
            &stack.prefix,
            &stack.ledger,
            log_file(&stack.log("gateway")),
        )
        .await;
        stack.processes.push(gateway);
        stack.gateway = base;
        let (billing, base) = crate::process::start_billing(
            &stack.redis,
            &stack.prefix,
            &stack.ledger,
            log_file(&stack.log("billing")),
        )
        .await;
        stack.processes.push(billing);
        stack.billing = base;
        tidal_json(&["keys", "--database", &stack.ledger, "create-tenant", tag]);
        stack.key = tidal_json(&["keys", "--database", &stack.ledger, "issue", tag])["secret"]
            .as_str()
            .expect("a key secret")
            .to_owned();
        stack
    }

    /// Path of process `name`'s log.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// Starts `tidal controller` (as the chart's ServiceAccount where [`Stack::rbac`] is
    /// set) and waits for its `/health`.
    async fn start_controller(&mut self) {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_tidal"));
        command
            .args([
                "controller",
                "--redis",
                &self.redis,
                "--ledger",
                &self.ledger,
            ])
            .args(["--key-prefix", &self.prefix, "--namespace", &self.ns])
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .args(["--tick-secs", "1"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(&self.log("controller")));
        if let Some(rbac) = &self.rbac {
            command.env("KUBECONFIG", rbac.kubeconfig()).args([
                "--lease-namespace",
                &self.ns,
                "--lease-name",
                &rbac.lease_name,
            ]);
        }
        let child = command.spawn().expect("start tidal controller");
        self.processes.push(KillOnDrop(child));
        let health = format!("http://127.0.0.1:{port}/health");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = reqwest::get(&health)
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tidal controller not healthy after 60 s:\n{}",
                self.controller_log(40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates `model` in the namespace (its `metadata.namespace` is set here).
    pub async fn create_model(&self, mut model: Value) -> Model {
        model["metadata"]["namespace"] = json!(self.ns);
        let model: Model = serde_json::from_value(model).expect("a Model");
        Api::<Model>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &model)
            .await
            .expect("create the Model")
    }

    /// Creates the `ModelPool` `pool` in the namespace (its `metadata.namespace` is set here).
    pub async fn create_pool(&self, mut pool: Value) -> ModelPool {
        pool["metadata"]["namespace"] = json!(self.ns);
        let pool: ModelPool = serde_json::from_value(pool).expect("a ModelPool");
        Api::<ModelPool>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pool)
            .await
            .expect("create the ModelPool")
    }

    /// The `ModelPool` `name` as the API has it now.
    pub async fn pool(&self, name: &str) -> Option<ModelPool> {
        Api::<ModelPool>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
    }

    /// The Model `name` as the API has it now.
    pub async fn model(&self, name: &str) -> Option<Model> {
        Api::<Model>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
    }

    /// The queue's model id of Model `name`.
    pub fn model_id(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    /// Waits until the gateway knows Model `name` (the controller published its record).
    pub async fn wait_published(&self, name: &str) {
        let id = self.model_id(name);
        eventually(
            &format!("the record of {id} published"),
            Duration::from_secs(60),
            || async { self.broker.model(&id).await.ok().flatten().map(|_| ()) },
        )
        .await;
    }

    /// The reasons and messages of the Events about Model `name`, oldest first.
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let mut events = Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&lp)
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        events.sort_by(|a, b| {
            let at = |e: &Event| {
                e.event_time
                    .as_ref()
                    .map(|t| t.0)
                    .or(e.first_timestamp.as_ref().map(|t| t.0))
            };
            at(a).cmp(&at(b))
        });
        events
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Waits until the jobs of Model `name` are settled (none queued or held) and `tidal
    /// billing` has taken every usage event off the queue (it deletes what it recorded).
    pub async fn wait_billed(&self, name: &str) {
        let id = self.model_id(name);
        let key = format!("{}usage", self.prefix);
        eventually(
            "every usage event recorded by tidal billing",
            Duration::from_secs(60),
            || async {
                let d = self.broker.depth(&id).await.ok()?;
                if d.backlog + d.in_flight > 0 {
                    return None;
                }
                let left: u64 = tokio::task::block_in_place(|| {
                    let mut c = redis::Client::open(self.redis.as_str())
                        .and_then(|c| c.get_connection())
                        .ok()?;
                    redis::cmd("XLEN").arg(&key).query(&mut c).ok()
                })?;
                (left == 0).then_some(())
            },
        )
        .await;
    }

    /// The usage segments the ledger recorded, in request and segment order (read with
    /// `psql`, which comes with the PostgreSQL the ledger runs on).
    pub fn billed_segments(&self) -> Vec<Segment> {
        let out = Command::new("psql")
            .arg(&self.ledger)
            .args(["-v", "ON_ERROR_STOP=1", "-At", "-F", "|", "-c"])
            .arg(
                "SELECT request_id, segment, tenant_id, prompt_tokens, completion_tokens, \
                 capacity, worker, model_id FROM usage_events ORDER BY request_id, segment",
            )
            .output()
            .expect("run psql (the PostgreSQL client)");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split('|').collect();
                let n = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
                Segment {
                    request_id: f.first().unwrap_or(&"").to_string(),
                    segment: n(1),
                    tenant: f.get(2).unwrap_or(&"").to_string(),
                    prompt_tokens: n(3),
                    completion_tokens: n(4),
                    capacity: f.get(5).unwrap_or(&"").to_string(),
                    worker: f.get(6).unwrap_or(&"").to_string(),
                    model: f.get(7).unwrap_or(&"").to_string(),
                }
            })
            .collect()
    }

    /// The tenant's usage report from `tidal billing` (`GET /v1/usage`, this month).
    pub async fn usage_report(&self) -> Value {
        let month = chrono::Utc::now().format("%Y-%m").to_string();
        let r = reqwest::Client::new()
            .get(format!("{}/v1/usage?month={month}", self.billing))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("GET /v1/usage");
        let status = r.status();
        let body = r.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET /v1/usage: {status}: {body}");
        serde_json::from_str(&body).expect("a usage report")
    }

    /// The tail of the controller's log.
    pub fn controller_log(&self, n: usize) -> String {
        tail(&self.log("controller"), n)
    }

    /// Deletes Model `name` and waits until the finaliser let it go.
    pub async fn delete_model(&self, name: &str) {
        let api: Api<Model> = Api::namespaced(self.client.clone(), &self.ns);
        let _ = api.delete(name, &DeleteParams::default()).await;
        eventually(
            &format!("Model {name} deleted"),
            Duration::from_secs(60),
            || async { api.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }

    /// Deletes the namespace and the scratch ledger; the processes stop on drop.
    pub async fn teardown(mut self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        self.processes.clear();
        if let Some(db) = self.scratch.take() {
            if let Err(e) = db.drop_db().await {
                eprintln!("dropping the scratch ledger: {e}");
            }
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.processes.clear();
        tidal_queue::testing::delete_prefix(&self.redis, &self.prefix);
        if std::thread::panicking() {
            for name in ["controller", "gateway", "billing"] {
                eprintln!(
                    "--- last lines of {name}.log ---\n{}",
                    tail(&self.log(name), 40)
                );
            }
        }
    }
}

/// One usage segment as the ledger recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub request_id: String,
    pub segment: u64,
    pub tenant: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `spot` or `on_demand`.
    pub capacity: String,
    pub worker: String,
    /// The model id.
    pub model: String,
}

/// A worker process started for a pod.
struct PodWorker {
    child: Child,
    log: PathBuf,
    started: Instant,
}

/// What became of a pod's worker when its pod was deleted.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// The pod (and worker) name.
    pub pod: String,
    /// Its capacity type (`spot`, `on-demand`).
    pub pool: String,
    /// Exit code after SIGTERM (`None`: killed, or no exit in time).
    pub code: Option<i32>,
    /// Its log.
    pub log: String,
}

/// Runs a `tidal runtime --queue` process for every pod the simulator makes Ready, with the
/// arguments the controller gave the pod's container (the weights path and listen address
/// replaced by local ones, the pod's name as the worker's name, as its host name would be),
/// and stops it with SIGTERM when the pod is deleted, as the kubelet does.
#[derive(Clone)]
pub struct PodWorkers {
    inner: Arc<Inner>,
}

struct Inner {
    model: PathBuf,
    broker: Arc<dyn Broker>,
    dir: PathBuf,
    running: Mutex<HashMap<String, PodWorker>>,
    stopped: Mutex<Vec<Stopped>>,
}

impl PodWorkers {
    /// Workers on the weights at `model`, reporting through `broker`, logging into `dir`.
    pub fn new(model: &Path, broker: Arc<dyn Broker>, dir: &Path) -> PodWorkers {
        PodWorkers {
            inner: Arc::new(Inner {
                model: model.to_path_buf(),
                broker,
                dir: dir.to_path_buf(),
                running: Mutex::new(HashMap::new()),
                stopped: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The simulator's start gate: starts the pod's worker and returns once it sent its first
    /// heartbeat (model loaded, claiming), so that the pod turns Ready when the worker is.
    pub fn on_start(&self) -> Gate {
        let me = self.clone();
        gate(move |pod| {
            let me = me.clone();
            async move { me.start(pod).await }
        })
    }

    /// The simulator's stop gate: SIGTERM to the pod's worker, then wait until it exited
    /// (within the pod's grace period, which the simulator enforces).
    pub fn on_stop(&self) -> Gate {
        let me = self.clone();
        gate(move |pod| {
            let me = me.clone();
            async move { me.stop(pod).await }
        })
    }

    /// Workers that stopped so far.
    pub fn stopped(&self) -> Vec<Stopped> {
        self.inner
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Names of the running workers.
    pub fn running(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// The logs of the running workers (for a failing test's message).
    pub fn logs(&self) -> String {
        let running = self.inner.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .iter()
            .map(|(name, w)| format!("--- worker {name} ---\n{}", tail(&w.log, 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The pod's container arguments made local.
    /// A pool worker's model directory is a fresh directory per pod (the node cache is
    /// not simulated) and each `--pool-model ID=PATH` points at the local weights.
    fn local_args(&self, pod: &PodInfo, port: u16) -> Vec<String> {
        let mut args = pod.args.clone();
        let mut i = 0;
        while i + 1 < args.len() {
            match args[i].as_str() {
                "--model" => args[i + 1] = self.inner.model.display().to_string(),
                "--listen" => args[i + 1] = format!("127.0.0.1:{port}"),
                "--model-dir" => {
                    let dir = self.inner.dir.join(format!("cache-{}", pod.name));
                    std::fs::create_dir_all(&dir).expect("a pool worker's model directory");
                    args[i + 1] = dir.display().to_string();
                }
                "--pool-model" => {
                    let id = args[i + 1]
                        .split('=')
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    args[i + 1] = format!("{id}={}", self.inner.model.display());
                }
                _ => {}
            }
            i += 1;
        }
        // the local weights are not the file the Model's source names
        let mut j = 0;
        while j + 1 < args.len() {
            if args[j] == "--pool-model-sha256" {
                args.drain(j..j + 2);
            } else {
                j += 1;
            }
        }
        args.extend(["--worker-name".into(), pod.name.clone()]);
        args
    }

    /// Whether the pod's worker has sent a heartbeat and is not draining: its model's
    /// (`--model-id`), or its pool's (`--pool`).
    async fn beating(&self, args: &[String], pod: &str) -> bool {
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        if let Some(pool) = value("--pool") {
            return self
                .inner
                .broker
                .pool_workers(&pool)
                .await
                .is_ok_and(|beats| beats.iter().any(|b| b.worker == pod && !b.draining));
        }
        let model_id = value("--model-id").unwrap_or_default();
        self.inner
            .broker
            .workers(&model_id)
            .await
            .is_ok_and(|beats| beats.iter().any(|b| b.worker == pod && !b.draining))
    }

    async fn start(&self, pod: PodInfo) {
        let port = free_port();
        let args = self.local_args(&pod, port);
        let log = self.inner.dir.join(format!("worker-{}.log", pod.name));
        let child = Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(&log))
            .spawn()
            .expect("start tidal runtime");
        eprintln!(
            "k8s-e2e: pod {} Ready on {} ({} pool): started `tidal {}`",
            pod.name,
            pod.node,
            pod.pool,
            args.join(" ")
        );
        self.inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                pod.name.clone(),
                PodWorker {
                    child,
                    log: log.clone(),
                    started: Instant::now(),
                },
            );
        // Ready once the worker claims work: its first heartbeat. A worker that dies or never
        // loads leaves the pod Ready without one, and the test's own waits fail with the log.
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.beating(&args, &pod.name).await {
                return;
            }
            let exited = self
                .inner
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&pod.name)
                .is_none_or(|w| !matches!(w.child.try_wait(), Ok(None)));
            if exited {
                eprintln!(
                    "k8s-e2e: the worker of {} exited before it was ready:\n{}",
                    pod.name,
                    tail(&log, 30)
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "k8s-e2e: the worker of {} sent no heartbeat in 120 s:\n{}",
            pod.name,
            tail(&log, 30)
        );
    }

    async fn stop(&self, pod: PodInfo) {
        let worker = self
            .inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod.name);
        let Some(mut worker) = worker else {
            return; // deleted before it was started
        };
        let pid = worker.child.id();
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let code = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let code = loop {
                match worker.child.try_wait() {
                    Ok(Some(status)) => break status.code(),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = worker.child.kill();
                        let _ = worker.child.wait();
                        break None;
                    }
                }
            };
            (code, worker)
        })
        .await;
        let (code, worker) = match code {
            Ok(v) => v,
            Err(_) => return,
        };
        eprintln!(
            "k8s-e2e: pod {} deleted: its worker exited with {code:?} after SIGTERM ({:.1} s after it started)",
            pod.name,
            worker.started.elapsed().as_secs_f64()
        );
        let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
        self.inner
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Stopped {
                pod: pod.name,
                pool: pod.pool,
                code,
                log,
            });
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, mut w) in running.drain() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// One change of a Deployment's `spec.replicas`, when the test's watch saw it.
#[derive(Debug, Clone)]
pub struct Change {
    pub at: Instant,
    pub deployment: String,
    pub replicas: i32,
}

/// Every change of the `spec.replicas` of the Deployments in one namespace, as a watch sees
/// them (the controller's scale patches, timed within the watch's latency).
pub struct Timeline {
    changes: Arc<Mutex<Vec<Change>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    /// Starts watching the Deployments of `ns`.
    pub fn watch(client: &Client, ns: &str) -> Timeline {
        let changes = Arc::new(Mutex::new(Vec::<Change>::new()));
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let sink = changes.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let Ok(d) = item else { continue };
                let at = Instant::now();
                let name = d.metadata.name.clone().unwrap_or_default();
                let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let mut changes = sink.lock().unwrap_or_else(|e| e.into_inner());
                let last = changes
                    .iter()
                    .rev()
                    .find(|c| c.deployment == name)
                    .map(|c| c.replicas);
                if last != Some(replicas) {
                    changes.push(Change {
                        at,
                        deployment: name,
                        replicas,
                    });
                }
            }
        });
        Timeline { changes, task }
    }

    /// The latest replicas of `deployment` seen, and when they were set.
    pub fn current(&self, deployment: &str) -> Option<Change> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|c| c.deployment == deployment)
            .cloned()
    }

    /// Every change seen so far.
    pub fn changes(&self) -> Vec<Change> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `deployment` has `replicas`; when that change was seen.
    pub async fn wait(&self, deployment: &str, replicas: i32, limit: Duration) -> Instant {
        eventually(
            &format!("{deployment} scaled to {replicas}"),
            limit,
            || async {
                self.current(deployment)
                    .filter(|c| c.replicas == replicas)
                    .map(|c| c.at)
            },
        )
        .await
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `kubectl ARGS` with `$TIDAL_KUBECTL` (kubectl 1.37 from `scripts/kubectl-venv.sh`) and
/// the test's `KUBECONFIG`, printed with the command line so the test output shows real
/// output; a note instead when `$TIDAL_KUBECTL` is unset.
pub fn show_kubectl(args: &[&str]) -> Option<String> {
    let Some(kubectl) = std::env::var_os("TIDAL_KUBECTL") else {
        println!(
            "(not showing `kubectl {}`: set TIDAL_KUBECTL=\"$(bash scripts/kubectl-venv.sh)\")",
            args.join(" ")
        );
        return None;
    };
    let out = Command::new(kubectl).args(args).output();
    let text = match out {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("(kubectl did not run: {e})"),
    };
    println!("$ kubectl {}\n{}", args.join(" "), text.trim_end());
    Some(text)
}

/// What a client received from one streamed chat completion.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// The request id (`x-request-id`).
    pub id: String,
    /// The content, concatenated.
    pub content: String,
    /// Content chunks received.
    pub deltas: usize,
    /// `finish_reason` of the last choice.
    pub finish: Option<String>,
    /// `usage.prompt_tokens` and `usage.completion_tokens` of the final chunk.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// When the first content chunk arrived.
    pub first_delta: Option<Instant>,
    /// When the stream ended.
    pub ended: Instant,
}

/// Streams a chat completion through the gateway (real HTTP, SSE), parsing each chunk as it
/// arrives; `first` is told when the first content chunk is in.
pub async fn stream_chat(
    base: &str,
    key: &str,
    body: Value,
    first: Option<tokio::sync::oneshot::Sender<()>>,
) -> Streamed {
    let mut first = first;
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("POST /v1/chat/completions");
    let status = r.status();
    let id = r
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if !status.is_success() {
        panic!(
            "the gateway answered {status}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    let mut s = Streamed {
        id,
        content: String::new(),
        deltas: 0,
        finish: None,
        prompt_tokens: 0,
        completion_tokens: 0,
        first_delta: None,
        ended: Instant::now(),
    };
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut done = false;
    while let Some(part) = body.next().await {
        let part = part.expect("the stream broke off");
        buf.push_str(&String::from_utf8_lossy(&part));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let chunk: Value = serde_json::from_str(data)
                    .unwrap_or_else(|e| panic!("a bad chunk {data}: {e}"));
                if let Some(choice) = chunk["choices"].get(0) {
                    if let Some(text) = choice["delta"]["content"].as_str() {
                        s.content.push_str(text);
                        s.deltas += 1;
                        if s.first_delta.is_none() {
                            s.first_delta = Some(Instant::now());
                            if let Some(tx) = first.take() {
                                let _ = tx.send(());
                            }
                        }
                    }
                    if let Some(f) = choice["finish_reason"].as_str() {
                        s.finish = Some(f.to_string());
                    }
                }
                if let Some(u) = chunk["usage"].as_object() {
                    s.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                    s.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    assert!(done, "the stream ended without [DONE]: {s:?}");
    s.ended = Instant::now();
    s
}

/// When the model's queue first shows the request (backlog or in flight), polled every 10 ms
/// from now on, for at most `limit`.
pub async fn first_enqueued(broker: Arc<dyn Broker>, model: String, limit: Duration) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(d) = broker.depth(&model).await {
            if d.backlog + d.in_flight > 0 {
                return Instant::now();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no request reached the queue of {model}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Seconds, for printing.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
