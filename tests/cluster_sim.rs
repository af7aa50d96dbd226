//! The node simulator of `tests/cluster` against a real API server (`scripts/cluster.sh`;
//! skipped with a message when `KUBECONFIG` is unset), and its scheduling rules on their own.

mod cluster;
mod process;
mod skip;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::fit::{self, Misfit};
use cluster::{gate, Capacity, Cloud, NodeSim, Pool, SimConfig, SimEvent};
use process::eventually;
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::apps::v1::Deployment;
use tidal_controller::k8s_openapi::api::core::v1::{
    Namespace, Node, Pod, PodSpec, Taint, Toleration,
};
use tidal_controller::kube::api::{Api, DeleteParams, ListParams, PostParams};
use tidal_controller::kube::Client;
use tidal_controller::observe::node_interrupted;
use tokio::sync::broadcast;

// ---- the scheduling rules, without a cluster ----

#[test]
fn quantities_parse_as_the_api_does() {
    assert_eq!(fit::milli("500m"), Some(500));
    assert_eq!(fit::milli("2"), Some(2000));
    assert_eq!(fit::milli("1.5"), Some(1500));
    assert_eq!(fit::milli("1Ki"), Some(1_024_000));
    assert_eq!(fit::milli("16Gi"), Some(16 * (1 << 30) * 1000));
    assert_eq!(fit::milli("1G"), Some(1_000_000_000_000));
    assert_eq!(fit::milli("1e3"), Some(1_000_000));
    assert_eq!(fit::milli("1x"), None);
}

fn spec(v: Value) -> PodSpec {
    serde_json::from_value(v).unwrap()
}

fn node(v: Value) -> Node {
    let mut n: Value = json!({
        "metadata": {"name": "n", "labels": {}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    });
    merge(&mut n, v);
    serde_json::from_value(n).unwrap()
}

/// Merges `from` into `into`: objects key by key, arrays element by element.
fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, v) in b.into_iter().enumerate() {
                match a.get_mut(i) {
                    Some(slot) => merge(slot, v),
                    None => a.push(v),
                }
            }
        }
        (a, b) => *a = b,
    }
}

#[test]
fn requests_count_init_containers_limits_and_the_pod_slot() {
    let s = spec(json!({
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": "1", "memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
        ],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
    }));
    let r = fit::requests(&s);
    assert_eq!(
        r["cpu"], 2000,
        "the init container's 2 cpus exceed the containers' 750m"
    );
    assert_eq!(
        r["memory"],
        2 * (1 << 30) * 1000,
        "a limit stands for a missing request"
    );
    assert_eq!(r["nvidia.com/gpu"], 1000);
    assert_eq!(r["pods"], 1000);
}

#[test]
fn taints_tolerations_selectors_and_room_decide_the_fit() {
    let spot = node(json!({
        "metadata": {"labels": {"cloud.google.com/gke-spot": "true", "pool": "a"}},
        "spec": {"taints": [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"},
                            {"key": "soft", "effect": "PreferNoSchedule"}]},
    }));
    let plain = spec(json!({"containers": [{"name": "w"}]}));
    let req = fit::requests(&plain);
    let none = fit::Amounts::new();
    assert_eq!(
        fit::fits(&plain, &req, &spot, &none),
        Err(Misfit::Taint("cloud.google.com/gke-spot: true".into()))
    );
    let tolerating = spec(json!({
        "containers": [{"name": "w", "resources": {"requests": {"cpu": "3"}}}],
        "nodeSelector": {"cloud.google.com/gke-spot": "true"},
        "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }));
    let req = fit::requests(&tolerating);
    assert_eq!(fit::fits(&tolerating, &req, &spot, &none), Ok(()));
    let used = fit::Amounts::from([("cpu".to_string(), 1500)]);
    assert_eq!(
        fit::fits(&tolerating, &req, &spot, &used),
        Err(Misfit::Insufficient("cpu".into()))
    );
    // an Exists toleration without a key tolerates everything
    let everything = Toleration {
        operator: Some("Exists".into()),
        ..Toleration::default()
    };
    let taint = Taint {
        key: "x".into(),
        value: Some("y".into()),
        effect: "NoExecute".into(),
        time_added: None,
    };
    assert!(fit::tolerates(&everything, &taint));
    let wrong_value = Toleration {
        key: Some("x".into()),
        value: Some("z".into()),
        ..Toleration::default()
    };
    assert!(!fit::tolerates(&wrong_value, &taint));

    let affinity = |op: &str, values: &[&str]| {
        spec(json!({
            "containers": [{"name": "w"}],
            "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": op, "values": values}]}]}}},
        }))
    };
    assert!(fit::selects(&affinity("In", &["a", "b"]), &spot));
    assert!(!fit::selects(&affinity("NotIn", &["a"]), &spot));
    assert!(fit::selects(&affinity("Exists", &[]), &spot));
    assert!(!fit::selects(&affinity("DoesNotExist", &[]), &spot));
    let wrong_selector = spec(
        json!({"containers": [{"name": "w"}], "nodeSelector": {"pool": "b"},
                                     "tolerations": [{"operator": "Exists"}]}),
    );
    assert_eq!(
        fit::fits(
            &wrong_selector,
            &fit::requests(&wrong_selector),
            &spot,
            &none
        ),
        Err(Misfit::Selector)
    );
    let cordoned = node(json!({"spec": {"unschedulable": true}}));
    assert_eq!(
        fit::fits(&plain, &fit::requests(&plain), &cordoned, &none),
        Err(Misfit::Unschedulable)
    );
    let not_ready =
        node(json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}));
    assert_eq!(
        fit::fits(&plain, &fit::requests(&plain), &not_ready, &none),
        Err(Misfit::NotReady)
    );
    assert_eq!(
        fit::unschedulable_message(3, &[Misfit::Selector, Misfit::Insufficient("nvidia.com/gpu".into()), Misfit::Selector]),
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
    );
}

