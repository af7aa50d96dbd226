//! The simulated nodes as the clouds label and taint them, their heartbeat (the Lease a
//! kubelet renews, without which the node lifecycle controller marks a node unreachable
//! after 50 s) and the interruption notice each cloud gives.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::coordination::v1::Lease;
use tidal_controller::k8s_openapi::api::core::v1::{Node, Taint};
use tidal_controller::k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use tidal_controller::k8s_openapi::jiff::Timestamp;
use tidal_controller::kube::api::{Api, Patch, PatchParams, PostParams};
use tidal_controller::kube::Client;

/// Label on every simulated node: the simulator's name prefix (used to clean up).
pub const SIM_LABEL: &str = "tidal.dev/node-sim";
/// Field manager of the simulator's writes.
pub const FIELD_MANAGER: &str = "tidal-node-sim";
/// Namespace of the node heartbeat Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet's default lease duration.
const LEASE_SECONDS: i32 = 40;

/// The cloud whose labels, taints and interruption notice a pool copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cloud {
    /// GKE: spot nodes labelled `cloud.google.com/gke-spot=true` and (as the docs create the
    /// pool) tainted `cloud.google.com/gke-spot=true:NoSchedule`; every node labelled
    /// `cloud.google.com/gke-nodepool=<pool>`. Interruption: the taint
    /// `cloud.google.com/impending-node-termination:NoSchedule`, 30 s notice.
    Gke,
    /// EKS with Karpenter: `karpenter.sh/capacity-type=spot|on-demand`,
    /// `karpenter.sh/nodepool=<pool>`; spot nodes tainted `tidal.dev/spot=true:NoSchedule`
    /// (the docs' NodePool). Interruption: Karpenter's `karpenter.sh/disrupted:NoSchedule`
    /// taint on the spot interruption warning, 120 s notice.
    Eks,
    /// AKS: `kubernetes.azure.com/agentpool=<pool>`; spot nodes labelled and tainted
    /// `kubernetes.azure.com/scalesetpriority=spot(:NoSchedule)`. Interruption: the node
    /// condition `VMEventScheduled=True` (reason `Preempt`) that AKS's node problem detector
    /// sets from the Scheduled Events notice, 30 s.
    Aks,
}

impl Cloud {
    /// The notice this cloud gives before a spot node goes away.
    pub fn notice(self) -> Duration {
        match self {
            Cloud::Gke | Cloud::Aks => Duration::from_secs(30),
            Cloud::Eks => Duration::from_secs(120),
        }
    }
}

/// Spot or on-demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// Interruptible capacity.
    Spot,
    /// Regular capacity.
    OnDemand,
}

/// What one node of a pool offers to pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocatable {
    /// Quantity string, e.g. `"8"`.
    pub cpu: String,
    /// Quantity string, e.g. `"32Gi"`.
    pub memory: String,
    /// `nvidia.com/gpu`; 0 leaves the resource (and the GPU labels) off the node.
    pub gpus: u32,
    /// Value of `nvidia.com/gpu.product` on GPU nodes.
    pub gpu_product: String,
    /// Most pods on one node.
    pub pods: u32,
}

impl Default for Allocatable {
    fn default() -> Self {
        Allocatable {
            cpu: "8".into(),
            memory: "32Gi".into(),
            gpus: 0,
            gpu_product: "NVIDIA-L4".into(),
            pods: 110,
        }
    }
}

/// A node pool: `nodes` identical nodes of one cloud and capacity type.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Pool name (a label value and part of the node names).
    pub name: String,
    /// Whose labels and signals.
    pub cloud: Cloud,
    /// Spot or on-demand.
    pub capacity: Capacity,
    /// Nodes registered at start.
    pub nodes: usize,
    /// What each node offers.
    pub allocatable: Allocatable,
    /// Labels beyond the cloud's (override them too).
    pub labels: BTreeMap<String, String>,
    /// The pool's taints; [`Pool::new`] fills in the cloud's spot taint.
    pub taints: Vec<Taint>,
    /// Bound to Ready for this pool's pods, when not the simulator's default.
    pub cold_start: Option<Duration>,
}

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: (!value.is_empty()).then(|| value.into()),
        effect: effect.into(),
        time_added: None,
    }
}

impl Pool {
    /// A pool of `nodes` default-sized nodes with the cloud's labels and (for spot) taints.
    pub fn new(name: &str, cloud: Cloud, capacity: Capacity, nodes: usize) -> Pool {
        let taints = match (cloud, capacity) {
            (_, Capacity::OnDemand) => vec![],
            (Cloud::Gke, Capacity::Spot) => {
                vec![taint("cloud.google.com/gke-spot", "true", "NoSchedule")]
            }
            (Cloud::Eks, Capacity::Spot) => vec![taint("tidal.dev/spot", "true", "NoSchedule")],
            (Cloud::Aks, Capacity::Spot) => vec![taint(
                "kubernetes.azure.com/scalesetpriority",
                "spot",
                "NoSchedule",
            )],
        };
        Pool {
            name: name.into(),
            cloud,
            capacity,
            nodes,
            allocatable: Allocatable::default(),
            labels: BTreeMap::new(),
            taints,
            cold_start: None,
        }
    }

