//! The simulator's scheduler and kubelet: binds pending pods, walks bound pods through their
//! cold start to Ready, finishes the deletion of pods on its nodes, and reclaims nodes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::core::v1::{Node, Pod};
use tidal_controller::kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions,
};
use tidal_controller::kube::runtime::reflector::Store;
use tidal_controller::kube::Client;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinSet;

use super::fit::{self, Amounts};
use super::status::{creating_status, now, ready_status};
use super::{PodInfo, SimConfig, SimEvent, SimNode};

/// How often the scheduler looks again without a watch event (cold starts and notices are
/// timers of their own; this only bounds how stale a retry can get).
const RESYNC: Duration = Duration::from_millis(500);

/// What the simulator's tasks share.
pub(super) struct Shared {
    pub client: Client,
    pub config: SimConfig,
    pub events: broadcast::Sender<SimEvent>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub wake: Arc<Notify>,
    pub state: Mutex<State>,
    pub tasks: Mutex<JoinSet<()>>,
}

/// The simulator's own bookkeeping (never held across an await).
#[derive(Default)]
pub(super) struct State {
    /// Registered nodes by name.
    pub nodes: BTreeMap<String, SimNode>,
    /// Nodes made so far per pool (numbers the names).
    pub pool_counters: HashMap<usize, u32>,
    /// Nodes made so far (numbers their addresses).
    pub next_node: u32,
    /// Pod IPs handed out so far.
    next_ip: u32,
    /// Pods bound but not yet seen bound in the cache, by uid: node and requests (the
    /// scheduler's assume cache, so that two pods are not both fitted into the same room).
    assumed: HashMap<String, (String, Amounts)>,
    /// Pods whose start task runs or ran.
    started: HashSet<String>,
    /// Pods whose termination task runs or ran.
    terminating: HashSet<String>,
    /// The Unschedulable message last written per pod.
    reported: HashMap<String, String>,
    /// Pod IPs by uid.
    ips: HashMap<String, String>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn emit(&self, event: SimEvent) {
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    /// Runs `f` until the simulator stops.
    pub fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        while tasks.try_join_next().is_some() {}
        tasks.spawn(f);
    }

    pub fn abort_all(&self) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .abort_all();
    }

    fn ours(&self, pod: &Pod) -> bool {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        self.config.namespaces.iter().any(|n| n == ns)
    }
}