// ---- against the API server ----

/// A client of the cluster in `KUBECONFIG`, or `None` after recording the skip.
async fn client() -> Option<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        skip::skip("set KUBECONFIG (scripts/cluster.sh up) to run the node simulator against an API server");
        return None;
    }
    Some(Client::try_default().await.expect("kubernetes client"))
}

/// A Deployment `name` of `replicas` worker-like pods (one cpu each) with `scheduling` merged
/// into the pod spec.
fn deployment(name: &str, replicas: i32, scheduling: Value) -> Deployment {
    let mut pod = json!({
        "containers": [{
            "name": "worker", "image": "sim/tidal:0", "command": ["tidal"],
            "args": ["runtime", "--model-id", name],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        }],
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": false,
    });
    merge(&mut pod, scheduling);
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
        },
    }))
    .unwrap()
}

fn gke_spot() -> Value {
    json!({
        "nodeSelector": {"cloud.google.com/gke-spot": "true"},
        "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    })
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pods of Deployment `app` that are not being deleted.
async fn live_pods(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("app={app}"));
    pods.list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// The one Ready pod of `app` (waiting for it).
async fn ready_pod(pods: &Api<Pod>, app: &str) -> Pod {
    eventually(
        &format!("a Ready pod of {app}"),
        Duration::from_secs(60),
        || async {
            let live = live_pods(pods, app).await;
            match live.as_slice() {
                [p] if ready(p) => Some(p.clone()),
                _ => None,
            }
        },
    )
    .await
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The next event `want` picks, within `limit`.
async fn next<T>(
    events: &mut broadcast::Receiver<SimEvent>,
    limit: Duration,
    mut want: impl FnMut(&SimEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(limit, async {
        loop {
            match events.recv().await {
                Ok(e) => {
                    if let Some(v) = want(&e) {
                        return v;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(e) => panic!("simulator events ended: {e}"),
            }
        }
    })
    .await
    .expect("timed out waiting for a simulator event")
}

async fn namespace(client: &Client, tag: &str) -> String {
    let ns = format!("sim-{}-{tag}", std::process::id());
    cluster::create_namespace(client, &ns).await.unwrap();
    ns
}

async fn drop_namespace(client: &Client, ns: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_land_where_they_fit_wait_where_nothing_fits_and_move_when_interrupted() {
    let Some(client) = client().await else { return };
    let ns = namespace(&client, "move").await;
    let started = Arc::new(Mutex::new(Vec::<String>::new()));
    let stopped = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut config = SimConfig::new(&format!("sim{}-move", std::process::id()), &[ns.as_str()]);
    config.pools = vec![
        Pool::new("spot", Cloud::Gke, Capacity::Spot, 2).size("2", "8Gi"),
        Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1).size("2", "8Gi"),
    ];
    config.cold_start = Duration::from_millis(500);
    let notice = Duration::from_secs(2);
    config.notice = Some(notice);
    let s = started.clone();
    config.on_start = Some(gate(move |pod| {
        s.lock().unwrap().push(pod.name);
        async {}
    }));
    let s = stopped.clone();
    config.on_stop = Some(gate(move |pod| {
        s.lock().unwrap().push(pod.name);
        async {}
    }));
    let sim = NodeSim::start(client.clone(), config).await.unwrap();
    let mut events = sim.events();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // a spot worker lands on a spot node and turns Ready after its cold start
    deployments
        .create(
            &PostParams::default(),
            &deployment("spot-worker", 1, gke_spot()),
        )
        .await
        .unwrap();
    let first = ready_pod(&pods, "spot-worker").await;
    let first_node = node_of(&first);
    assert!(sim.pool_nodes("spot").contains(&first_node), "{first_node}");
    let first_name = first.metadata.name.clone().unwrap();
    let info = next(&mut events, Duration::from_secs(10), |e| match e {
        SimEvent::Ready(p) if p.name == first_name => Some(p.clone()),
        _ => None,
    })
    .await;
    assert_eq!(
        (info.pool.as_str(), info.capacity),
        ("spot", Capacity::Spot)
    );
    assert_eq!(info.command, ["tidal"]);
    assert_eq!(info.args, ["runtime", "--model-id", "spot-worker"]);
    assert!(started.lock().unwrap().contains(&first_name));
    let status = first.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(status.pod_ip.is_some() && status.host_ip.is_some());

    // a pod that needs a GPU fits nowhere: Pending, with the scheduler's reason
    deployments
        .create(
            &PostParams::default(),
            &deployment(
                "gpu-worker",
                1,
                json!({"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            ),
        )
        .await
        .unwrap();
    let pending = eventually(
        "the GPU pod marked unschedulable",
        Duration::from_secs(30),
        || async {
            let live = live_pods(&pods, "gpu-worker").await;
            let pod = live.first()?.clone();
            let condition = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
                .clone();
            Some((pod, condition))
        },
    )
    .await;
    let (pod, condition) = pending;
    assert_eq!(condition.reason.as_deref(), Some("Unschedulable"));
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with("0/3 nodes are available: "),
        "{message}"
    );
    assert!(message.contains("Insufficient nvidia.com/gpu"), "{message}");
    assert_eq!(node_of(&pod), "");
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));

    // GKE reclaims the spot node: the notice at once, the pod deleted after it, the node gone;
    // the ReplicaSet's replacement lands on the other spot node
    let t0 = Instant::now();
    sim.interrupt(&first_node).await.unwrap();
    let tainted = Api::<Node>::all(client.clone())
        .get(&first_node)
        .await
        .unwrap();
    assert!(
        tainted
            .spec
            .as_ref()
            .unwrap()
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == "cloud.google.com/impending-node-termination"
                && t.effect == "NoSchedule"),
        "{:?}",
        tainted.spec
    );
    assert!(node_interrupted(&tainted), "the controller sees the notice");
    assert!(
        pods.get(&first_name)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "the pod stays for the notice period"
    );
    next(&mut events, Duration::from_secs(30), |e| match e {
        SimEvent::Deleted(p) if p.name == first_name => Some(()),
        _ => None,
    })
    .await;
    assert!(t0.elapsed() >= notice, "deleted after {:?}", t0.elapsed());
    assert!(stopped.lock().unwrap().contains(&first_name));
    next(&mut events, Duration::from_secs(30), |e| match e {
        SimEvent::NodeGone(n) if *n == first_node => Some(()),
        _ => None,
    })
    .await;
    let second = ready_pod(&pods, "spot-worker").await;
    let second_node = node_of(&second);
    assert_ne!(second.metadata.name.as_deref(), Some(first_name.as_str()));
    assert_ne!(second_node, first_node);
    assert!(
        sim.pool_nodes("spot").contains(&second_node),
        "{second_node}"
    );
    assert_eq!(
        Api::<Node>::all(client.clone())
            .get_opt(&first_node)
            .await
            .unwrap()
            .map(|n| n.metadata.name),
        None
    );

    // the node comes back fresh
    sim.restore(&first_node).await.unwrap();
    let back = Api::<Node>::all(client.clone())
        .get(&first_node)
        .await
        .unwrap();
    assert!(!node_interrupted(&back));

    drop_namespace(&client, &ns).await;
    sim.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cloud_labels_taints_and_interrupts_its_spot_nodes() {
    let Some(client) = client().await else { return };
    let ns = namespace(&client, "clouds").await;
    let mut config = SimConfig::new(&format!("sim{}-clouds", std::process::id()), &[ns.as_str()]);
    config.pools = vec![
        Pool::new("gke-spot", Cloud::Gke, Capacity::Spot, 1),
        Pool::new("eks-spot", Cloud::Eks, Capacity::Spot, 1),
        Pool::new("aks-spot", Cloud::Aks, Capacity::Spot, 1),
        Pool::new("ondemand", Cloud::Aks, Capacity::OnDemand, 1).gpus(2, "NVIDIA-L4"),
    ];
    // long enough that nothing is reclaimed while the test looks
    config.notice = Some(Duration::from_secs(600));
    let sim = NodeSim::start(client.clone(), config).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // the selectors and tolerations of docs/kubernetes.md, one per cloud
    let cases: [(&str, Value, &str); 4] = [
        ("gke", gke_spot(), "gke-spot"),
        (
            "eks",
            json!({"nodeSelector": {"karpenter.sh/capacity-type": "spot"},
                   "tolerations": [{"key": "tidal.dev/spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}),
            "eks-spot",
        ),
        (
            "aks",
            json!({"nodeSelector": {"kubernetes.azure.com/scalesetpriority": "spot"},
                   "tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}]}),
            "aks-spot",
        ),
        // no toleration: every spot pool is tainted, so only the on-demand GPU node is left
        (
            "plain",
            json!({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                   "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            "ondemand",
        ),
    ];
    for (name, scheduling, _) in &cases {
        deployments
            .create(
                &PostParams::default(),
                &deployment(name, 1, scheduling.clone()),
            )
            .await
            .unwrap();
    }
    let mut node_by_pool = BTreeMap::new();
    for (name, _, pool) in &cases {
        let pod = ready_pod(&pods, name).await;
        let node = node_of(&pod);
        assert_eq!(sim.pool_nodes(pool), std::slice::from_ref(&node), "{name}");
        node_by_pool.insert(*pool, node);
    }

    let nodes: Api<Node> = Api::all(client.clone());
    for pool in ["gke-spot", "eks-spot", "aks-spot"] {
        sim.interrupt(&node_by_pool[pool]).await.unwrap();
    }
    let gke = nodes.get(&node_by_pool["gke-spot"]).await.unwrap();
    let eks = nodes.get(&node_by_pool["eks-spot"]).await.unwrap();
    let aks = nodes.get(&node_by_pool["aks-spot"]).await.unwrap();
    let taints = |n: &Node| -> Vec<String> {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    };
    assert!(taints(&gke).contains(&"cloud.google.com/impending-node-termination:NoSchedule".into()));
    assert!(taints(&eks).contains(&"karpenter.sh/disrupted:NoSchedule".into()));
    assert!(node_interrupted(&gke) && node_interrupted(&eks));
    let vm_event = aks
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "VMEventScheduled").cloned())
        .expect("AKS's scheduled-event condition");
    assert_eq!(
        (vm_event.status.as_str(), vm_event.reason.as_deref()),
        ("True", Some("Preempt"))
    );
    let labels = |n: &Node| n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels(&gke)["cloud.google.com/gke-spot"], "true");
    assert_eq!(labels(&eks)["karpenter.sh/capacity-type"], "spot");
    assert_eq!(
        labels(&aks)["kubernetes.azure.com/scalesetpriority"],
        "spot"
    );
    let gpu_node = nodes.get(&node_by_pool["ondemand"]).await.unwrap();
    let allocatable = gpu_node.status.unwrap().allocatable.unwrap();
    assert_eq!(allocatable["nvidia.com/gpu"].0, "2");

    drop_namespace(&client, &ns).await;
    sim.shutdown().await.unwrap();
    for node in node_by_pool.values() {
        eventually(
            "the simulated nodes deleted",
            Duration::from_secs(30),
            || async { nodes.get_opt(node).await.unwrap().is_none().then_some(()) },
        )
        .await;
    }
}
