//! A node simulator for tests on the real control plane of `scripts/cluster.sh` (etcd,
//! kube-apiserver, kube-controller-manager; no scheduler, no kubelet), doing what kwok does.
//!
//! [`NodeSim::start`] registers the nodes of some [`Pool`]s (spot and on-demand, labelled and
//! tainted as GKE, EKS with Karpenter or AKS label them, see [`Cloud`]), each with allocatable
//! cpu, memory and `nvidia.com/gpu`, a `Ready` condition and a heartbeat Lease. Its
//! background task then plays scheduler and kubelet for the pods of the namespaces it is given
//! (only those: tests running side by side each simulate their own):
//!
//! - a pending pod is bound (`pods/binding`) to the ready node with the most free cpu among
//!   those it fits: `nodeSelector`, required node affinity, tolerations against `NoSchedule`
//!   and `NoExecute` taints, cordons, and its requests (limits where a request is left out)
//!   against what the node's pods already request. A pod that fits nowhere stays `Pending`
//!   with `PodScheduled=False`, reason `Unschedulable` and the scheduler's message, and is
//!   retried whenever pods or nodes change;
//! - a bound pod is `Pending` (containers `ContainerCreating`) for the cold start, then, once
//!   the [`SimConfig::on_start`] gate (if any) has returned, `Running` and `Ready` (through
//!   `pods/status`): the controller measures its cold start from that;
//! - a deleted pod on a simulated node goes (a force delete, as the kubelet finishes a
//!   graceful one) once the [`SimConfig::on_stop`] gate (if any) has returned, or when its
//!   grace period is up.
//!
//! [`NodeSim::interrupt`] reclaims a spot node the way its cloud does: the cloud's notice
//! (GKE: taint `cloud.google.com/impending-node-termination:NoSchedule`; EKS: Karpenter's
//! `karpenter.sh/disrupted:NoSchedule`; AKS: condition `VMEventScheduled=True`), then after
//! the notice period (30 s, 120 s on EKS; [`SimConfig::notice`] shortens it) its pods are
//! deleted and then the node itself. [`NodeSim::restore`] brings the same node back (as GKE
//! recreates a preempted VM); [`NodeSim::add_node`] adds a new one to a pool.
//!
//! Every step is also published as a [`SimEvent`] ([`NodeSim::events`]), e.g. to start a
//! worker process outside the cluster when a pod is `Ready` and stop it when it is deleted:
//!
//! ```ignore
//! let client = Client::try_default().await?;
//! let mut config = SimConfig::new("sim-a", &[ns.as_str()]);
//! config.pools = vec![
//!     Pool::new("spot", Cloud::Gke, Capacity::Spot, 2),
//!     Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1).gpus(1, "NVIDIA-L4"),
//! ];
//! config.cold_start = Duration::from_secs(2);
//! config.notice = Some(Duration::from_secs(3));
//! let sim = NodeSim::start(client, config).await?;
//! let mut events = sim.events();
//! // ... create a Model; wait for SimEvent::Ready(pod) ...
//! sim.interrupt(&pod.node).await?;
//! ```
//!
//! Dropping the [`NodeSim`] (or [`NodeSim::shutdown`]) force-deletes the pods on its nodes and
//! deletes the nodes. Nodes of a simulator whose process died are deleted by the next one
//! once their Lease is two minutes old.

#![allow(dead_code)]

pub mod fit;
mod kubelet;
pub mod nodes;
mod status;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;
use serde_json::json;
use tidal_controller::k8s_openapi::api::coordination::v1::Lease;
use tidal_controller::k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use tidal_controller::k8s_openapi::jiff::Timestamp;
use tidal_controller::kube::api::{Api, DeleteParams, ListParams, PostParams};
use tidal_controller::kube::runtime::{reflector, watcher, WatchStreamExt};
use tidal_controller::kube::Client;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinSet;

#[allow(unused_imports)] // each test binary uses a part
pub use nodes::{Allocatable, Capacity, Cloud, Pool, SIM_LABEL};

/// A pod the simulator runs, as the hooks and events see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// uid (names of a Deployment's pods never repeat, uids are unique anyway).
    pub uid: String,
    /// The node it is bound to.
    pub node: String,
    /// That node's pool.
    pub pool: String,
    /// That pool's capacity type.
    pub capacity: Capacity,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod IP the simulator gave it.
    pub ip: String,
    /// The first container's command (e.g. `["tidal"]` for a worker).
    pub command: Vec<String>,
    /// The first container's arguments (e.g. `runtime --model ... --queue ...`).
    pub args: Vec<String>,
}