    /// With `gpus` GPUs of `product` per node.
    pub fn gpus(mut self, gpus: u32, product: &str) -> Pool {
        self.allocatable.gpus = gpus;
        self.allocatable.gpu_product = product.into();
        self
    }

    /// With `cpu` and `memory` per node (quantity strings).
    pub fn size(mut self, cpu: &str, memory: &str) -> Pool {
        self.allocatable.cpu = cpu.into();
        self.allocatable.memory = memory.into();
        self
    }

    /// With this pool's own cold start.
    pub fn cold_start(mut self, d: Duration) -> Pool {
        self.cold_start = Some(d);
        self
    }

    /// The labels the cloud gives this pool's nodes (plus [`Pool::labels`]).
    pub fn cloud_labels(&self) -> BTreeMap<String, String> {
        let spot = self.capacity == Capacity::Spot;
        let mut l = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            l.insert(k.to_string(), v.to_string());
        };
        match self.cloud {
            Cloud::Gke => {
                put("cloud.google.com/gke-nodepool", &self.name);
                if spot {
                    put("cloud.google.com/gke-spot", "true");
                    put("cloud.google.com/gke-provisioning", "spot");
                }
            }
            Cloud::Eks => {
                put("karpenter.sh/nodepool", &self.name);
                put(
                    "karpenter.sh/capacity-type",
                    if spot { "spot" } else { "on-demand" },
                );
            }
            Cloud::Aks => {
                put("kubernetes.azure.com/agentpool", &self.name);
                if spot {
                    put("kubernetes.azure.com/scalesetpriority", "spot");
                }
            }
        }
        if self.allocatable.gpus > 0 {
            put("nvidia.com/gpu.present", "true");
            put("nvidia.com/gpu.product", &self.allocatable.gpu_product);
            put("nvidia.com/gpu.count", &self.allocatable.gpus.to_string());
        }
        l.extend(self.labels.clone());
        l
    }
}

fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

/// The Node object of `name` in `pool` (`index` numbers its address), with status: Ready, the
/// pool's allocatable, and a kubelet-like node info.
pub fn node_object(prefix: &str, name: &str, pool: &Pool, index: u32) -> Value {
    let mut labels = pool.cloud_labels();
    for (k, v) in [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("node.kubernetes.io/instance-type", "sim-standard"),
        ("topology.kubernetes.io/zone", "sim-zone-a"),
        (SIM_LABEL, prefix),
    ] {
        labels.insert(k.into(), v.into());
    }
    let a = &pool.allocatable;
    let mut resources = json!({
        "cpu": a.cpu,
        "memory": a.memory,
        "pods": a.pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    if a.gpus > 0 {
        resources["nvidia.com/gpu"] = json!(a.gpus.to_string());
    }
    let t = now();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": t, "lastTransitionTime": t})
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": pool.taints},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status (simulated)"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": format!("10.0.{}.{}", index / 250, index % 250 + 1)},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "",
                "kernelVersion": "6.1.0", "osImage": "simulated", "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    })
}

/// Registers `node` (an object from [`node_object`]); its uid.
pub async fn create(
    client: &Client,
    node: &Value,
) -> Result<String, tidal_controller::kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node =
        serde_json::from_value(node.clone()).map_err(tidal_controller::kube::Error::SerdeError)?;
    let created = api.create(&PostParams::default(), &node).await?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// Renews the heartbeat Lease of node `name` (uid `uid`, which owns the Lease so that it goes
/// with the node).
pub async fn heartbeat(
    client: &Client,
    name: &str,
    uid: &str,
) -> Result<(), tidal_controller::kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": serde_json::to_value(MicroTime(Timestamp::now())).unwrap_or(Value::Null),
        },
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(lease),
    )
    .await?;
    Ok(())
}

/// Writes the interruption notice of `cloud` on node `name`.
pub async fn announce_interruption(
    client: &Client,
    name: &str,
    cloud: Cloud,
) -> Result<(), tidal_controller::kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    match cloud {
        Cloud::Gke => {
            add_taint(
                &api,
                name,
                taint(
                    "cloud.google.com/impending-node-termination",
                    "",
                    "NoSchedule",
                ),
            )
            .await
        }
        Cloud::Eks => {
            add_taint(
                &api,
                name,
                taint("karpenter.sh/disrupted", "", "NoSchedule"),
            )
            .await
        }
        Cloud::Aks => {
            let t = now();
            let patch = json!({"status": {"conditions": [{
                "type": "VMEventScheduled", "status": "True", "reason": "Preempt",
                "message": "VM is scheduled for Preempt (simulated)",
                "lastHeartbeatTime": t, "lastTransitionTime": t,
            }]}});
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await?;
            Ok(())
        }
    }
}

/// Adds `taint` to node `name`'s taints (a read-modify-write, retried when the node lifecycle
/// controller changed the node in between).
async fn add_taint(
    api: &Api<Node>,
    name: &str,
    taint: Taint,
) -> Result<(), tidal_controller::kube::Error> {
    loop {
        let mut node = api.get(name).await?;
        let spec = node.spec.get_or_insert_with(Default::default);
        let taints = spec.taints.get_or_insert_with(Vec::new);
        if taints
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect)
        {
            return Ok(());
        }
        taints.push(taint.clone());
        match api.replace(name, &PostParams::default(), &node).await {
            Ok(_) => return Ok(()),
            Err(tidal_controller::kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
}