/// The scheduling loop: once per watch event, and every [`RESYNC`].
pub(super) async fn run(s: Arc<Shared>) {
    loop {
        if let Err(e) = reconcile(&s).await {
            eprintln!("node-sim {}: {e:#}", s.config.prefix);
        }
        tokio::select! {
            _ = s.wake.notified() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn add(into: &mut Amounts, from: &Amounts) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

async fn reconcile(s: &Arc<Shared>) -> anyhow::Result<()> {
    let ours: BTreeMap<String, SimNode> = s.lock().nodes.clone();
    let mut nodes: Vec<Arc<Node>> = s
        .nodes
        .state()
        .into_iter()
        .filter(|n| ours.contains_key(n.metadata.name.as_deref().unwrap_or("")))
        .collect();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let pods: Vec<Arc<Pod>> = s.pods.state().into_iter().filter(|p| s.ours(p)).collect();

    // What the pods on each node request, and the pods to start or finish.
    let mut used: HashMap<String, Amounts> = HashMap::new();
    let mut seen_bound = HashSet::new();
    for pod in &pods {
        let Some(node) = node_name(pod).filter(|n| ours.contains_key(*n)) else {
            continue;
        };
        seen_bound.insert(uid(pod));
        if finished(pod) {
            continue;
        }
        if let Some(spec) = &pod.spec {
            add(
                used.entry(node.to_string()).or_default(),
                &fit::requests(spec),
            );
        }
        if pod.metadata.deletion_timestamp.is_some() {
            if s.lock().terminating.insert(uid(pod)) {
                let (s2, pod) = (s.clone(), pod.clone());
                s.spawn(async move { terminate(&s2, &pod).await });
            }
        } else if s.lock().started.insert(uid(pod)) {
            let (s2, pod, node) = (s.clone(), pod.clone(), node.to_string());
            s.spawn(async move { start(&s2, &pod, &node).await });
        }
    }
    {
        let present: HashSet<String> = pods.iter().map(|p| uid(p)).collect();
        let mut state = s.lock();
        state
            .assumed
            .retain(|uid, _| present.contains(uid) && !seen_bound.contains(uid));
        for (node, requests) in state.assumed.values() {
            add(used.entry(node.clone()).or_default(), requests);
        }
    }

    // Pending pods, oldest first, each onto the fitting node with the most cpu left.
    let mut pending: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| {
            node_name(p).is_none()
                && p.metadata.deletion_timestamp.is_none()
                && !finished(p)
                && p.spec.as_ref().is_some_and(|spec| {
                    spec.scheduler_name
                        .as_deref()
                        .is_none_or(|n| n == "default-scheduler")
                })
        })
        .filter(|p| !s.lock().assumed.contains_key(&uid(p)))
        .collect();
    pending.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    let empty = Amounts::new();
    for pod in pending {
        let Some(spec) = &pod.spec else { continue };
        let requests = fit::requests(spec);
        let mut misfits = vec![];
        let mut best: Option<(&str, f64)> = None;
        for node in &nodes {
            let name = node.metadata.name.as_deref().unwrap_or("");
            let node_used = used.get(name).unwrap_or(&empty);
            match fit::fits(spec, &requests, node, node_used) {
                Ok(()) => {
                    let cpu = fit::allocatable(node)
                        .get("cpu")
                        .copied()
                        .unwrap_or(0)
                        .max(1);
                    let taken = node_used.get("cpu").copied().unwrap_or(0)
                        + requests.get("cpu").copied().unwrap_or(0);
                    let free = 1.0 - taken as f64 / cpu as f64;
                    if best.is_none_or(|(_, f)| free > f) {
                        best = Some((name, free));
                    }
                }
                Err(m) => misfits.push(m),
            }
        }
        match best {
            Some((node, _)) => {
                if bind(s, pod, node).await? {
                    add(used.entry(node.to_string()).or_default(), &requests);
                    let mut state = s.lock();
                    state.assumed.insert(uid(pod), (node.to_string(), requests));
                    state.reported.remove(&uid(pod));
                }
            }
            None => {
                let message = fit::unschedulable_message(nodes.len(), &misfits);
                report_unschedulable(s, pod, message).await?;
            }
        }
    }
    Ok(())
}

fn pod_api(s: &Shared, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        s.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

fn gone_or_moved(e: &tidal_controller::kube::Error) -> bool {
    matches!(e, tidal_controller::kube::Error::Api(s) if s.is_not_found() || s.is_conflict())
}

/// Binds `pod` to `node` through `pods/binding`; false when the pod went or changed meanwhile.
async fn bind(s: &Shared, pod: &Pod, node: &str) -> anyhow::Result<bool> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "uid": uid(pod)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    match pod_api(s, pod)
        .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if gone_or_moved(&e) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("bind {name} to {node}")),
    }
}

async fn report_unschedulable(s: &Shared, pod: &Pod, message: String) -> anyhow::Result<()> {
    let id = uid(pod);
    if s.lock().reported.get(&id) == Some(&message) {
        return Ok(());
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastTransitionTime": now(), "lastProbeTime": null,
    }]}});
    match pod_api(s, pod)
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => {}
        Err(e) if gone_or_moved(&e) => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("mark {name} unschedulable")),
    }
    s.lock().reported.insert(id, message.clone());
    s.emit(SimEvent::Unschedulable {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name,
        message,
    });
    Ok(())
}

/// The hook's view of `pod` on `node` (allocating its IP on first sight).
fn pod_info(s: &Shared, pod: &Pod, node: &str) -> PodInfo {
    let mut state = s.lock();
    let sim_node = state.nodes.get(node).cloned();
    let id = uid(pod);
    let ip = match state.ips.get(&id) {
        Some(ip) => ip.clone(),
        None => {
            let n = state.next_ip;
            state.next_ip += 1;
            let index = sim_node.as_ref().map(|n| n.index).unwrap_or(0);
            let ip = format!("10.{}.{}.{}", 64 + index / 250, index % 250, n % 250 + 2);
            state.ips.insert(id.clone(), ip.clone());
            ip
        }
    };
    let pool = sim_node.map(|n| &s.config.pools[n.pool]);
    let first = pod.spec.as_ref().and_then(|s| s.containers.first());
    PodInfo {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: id,
        node: node.to_string(),
        pool: pool.map(|p| p.name.clone()).unwrap_or_default(),
        capacity: pool
            .map(|p| p.capacity)
            .unwrap_or(super::Capacity::OnDemand),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ip,
        command: first.and_then(|c| c.command.clone()).unwrap_or_default(),
        args: first.and_then(|c| c.args.clone()).unwrap_or_default(),
    }
}

fn host_ip(s: &Shared, node: &str) -> String {
    let index = s.lock().nodes.get(node).map(|n| n.index).unwrap_or(0);
    format!("10.0.{}.{}", index / 250, index % 250 + 1)
}

/// Runs a bound pod: containers being created for the cold start, the start gate, Ready.
async fn start(s: &Arc<Shared>, pod: &Pod, node: &str) {
    if let Err(e) = try_start(s, pod, node).await {
        eprintln!("node-sim {}: start {}: {e:#}", s.config.prefix, uid(pod));
    }
}