/// What happened, in order per pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEvent {
    /// Bound to a node; its cold start begins.
    Bound(PodInfo),
    /// `Running` and `Ready`.
    Ready(PodInfo),
    /// Deleted by someone (ReplicaSet scale-down, an interruption, a test): draining.
    Terminating(PodInfo),
    /// Gone from the API.
    Deleted(PodInfo),
    /// Fits no node (sent again when the reason changes).
    Unschedulable {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The scheduler-style message.
        message: String,
    },
    /// The node got its cloud's interruption notice.
    NodeInterrupted(String),
    /// The node is gone (interrupted, or removed).
    NodeGone(String),
    /// The node was registered (at start, [`NodeSim::add_node`], [`NodeSim::restore`]).
    NodeAdded(String),
}

/// A hook the simulator awaits: see [`SimConfig::on_start`], [`SimConfig::on_stop`].
pub type Gate = Arc<dyn Fn(PodInfo) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Wraps an async closure as a [`Gate`].
pub fn gate<F, Fut>(f: F) -> Gate
where
    F: Fn(PodInfo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |pod| Box::pin(f(pod)))
}

/// What a [`NodeSim`] simulates.
#[derive(Clone)]
pub struct SimConfig {
    /// Start of every node name (`{prefix}-{pool}-{n}`) and the [`SIM_LABEL`] value: unique
    /// per test, lower-case letters, digits and `-`.
    pub prefix: String,
    /// Namespaces whose pods this simulator schedules and runs; others are left alone.
    pub namespaces: Vec<String>,
    /// The node pools.
    pub pools: Vec<Pool>,
    /// Bound to Ready (image pull, weights, model load), unless the pool has its own.
    pub cold_start: Duration,
    /// Interruption notice for every cloud, instead of the cloud's own ([`Cloud::notice`]).
    pub notice: Option<Duration>,
    /// Awaited after the cold start; the pod turns Ready when it returns (e.g. once a worker
    /// process started for the pod answers its health check).
    pub on_start: Option<Gate>,
    /// Awaited when a pod is deleted, for at most its grace period; the pod goes when it
    /// returns (e.g. once the pod's worker process drained and exited).
    pub on_stop: Option<Gate>,
}

impl SimConfig {
    /// A simulator for `namespaces` with no pools yet, a 1 s cold start and the clouds'
    /// own notice periods.
    pub fn new(prefix: &str, namespaces: &[&str]) -> SimConfig {
        SimConfig {
            prefix: prefix.to_string(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            pools: vec![],
            cold_start: Duration::from_secs(1),
            notice: None,
            on_start: None,
            on_stop: None,
        }
    }
}

/// One registered node.
#[derive(Debug, Clone)]
struct SimNode {
    pool: usize,
    uid: String,
    index: u32,
    interrupted: bool,
}

/// The running simulator; see the module docs.
pub struct NodeSim {
    shared: Arc<kubelet::Shared>,
    closed: bool,
}

/// A Lease older than this belongs to a simulator that is gone.
const STALE_LEASE: Duration = Duration::from_secs(120);
/// How often the node Leases are renewed (the kubelet's default).
const HEARTBEAT: Duration = Duration::from_secs(10);

impl NodeSim {
    /// Registers the pools' nodes, waits until they are Ready and schedulable, and starts
    /// scheduling and running the pods of `config.namespaces`.
    pub async fn start(client: Client, config: SimConfig) -> anyhow::Result<NodeSim> {
        if config.pools.is_empty() {
            bail!("a simulator needs at least one pool");
        }
        let (events, _) = broadcast::channel(4096);
        let wake = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();

        // Caches of all pods (filtered by namespace when read) and of this simulator's nodes.
        let (pods, pods_writer) = reflector::store::<Pod>();
        let (nodes, nodes_writer) = reflector::store::<Node>();
        let selector = format!("{SIM_LABEL}={}", config.prefix);
        let pod_stream = reflector(
            pods_writer,
            watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
        );
        let node_stream = reflector(
            nodes_writer,
            watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().labels(&selector),
            ),
        );
        for stream in [
            pod_stream.map(|e| e.map(|_| ())).boxed(),
            node_stream.map(|e| e.map(|_| ())).boxed(),
        ] {
            let wake = wake.clone();
            tasks.spawn(async move {
                let mut stream = std::pin::pin!(stream.default_backoff());
                while let Some(event) = stream.next().await {
                    if let Err(e) = event {
                        eprintln!("node-sim: watch failed (retrying): {e}");
                    }
                    wake.notify_one();
                }
            });
        }

        remove_stale_nodes(&client, &config.prefix).await?;

        let shared = Arc::new(kubelet::Shared {
            client: client.clone(),
            config,
            events,
            pods,
            nodes,
            wake,
            state: Mutex::new(kubelet::State::default()),
            tasks: Mutex::new(tasks),
        });
        let sim = NodeSim {
            shared: shared.clone(),
            closed: false,
        };
        for (i, pool) in shared.config.pools.iter().enumerate() {
            for _ in 0..pool.nodes {
                sim.register(i, None).await?;
            }
        }
        tokio::time::timeout(Duration::from_secs(30), async {
            let _ = shared.pods.wait_until_ready().await;
            let _ = shared.nodes.wait_until_ready().await;
        })
        .await
        .context("the pod and node caches did not fill in 30 s")?;
        let names: Vec<String> = sim.nodes();
        sim.wait_schedulable(&names).await?;

