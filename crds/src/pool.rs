//! The `ModelPool` custom resource: one warm pool of runtime workers that each hold one or
//! more `Model`s (those whose `spec.pool` names it) and load or unload them on command, with
//! a node-local cache of the models' weights shared by the pool's pods on a node.
//!
//! The worker count's sizing maps 1:1 onto the placement policy's
//! [`tidal_autoscaler::pool::PoolSpec`] ([`ModelPoolSpec::pool_spec`]); the capacity section
//! and the worker resources are the `Model`'s own types.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::pool_status::ModelPoolStatus;
use crate::spec::{Capacity, Resources, ScaleDownHold, ScheduledFloor, StableAggregate};

/// A pool of runtime workers shared by many models, scaled with their summed demand.
// clippy reads the repeated `printcolumn(type_ = ...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tidal.dev",
    version = "v1alpha1",
    kind = "ModelPool",
    namespaced,
    status = "ModelPoolStatus",
    shortname = "tpool",
    category = "tidal",
    doc = "A warm pool of Tidal runtime workers that each hold one or more Models, on spot and on-demand capacity, with a node-local model cache.",
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyWorkers",
        description = "ready workers, spot and on-demand"
    ),
    printcolumn(
        name = "Models",
        type_ = "integer",
        json_path = ".status.modelCount",
        description = "Models whose spec.pool names this pool"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "time since the ModelPool was created"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.capacity.baseOnDemandReplicas <= self.scaling.maxWorkers").message("capacity.baseOnDemandReplicas must not exceed scaling.maxWorkers").field_path(".capacity.baseOnDemandReplicas"))]
pub struct ModelPoolSpec {
    /// How the pool's workers run.
    pub runtime: PoolRuntime,
    /// Resources of one worker.
    #[serde(default)]
    pub resources: Resources,
    /// Device memory of one worker that its models may use, bytes: each loaded model's
    /// weights, KV cache (the worker's `--kv-cache-memory`) and activations; the placement
    /// packs models into it, and the worker refuses a load that would not fit.
    #[schemars(range(min = 1))]
    pub worker_memory_bytes: u64,
    /// A model loaded on a worker with no work there and none queued for this long is
    /// unloaded.
    #[serde(default = "default_idle_unload_after")]
    #[schemars(range(min = 1, max = 86400))]
    pub idle_unload_after_seconds: u32,
    /// The worker count's sizing, on the summed demand of the pool's models.
    #[serde(default)]
    pub scaling: PoolScaling,
    /// Spot and on-demand capacity (`baseOnDemandReplicas` counts workers).
    #[serde(default)]
    pub capacity: Capacity,
    /// The node-local cache of the models' weights.
    pub cache: PoolCache,
    /// Seconds a stopping worker has to finish or re-enqueue its sequences (SIGTERM to exit).
    #[serde(default = "default_drain_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub drain_timeout_seconds: u32,
}

fn default_idle_unload_after() -> u32 {
    60
}

fn default_drain_timeout() -> u32 {
    30
}

/// How the pool's workers run (the per-model engine settings stay on each `Model`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolRuntime {
    /// Container image holding the `tidal` binary.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Image that downloads `https://` and `hf://` sources into the cache (needs `sh`,
    /// `curl`, `sha256sum`; with a `hostPath` cache also `chown`).
    #[serde(default = "default_fetch_image")]
    #[schemars(length(min = 1))]
    pub fetch_image: String,
    /// Further arguments appended to the worker's command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Port of the worker's `/health` and `/metrics`.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

fn default_fetch_image() -> String {
    "curlimages/curl:8.11.1".into()
}

fn default_port() -> u16 {
    8000
}

/// Where the pool keeps the models' weights on a node: a directory of the node (filled by
/// the first pool pod on the node, shared by the later ones) or a claim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.hostPath) != has(self.volumeClaim)").message("cache: set exactly one of hostPath or volumeClaim").field_path(".hostPath"))]
pub struct PoolCache {
    /// Absolute directory on each node (a `hostPath` volume of type `DirectoryOrCreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^/[^\s]*$"), length(min = 2, max = 4096))]
    pub host_path: Option<String>,
    /// PersistentVolumeClaim mounted by every pool pod (a per-node or shared volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume_claim: Option<String>,
}

/// The pool's worker count, sized like a Model's replicas on the pool's summed demand.
///
/// Time constants left out are sized on `coldStartSeconds` (else 60 s), as a Model's are.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.minWorkers <= self.maxWorkers").message("minWorkers must not exceed maxWorkers").field_path(".minWorkers"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.panicWindowSeconds) || !has(self.stableWindowSeconds) || self.panicWindowSeconds <= self.stableWindowSeconds").message("panicWindowSeconds must not exceed stableWindowSeconds").field_path(".panicWindowSeconds"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.floorSchedule) || self.floorSchedule.all(w, w.minReplicas <= self.maxWorkers)").message("floorSchedule minReplicas must not exceed maxWorkers").field_path(".floorSchedule"))]
pub struct PoolScaling {
    /// Fewest workers; 0 lets the pool go to zero when every model is idle.
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pub min_workers: u32,
    /// Most workers.
    #[serde(default = "default_max_workers")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_workers: u32,
    /// Requests (queued + running, all models) one worker is sized for.
    #[serde(default = "default_target")]
    #[schemars(range(min = 1, max = 10000))]
    pub target_in_flight_per_worker: u32,
    /// A worker's cold start (pod created to Ready) that the time constants left out are
    /// sized on. Left out: 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub cold_start_seconds: Option<u32>,
    /// Idle seconds of the whole pool before it goes to zero workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub scale_to_zero_after_seconds: Option<u32>,
    /// Seconds over which demand is summarised for normal decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 6, max = 3600))]
    pub stable_window_seconds: Option<u32>,
    /// How the stable window summarises demand. Left out: `Max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_aggregate: Option<StableAggregate>,
    /// Short window whose average triggers panic mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub panic_window_seconds: Option<u32>,
    /// Panic when the panic-window demand needs at least this percentage of the ready
    /// workers.
    #[serde(default = "default_panic_threshold")]
    #[schemars(range(min = 110, max = 1000))]
    pub panic_threshold_percent: u32,
    /// Scale down only to the highest target of this trailing period (0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 3600))]
    pub scale_down_delay_seconds: Option<u32>,
    /// How the scale-down delay holds past targets.
    #[serde(default)]
    pub scale_down_hold: ScaleDownHold,
    /// At most this multiple of the ready workers per decision when scaling up.
    #[serde(default = "default_up_rate")]
    #[schemars(range(min = 1.0, max = 1000.0))]
    pub max_scale_up_rate: f64,
    /// At least the ready workers divided by this per decision when scaling down.
    #[serde(default = "default_down_rate")]
    #[schemars(range(min = 1.0, max = 1000.0))]
    pub max_scale_down_rate: f64,
    /// Prompt tokens per second one worker prefills; 0 sizes on request counts alone.
    #[serde(default)]
    #[schemars(range(max = 100000000))]
    pub prefill_tokens_per_second: u32,
    /// What a request that only decodes weighs in the demand, percent of a queued one.
    #[serde(default = "default_decoding_weight")]
    #[schemars(range(max = 100))]
    pub decoding_weight_percent: u32,
    /// The time to first token that prefill sizing is for.
    #[serde(default = "default_ttft_target")]
    #[schemars(range(min = 10, max = 600000))]
    pub ttft_target_milliseconds: u32,
    /// Floors of workers by time of day (each window's `minReplicas` counts workers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub floor_schedule: Vec<ScheduledFloor>,
}

fn default_max_workers() -> u32 {
    10
}
fn default_target() -> u32 {
    8
}
fn default_panic_threshold() -> u32 {
    200
}
fn default_up_rate() -> f64 {
    1000.0
}
fn default_down_rate() -> f64 {
    2.0
}
fn default_decoding_weight() -> u32 {
    100
}
fn default_ttft_target() -> u32 {
    2000
}

impl Default for PoolScaling {
    fn default() -> Self {
        PoolScaling {
            min_workers: 0,
            max_workers: default_max_workers(),
            target_in_flight_per_worker: default_target(),
            cold_start_seconds: None,
            scale_to_zero_after_seconds: None,
            stable_window_seconds: None,
            stable_aggregate: None,
            panic_window_seconds: None,
            panic_threshold_percent: default_panic_threshold(),
            scale_down_delay_seconds: None,
            scale_down_hold: ScaleDownHold::Flat,
            max_scale_up_rate: default_up_rate(),
            max_scale_down_rate: default_down_rate(),
            prefill_tokens_per_second: 0,
            decoding_weight_percent: default_decoding_weight(),
            ttft_target_milliseconds: default_ttft_target(),
            floor_schedule: Vec::new(),
        }
    }
}