async fn try_start(s: &Arc<Shared>, pod: &Pod, node: &str) -> anyhow::Result<()> {
    let api = pod_api(s, pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let info = pod_info(s, pod, node);
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    // A pod the simulator already ran (a restarted simulator) stays as it is.
    if ready(pod) {
        return Ok(());
    }
    s.emit(SimEvent::Bound(info.clone()));
    // The binding's own PodScheduled condition, read back to keep it.
    let Some(bound) = current(&api, &name, &info.uid).await? else {
        return Ok(());
    };
    let host = host_ip(s, node);
    let pp = PatchParams::default();
    match api
        .patch_status(
            &name,
            &pp,
            &Patch::Merge(creating_status(&bound, &info, &host)),
        )
        .await
    {
        Err(e) if gone_or_moved(&e) => return Ok(()),
        other => {
            other.with_context(|| format!("status of {name}"))?;
        }
    }
    let pool = s.lock().nodes.get(node).map(|n| n.pool);
    let cold_start = pool
        .and_then(|p| s.config.pools[p].cold_start)
        .unwrap_or(s.config.cold_start);
    tokio::time::sleep(cold_start).await;
    if let Some(gate) = &s.config.on_start {
        gate(info.clone()).await;
    }
    let Some(started) = current(&api, &name, &info.uid).await? else {
        return Ok(());
    };
    match api
        .patch_status(&name, &pp, &Patch::Merge(ready_status(&started, &info)))
        .await
    {
        Err(e) if gone_or_moved(&e) => return Ok(()),
        other => {
            other.with_context(|| format!("status of {name}"))?;
        }
    }
    s.emit(SimEvent::Ready(info));
    Ok(())
}

/// The pod `name` with uid `uid`, unless it is gone, replaced or being deleted.
async fn current(api: &Api<Pod>, name: &str, uid: &str) -> anyhow::Result<Option<Pod>> {
    let pod = api.get_opt(name).await?;
    Ok(pod.filter(|p| {
        p.metadata.uid.as_deref() == Some(uid) && p.metadata.deletion_timestamp.is_none()
    }))
}

/// Finishes the deletion of a pod on a simulated node: the stop gate (within the pod's grace
/// period), then a force delete, as the kubelet does once the containers exited.
async fn terminate(s: &Arc<Shared>, pod: &Pod) {
    let node = node_name(pod).unwrap_or_default().to_string();
    let info = pod_info(s, pod, &node);
    s.emit(SimEvent::Terminating(info.clone()));
    if let Some(gate) = &s.config.on_stop {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64;
        if tokio::time::timeout(Duration::from_secs(grace), gate(info.clone()))
            .await
            .is_err()
        {
            eprintln!(
                "node-sim {}: {} did not stop within its {grace} s grace period",
                s.config.prefix, info.name
            );
        }
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(info.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pod_api(s, pod).delete(&info.name, &force).await {
        Ok(_) => {}
        Err(e) if gone_or_moved(&e) => {}
        Err(e) => {
            eprintln!("node-sim {}: delete {}: {e}", s.config.prefix, info.name);
            return;
        }
    }
    s.emit(SimEvent::Deleted(info));
}

/// Takes node `name` away: deletes its pods (they drain through the stop gate), waits for
/// them to go (force-deleting stragglers), then deletes the node.
pub(super) async fn reclaim(s: &Arc<Shared>, name: &str) -> anyhow::Result<()> {
    let on_node = |s: &Shared| -> Vec<Arc<Pod>> {
        s.pods
            .state()
            .into_iter()
            .filter(|p| node_name(p) == Some(name) && !finished(p))
            .collect()
    };
    let mut longest_grace = 0;
    for pod in on_node(s) {
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        longest_grace = longest_grace.max(grace);
        match pod_api(s, &pod)
            .delete(
                pod.metadata.name.as_deref().unwrap_or(""),
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if gone_or_moved(&e) => {}
            Err(e) => return Err(e).context("delete a pod of the reclaimed node"),
        }
    }
    let deadline =
        tokio::time::Instant::now() + Duration::from_secs(longest_grace.max(0) as u64 + 30);
    while !on_node(s).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for pod in on_node(s) {
        let _ = pod_api(s, &pod)
            .delete(pod.metadata.name.as_deref().unwrap_or(""), &force)
            .await;
    }
    let nodes: Api<Node> = Api::all(s.client.clone());
    match nodes.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if gone_or_moved(&e) => {}
        Err(e) => return Err(e).with_context(|| format!("delete node {name}")),
    }
    s.lock().nodes.remove(name);
    s.emit(SimEvent::NodeGone(name.to_string()));
    s.wake.notify_one();
    Ok(())
}