        let s = shared.clone();
        shared.spawn(async move { kubelet::run(s).await });
        let s = shared.clone();
        shared.spawn(async move {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                let nodes: Vec<(String, String)> = {
                    let state = s.state.lock().unwrap_or_else(|e| e.into_inner());
                    state
                        .nodes
                        .iter()
                        .map(|(n, sn)| (n.clone(), sn.uid.clone()))
                        .collect()
                };
                for (name, uid) in nodes {
                    if let Err(e) = nodes::heartbeat(&s.client, &name, &uid).await {
                        eprintln!("node-sim: heartbeat of {name}: {e}");
                    }
                }
            }
        });
        Ok(sim)
    }

    /// Events from now on (subscribe before doing what causes them).
    pub fn events(&self) -> broadcast::Receiver<SimEvent> {
        self.shared.events.subscribe()
    }

    /// The simulator's registered nodes, by name.
    pub fn nodes(&self) -> Vec<String> {
        let state = self.shared.lock();
        state.nodes.keys().cloned().collect()
    }

    /// The registered nodes of pool `pool`.
    pub fn pool_nodes(&self, pool: &str) -> Vec<String> {
        let state = self.shared.lock();
        state
            .nodes
            .iter()
            .filter(|(_, n)| self.shared.config.pools[n.pool].name == pool)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Adds a node to pool `pool` and waits until it is schedulable; its name.
    pub async fn add_node(&self, pool: &str) -> anyhow::Result<String> {
        let i = self.pool_index(pool)?;
        let name = self.register(i, None).await?;
        self.wait_schedulable(std::slice::from_ref(&name)).await?;
        self.shared.wake.notify_one();
        Ok(name)
    }

    /// Brings back node `name` after [`NodeSim::interrupt`] or [`NodeSim::remove_node`] took
    /// it (same name and pool, fresh and untainted), and waits until it is schedulable.
    pub async fn restore(&self, name: &str) -> anyhow::Result<()> {
        let pool = name
            .strip_prefix(&format!("{}-", self.shared.config.prefix))
            .and_then(|rest| rest.rsplit_once('-'))
            .map(|(pool, _)| pool.to_string())
            .ok_or_else(|| anyhow!("{name} is not a node of this simulator"))?;
        let i = self.pool_index(&pool)?;
        if self.shared.lock().nodes.contains_key(name) {
            bail!("node {name} is still there");
        }
        let api: Api<Node> = Api::all(self.shared.client.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while api.get_opt(name).await?.is_some() {
            if tokio::time::Instant::now() > deadline {
                bail!("node {name} is still being deleted");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.register(i, Some(name.to_string())).await?;
        self.wait_schedulable(&[name.to_string()]).await?;
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Interrupts spot node `name` as its cloud does: the notice now; after the notice period
    /// its pods are deleted (they drain through [`SimConfig::on_stop`]) and then the node.
    /// Returns once the notice is on the node; [`SimEvent::NodeGone`] tells when it is gone.
    pub async fn interrupt(&self, name: &str) -> anyhow::Result<()> {
        let cloud = {
            let mut state = self.shared.lock();
            let node = state
                .nodes
                .get_mut(name)
                .ok_or_else(|| anyhow!("{name} is not a node of this simulator"))?;
            if node.interrupted {
                bail!("{name} is already interrupted");
            }
            node.interrupted = true;
            self.shared.config.pools[node.pool].cloud
        };
        nodes::announce_interruption(&self.shared.client, name, cloud).await?;
        self.shared
            .emit(SimEvent::NodeInterrupted(name.to_string()));
        let notice = self.shared.config.notice.unwrap_or(cloud.notice());
        let s = self.shared.clone();
        let name = name.to_string();
        self.shared.spawn(async move {
            tokio::time::sleep(notice).await;
            if let Err(e) = kubelet::reclaim(&s, &name).await {
                eprintln!("node-sim: reclaiming {name}: {e:#}");
            }
        });
        Ok(())
    }

    /// Removes node `name` at once (a scale-down of the pool): deletes its pods, waits for
    /// them to go, deletes the node.
    pub async fn remove_node(&self, name: &str) -> anyhow::Result<()> {
        if !self.shared.lock().nodes.contains_key(name) {
            bail!("{name} is not a node of this simulator");
        }
        kubelet::reclaim(&self.shared, name).await
    }

    /// Stops simulating: force-deletes the pods on the simulator's nodes and the nodes.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.closed = true;
        self.shared.abort_all();
        cleanup(&self.shared.client, &self.shared.config.prefix).await
    }

    fn pool_index(&self, pool: &str) -> anyhow::Result<usize> {
        self.shared
            .config
            .pools
            .iter()
            .position(|p| p.name == pool)
            .ok_or_else(|| anyhow!("no pool {pool}"))
    }

    /// Creates a node of pool `pool` (named `name`, or the pool's next name) and its Lease.
    async fn register(&self, pool: usize, name: Option<String>) -> anyhow::Result<String> {
        let (name, index) = {
            let mut state = self.shared.lock();
            let index = state.next_node;
            state.next_node += 1;
            let p = &self.shared.config.pools[pool];
            let name = name.unwrap_or_else(|| {
                let n = state.pool_counters.entry(pool).or_default();
                *n += 1;
                format!("{}-{}-{}", self.shared.config.prefix, p.name, n)
            });
            (name, index)
        };
        let p = &self.shared.config.pools[pool];
        let object = nodes::node_object(&self.shared.config.prefix, &name, p, index);
        let uid = nodes::create(&self.shared.client, &object)
            .await
            .with_context(|| format!("register node {name}"))?;
        nodes::heartbeat(&self.shared.client, &name, &uid)
            .await
            .with_context(|| format!("heartbeat of node {name}"))?;
        self.shared.lock().nodes.insert(
            name.clone(),
            SimNode {
                pool,
                uid,
                index,
                interrupted: false,
            },
        );
        self.shared.emit(SimEvent::NodeAdded(name.clone()));
        Ok(name)
    }

    /// Waits until `names` show up Ready in the node cache without the node lifecycle's
    /// `node.kubernetes.io/*` taints (a new node is tainted not-ready until it is seen Ready).
    async fn wait_schedulable(&self, names: &[String]) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let pending: Vec<&String> = names
                .iter()
                .filter(|n| {
                    let node = self
                        .shared
                        .nodes
                        .state()
                        .into_iter()
                        .find(|node| node.metadata.name.as_deref() == Some(n.as_str()));
                    !node.is_some_and(|node| {
                        fit::node_ready(&node)
                            && !node
                                .spec
                                .as_ref()
                                .and_then(|s| s.taints.as_ref())
                                .is_some_and(|t| {
                                    t.iter().any(|t| t.key.starts_with("node.kubernetes.io/"))
                                })
                    })
                })
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("nodes not schedulable after 30 s: {pending:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for NodeSim {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.shared.abort_all();
        // The test's runtime may be shutting down: clean up from a runtime of our own, with a
        // client of our own, on another thread.
        let prefix = self.shared.config.prefix.clone();
        let owned = prefix.clone();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)?;
            rt.block_on(async {
                let client = Client::try_default().await?;
                cleanup(&client, &owned).await
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("node-sim: cleanup of {prefix}: {e:#}"),
            Err(_) => eprintln!("node-sim: cleanup of {prefix} panicked"),
        }
    }
}

/// Force-deletes the pods on the nodes labelled `prefix` and the nodes.
async fn cleanup(client: &Client, prefix: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{SIM_LABEL}={prefix}"));
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for node in nodes.list(&lp).await?.items {
        let name = node.metadata.name.unwrap_or_default();
        let on_node = ListParams::default().fields(&format!("spec.nodeName={name}"));
        for pod in pods.list(&on_node).await?.items {
            let ns = pod.metadata.namespace.unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let _ = api
                .delete(&pod.metadata.name.unwrap_or_default(), &force)
                .await;
        }
        let _ = nodes.delete(&name, &DeleteParams::default()).await;
    }
    Ok(())
}

/// Deletes simulated nodes whose Lease is older than [`STALE_LEASE`] (their simulator died
/// without cleaning up), and any left over under `prefix`.
async fn remove_stale_nodes(client: &Client, prefix: &str) -> anyhow::Result<()> {
    cleanup(client, prefix).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = Timestamp::now();
    for node in nodes
        .list(&ListParams::default().labels(SIM_LABEL))
        .await?
        .items
    {
        let name = node.metadata.name.clone().unwrap_or_default();
        let renewed = leases
            .get_opt(&name)
            .await?
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0);
        let old = |t: Timestamp| now.duration_since(t).as_secs_f64() > STALE_LEASE.as_secs_f64();
        // A node just registered has no Lease for a moment: only old nodes can be stale.
        let created_long_ago = node
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| old(t.0));
        let stale = created_long_ago && renewed.is_none_or(old);
        if stale {
            if let Some(owner) = node.metadata.labels.as_ref().and_then(|l| l.get(SIM_LABEL)) {
                cleanup(client, owner).await?;
            }
        }
    }
    Ok(())
}

/// Creates namespace `name` (for a test's Model and pods).
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("create namespace {name}"))?;
    Ok(())
}
