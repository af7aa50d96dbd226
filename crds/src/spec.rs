//! The `Model` custom resource's spec: what a platform team writes in `kubectl apply -f`.
//!
//! Every bound the reconciler relies on is in the schema (ranges, enums, patterns, required
//! fields, CEL rules for cross-field checks), so the API server rejects a bad manifest before
//! the controller sees it; [`crate::ModelSpec::validate`] repeats the cross-field checks for
//! clusters that skip CEL and for the local tools.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::ModelStatus;

/// A model served by Tidal: where its weights come from, how its workers run, how they scale,
/// on which capacity, and what tenants pay for it.
// clippy reads the repeated `printcolumn(type_ = ...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tidal.dev",
    version = "v1alpha1",
    kind = "Model",
    namespaced,
    status = "ModelStatus",
    shortname = "tm",
    category = "tidal",
    doc = "A model served by Tidal: runtime workers on spot and on-demand capacity, scaled with its request queue.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "serving phase: ScaledToZero, Starting, Ready or Degraded"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "ready replicas, spot and on-demand"
    ),
    printcolumn(
        name = "Spot",
        type_ = "integer",
        json_path = ".status.spot.ready",
        description = "ready spot replicas"
    ),
    printcolumn(
        name = "On-Demand",
        type_ = "integer",
        json_path = ".status.onDemand.ready",
        description = "ready on-demand replicas"
    ),
    printcolumn(
        name = "Backlog",
        type_ = "integer",
        json_path = ".status.backlog",
        description = "jobs queued and not yet claimed"
    ),
    printcolumn(
        name = "Cold-Start",
        type_ = "integer",
        json_path = ".status.timeConstants.coldStartSeconds",
        description = "seconds of cold start the unset time constants are sized on",
        priority = 1
    ),
    printcolumn(
        name = "Stable-Window",
        type_ = "integer",
        json_path = ".status.timeConstants.stableWindowSeconds",
        description = "the autoscaler's stable window in force, seconds",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "time since the Model was created"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.capacity.baseOnDemandReplicas <= self.scaling.maxReplicas").message("baseOnDemandReplicas must not exceed scaling.maxReplicas").field_path(".capacity.baseOnDemandReplicas"))]
#[x_kube(validation = kube::core::Rule::new(crate::pooled::POOLED_SCALING_RULE).message(crate::pooled::POOLED_SCALING_MESSAGE).field_path(".scaling"))]
#[x_kube(validation = kube::core::Rule::new(crate::pooled::POOLED_CAPACITY_RULE).message(crate::pooled::POOLED_CAPACITY_MESSAGE).field_path(".capacity"))]
#[x_kube(validation = kube::core::Rule::new(crate::pooled::POOLED_RESOURCES_RULE).message(crate::pooled::POOLED_RESOURCES_MESSAGE).field_path(".resources"))]
#[x_kube(validation = kube::core::Rule::new(crate::pooled::POOLED_CACHE_RULE).message(crate::pooled::POOLED_CACHE_MESSAGE).field_path(".source.cacheVolumeClaim"))]
pub struct ModelSpec {
    /// The `ModelPool` (same namespace) whose workers serve this model. Left out, the model
    /// gets its own Deployments; set, it has none: its weights go to the pool's node cache,
    /// and `scaling` (but for the gateway's `maxQueueWaitSeconds` and `maxBacklog`),
    /// `capacity`, `resources` and `source.cacheVolumeClaim` are the pool's business.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(min = 1, max = 54))]
    pub pool: Option<String>,
    /// Where the GGUF weights come from.
    pub source: ModelSource,
    /// How the runtime workers run.
    pub runtime: RuntimeSettings,
    /// Resources of one worker.
    #[serde(default)]
    pub resources: Resources,
    /// Autoscaling.
    #[serde(default)]
    pub scaling: Scaling,
    /// Spot and on-demand capacity.
    #[serde(default)]
    pub capacity: Capacity,
    /// What tenants pay, per million tokens.
    pub pricing: Pricing,
    /// Seconds a stopping worker has to finish or re-enqueue its sequences (SIGTERM to exit).
    #[serde(default = "default_drain_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub drain_timeout_seconds: u32,
}

fn default_drain_timeout() -> u32 {
    30
}

/// Where the GGUF weights come from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!self.uri.startsWith('https://') || has(self.sha256)").message("an https:// source needs sha256").field_path(".sha256"))]
pub struct ModelSource {
    /// `file:///path/in/the/image.gguf`, `https://host/path.gguf` (with `sha256`) or
    /// `hf://org/repo/path/file.gguf` (a Hugging Face Hub file).
    #[schemars(
        pattern(r"^(file:///[^\s]+|https://[^\s/]+/[^\s]+|hf://[^\s/]+/[^\s/]+/[^\s]+)$"),
        length(min = 8, max = 2048)
    )]
    pub uri: String,
    /// Expected SHA-256 of the file, lowercase hex; the download is rejected on mismatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    /// Hugging Face revision (branch, tag or commit) of an `hf://` source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub revision: Option<String>,
    /// Secret key holding a bearer token for the download (e.g. `HF_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<SecretKeyRef>,
    /// PersistentVolumeClaim that caches downloads across pods (default: an emptyDir per pod,
    /// so every cold start downloads the file again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cache_volume_claim: Option<String>,
}

/// A key of a Secret in the Model's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// How the runtime workers run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSettings {
    /// Container image holding the `tidal` binary.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Image that downloads `https://` and `hf://` sources (needs `sh`, `curl`, `sha256sum`).
    #[serde(default = "default_fetch_image")]
    #[schemars(length(min = 1))]
    pub fetch_image: String,
    /// Most sequences in one engine step (`--max-num-seqs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_sequences: Option<u32>,
    /// Token budget of one engine step (`--max-num-batched-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub token_budget: Option<u32>,
    /// KV-cache memory per worker, e.g. `2GiB` (`--kv-cache-memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]+(\.[0-9]+)?(B|KB|MB|GB|KiB|MiB|GiB|K|M|G|Ki|Mi|Gi)?$"))]
    pub kv_cache_memory: Option<String>,
    /// Re-quantise the weights at load (`--quantize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantisation: Option<Quantisation>,
    /// Context length advertised in `/v1/models`; omitted means unknown (0 in the record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10485760))]
    pub context_length: Option<u32>,
    /// Public prompt prefixes (system prompts) whose prefix-cache blocks every tenant shares
    /// (`--shared-prefixes`). Without them each tenant's prompts are cached apart from every
    /// other tenant's. Never list a prefix that is not public.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub shared_prefixes: Vec<SharedPrefixSpec>,
    /// Speculative decoding (`--speculative`, `--num-speculative-tokens`); off when
    /// omitted. The tokens served are the same either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeSpec>,
    /// Further arguments appended to the worker's command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Port of the worker's `/health` and `/metrics`.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// One public prefix shared between tenants: prompt text, or a system message rendered
/// through the model's chat template.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.text) != has(self.system)").message("a shared prefix has exactly one of text or system").field_path(".text"))]
pub struct SharedPrefixSpec {
    /// Prompt text as the model reads it (for a chat model, the start of the rendered chat
    /// template, special tokens included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 65536))]
    pub text: Option<String>,
    /// A system message, rendered through the model's chat template as a conversation's
    /// first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 65536))]
    pub system: Option<String>,
}

impl RuntimeSettings {
    /// `shared_prefixes` as the worker's `--shared-prefixes` JSON (strings for texts,
    /// `{"system": ...}` for system messages); `None` when there are none.
    pub fn shared_prefixes_json(&self) -> Option<String> {
        if self.shared_prefixes.is_empty() {
            return None;
        }
        let entries: Vec<serde_json::Value> = self
            .shared_prefixes
            .iter()
            .filter_map(|p| match (&p.text, &p.system) {
                (Some(text), None) => Some(serde_json::Value::String(text.clone())),
                (None, Some(system)) => Some(serde_json::json!({ "system": system })),
                _ => None,
            })
            .collect();
        Some(serde_json::Value::Array(entries).to_string())
    }
}

fn default_fetch_image() -> String {
    "curlimages/curl:8.11.1".into()
}

fn default_port() -> u16 {
    8000
}

/// Weight formats the runtime can re-quantise to.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantisation {
    /// 4-bit, one scale per 32 weights.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// 4-bit, scale and minimum per 32 weights.
    #[serde(rename = "q4_1")]
    Q4_1,
    /// 8-bit, one scale per 32 weights.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// Half precision.
    #[serde(rename = "f16")]
    F16,
}

/// Speculative decoding of a Model's workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.method != 'draft' || has(self.draftModel)").message("method draft needs draftModel").field_path(".draftModel"))]
pub struct SpeculativeSpec {
    /// How tokens are proposed.
    pub method: SpeculativeMethodSpec,
    /// Most tokens proposed for one sequence in one step (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub num_speculative_tokens: Option<u32>,
    /// The draft model of method `draft` (`--draft-model`), in the form of `spec.source`: a
    /// smaller GGUF whose vocabulary is the model's, token for token (the worker refuses
    /// any other at load). Downloaded next to the model's weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<ModelSource>,
}

/// A speculative decoding proposer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeculativeMethodSpec {
    /// One token per step.
    #[serde(rename = "off")]
    Off,
    /// Prompt lookup: the continuation of the latest earlier occurrence of the last tokens.
    #[serde(rename = "ngram")]
    Ngram,
    /// A draft model (`draftModel`) proposes its greedy continuation.
    #[serde(rename = "draft")]
    Draft,
}

impl SpeculativeSpec {
    /// The worker's flags, with the draft model at `draft_path` in the worker's file system
    /// (where the controller puts `draftModel`).
    pub fn args(&self, draft_path: Option<&str>) -> Vec<String> {
        let method = match self.method {
            SpeculativeMethodSpec::Off => "off",
            SpeculativeMethodSpec::Ngram => "ngram",
            SpeculativeMethodSpec::Draft => "draft",
        };
        let mut args = vec!["--speculative".to_owned(), method.to_owned()];
        if let Some(k) = self.num_speculative_tokens {
            args.extend(["--num-speculative-tokens".to_owned(), k.to_string()]);
        }
        if let (SpeculativeMethodSpec::Draft, Some(path)) = (self.method, draft_path) {
            args.extend(["--draft-model".to_owned(), path.to_owned()]);
        }
        args
    }
}

impl Quantisation {
    /// The `--quantize` value.
    pub fn as_arg(self) -> &'static str {
        match self {
            Quantisation::Q4_0 => "q4_0",
            Quantisation::Q4_1 => "q4_1",
            Quantisation::Q8_0 => "q8_0",
            Quantisation::F16 => "f16",
        }
    }
}

/// Resources of one worker.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// GPUs per worker (0: CPU only).
    #[serde(default)]
    #[schemars(range(max = 16))]
    pub gpus: u32,
    /// GPU model the worker needs; becomes a node selector on `gpuTypeLabel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub gpu_type: Option<String>,
    /// Node label that carries the GPU model (default `nvidia.com/gpu.product`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub gpu_type_label: Option<String>,
    /// Extended resource name of a GPU (default `nvidia.com/gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub gpu_resource: Option<String>,
    /// CPU request and limit, a Kubernetes quantity (e.g. `4`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]+(\.[0-9]+)?m?$"))]
    pub cpu: Option<String>,
    /// Memory request and limit, a Kubernetes quantity (e.g. `16Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"))]
    pub memory: Option<String>,
}

/// How the scale-down delay holds the targets of its trailing period.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ScaleDownHold {
    /// The highest target of the trailing delay (Knative's `scale-down-delay`).
    #[default]
    Flat,
    /// Replica level k of a past target is held for `scaleDownDelaySeconds / k`.
    PerLevel,
}

/// How the stable window summarises demand. Left out of `scaling`: `Max`.
// (On the optional `scaling.stableAggregate` the schema shows this doc, not the field's.)
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StableAggregate {
    /// The window's mean (Knative's KPA).
    #[default]
    Mean,
    /// The window's peak: keeps capacity for recent bursts when cold starts are slow.
    Max,
}

/// Autoscaling (Knative KPA-style, driven by queue depth).
///
/// The five time constants (`stableWindowSeconds`, `stableAggregate`, `panicWindowSeconds`,
/// `scaleDownDelaySeconds`, `scaleToZeroAfterSeconds`) that are left out are sized on the
/// replicas' cold start: `coldStartSeconds` when given, else the cold start the controller
/// measures (`status.measuredColdStartSeconds`), else 60 s until a replica has started.
/// `status.timeConstants` shows the values in force.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas").field_path(".minReplicas"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.panicWindowSeconds) || !has(self.stableWindowSeconds) || self.panicWindowSeconds <= self.stableWindowSeconds").message("panicWindowSeconds must not exceed stableWindowSeconds").field_path(".panicWindowSeconds"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.floorSchedule) || self.floorSchedule.all(w, w.minReplicas <= self.maxReplicas)").message("floorSchedule minReplicas must not exceed maxReplicas").field_path(".floorSchedule"))]
pub struct Scaling {
    /// Fewest serving replicas; 0 allows scale to zero.
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pub min_replicas: u32,
    /// Most serving replicas.
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: u32,
    /// Requests (queued + running) one replica is sized for.
    #[serde(default = "default_target")]
    #[schemars(range(min = 1, max = 10000))]
    pub target_in_flight_per_replica: u32,
    /// The replicas' cold start (pod created to Ready: node, image, weights, load) that the
    /// time constants left out are sized on. Left out: the controller's measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub cold_start_seconds: Option<u32>,
    /// Idle seconds (no backlog, nothing in flight, no new request) before scaling to zero.
    /// Left out: 10 cold starts (at least 120; at least 600 when a cold start is longer than
    /// the TTFT target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub scale_to_zero_after_seconds: Option<u32>,
    /// Seconds over which demand is summarised for normal decisions. Left out: 5 cold
    /// starts (at least 60; at least 300 when a cold start is longer than the TTFT target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 6, max = 3600))]
    pub stable_window_seconds: Option<u32>,
    /// How the stable window summarises demand. Left out: `Max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_aggregate: Option<StableAggregate>,
    /// Short window whose average triggers panic mode. Left out: a tenth of the stable
    /// window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub panic_window_seconds: Option<u32>,
    /// Panic when the panic-window demand needs at least this percentage of the ready replicas.
    #[serde(default = "default_panic_threshold")]
    #[schemars(range(min = 110, max = 1000))]
    pub panic_threshold_percent: u32,
    /// Scale down only to the highest target of this trailing period (0: off). Left out: 5
    /// cold starts (at least 300 when a cold start is longer than the TTFT target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 3600))]
    pub scale_down_delay_seconds: Option<u32>,
    /// How the scale-down delay holds past targets.
    #[serde(default)]
    pub scale_down_hold: ScaleDownHold,
    /// At most this multiple of the ready replicas per decision when scaling up.
    #[serde(default = "default_up_rate")]
    #[schemars(range(min = 1.0, max = 1000.0))]
    pub max_scale_up_rate: f64,
    /// At least the ready replicas divided by this per decision when scaling down.
    #[serde(default = "default_down_rate")]
    #[schemars(range(min = 1.0, max = 1000.0))]
    pub max_scale_down_rate: f64,
    /// Prompt tokens per second one replica prefills (`tidal bench profile` measures it). Above
    /// 0, replicas are also sized for the prompt tokens that arrive within
    /// `ttftTargetMilliseconds`, so a burst of long prompts gets more replicas than its
    /// request count; 0 sizes on request counts alone.
    #[serde(default)]
    #[schemars(range(max = 100000000))]
    pub prefill_tokens_per_second: u32,
    /// What a request that has its first token (and only decodes now) weighs in the demand,
    /// in percent of one that is queued or waiting for prefill; 100 counts every request
    /// alike, as Knative counts concurrency. On the simulated GPU fleet 50 cost 2-6 % less at
    /// the same TTFT SLO; on the simulated 2-core CPU fleet it traded SLO for cost (replay
    /// your traffic with `tidal sim --decoding-weight`; docs/autoscaling.md, "Decoding
    /// weight").
    #[serde(default = "default_decoding_weight")]
    #[schemars(range(max = 100))]
    pub decoding_weight_percent: u32,
    /// The time to first token that prefill sizing is for.
    #[serde(default = "default_ttft_target")]
    #[schemars(range(min = 10, max = 600000))]
    pub ttft_target_milliseconds: u32,
    /// Longest a request waits in the queue (cold start included) before the gateway gives up.
    #[serde(default = "default_max_queue_wait")]
    #[schemars(range(min = 1, max = 3600))]
    pub max_queue_wait_seconds: u32,
    /// Most jobs waiting before the gateway answers 503.
    #[serde(default = "default_max_backlog")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_backlog: u32,
    /// Floors by time of day (UTC unless a window names its time zone): while a window
    /// holds, `minReplicas` is raised to its `minReplicas` (the highest of the windows that
    /// hold), so the first burst of a busy period finds replicas Ready instead of waiting a
    /// cold start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub floor_schedule: Vec<ScheduledFloor>,
}

/// A day of the week.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weekday {
    /// Monday
    Mon,
    /// Tuesday
    Tue,
    /// Wednesday
    Wed,
    /// Thursday
    Thu,
    /// Friday
    Fri,
    /// Saturday
    Sat,
    /// Sunday
    Sun,
}

/// A floor of replicas from `start` to `end` ("HH:MM" on the clock of `timeZone`) on `days`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledFloor {
    /// Days the window starts on; empty or absent: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days: Vec<Weekday>,
    /// First minute of the window, "HH:MM" local time.
    #[schemars(pattern(r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// End of the window (exclusive), "HH:MM" local time; at or before `start`, the window
    /// runs past midnight into the next day.
    #[schemars(pattern(r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub end: String,
    /// Replicas kept serving while the window holds.
    #[schemars(range(max = 1000))]
    pub min_replicas: u32,
    /// IANA time zone whose clock `days`, `start` and `end` are read on, daylight saving time
    /// included (e.g. "Europe/Berlin"); absent: UTC. A time the clock skips stands for the
    /// first minute after the skip; one it repeats opens the window at its first occurrence
    /// and closes it at its second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
}

fn default_max_replicas() -> u32 {
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
fn default_max_queue_wait() -> u32 {
    120
}
fn default_max_backlog() -> u32 {
    1000
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling {
            min_replicas: 0,
            max_replicas: default_max_replicas(),
            target_in_flight_per_replica: default_target(),
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
            max_queue_wait_seconds: default_max_queue_wait(),
            max_backlog: default_max_backlog(),
            floor_schedule: Vec::new(),
        }
    }
}

/// Which capacity types a model's replicas may run on.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CapacityMode {
    /// Spot only (plus `baseOnDemandReplicas`).
    Spot,
    /// On-demand only.
    OnDemand,
    /// Spot first; on-demand replaces unavailable or interrupted spot replicas.
    #[default]
    SpotWithFallback,
}

/// Spot and on-demand capacity.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Which capacity types to use.
    #[serde(default)]
    pub mode: CapacityMode,
    /// On-demand replicas kept whenever the model has any replica (latency floor).
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pub base_on_demand_replicas: u32,
    /// Seconds a spot pod may stay Pending before an on-demand replica replaces it.
    #[serde(default = "default_fallback_after")]
    #[schemars(range(min = 1, max = 3600))]
    pub fallback_after_seconds: u32,
    /// Scheduling and cost of spot workers.
    #[serde(default)]
    pub spot: CapacityPool,
    /// Scheduling and cost of on-demand workers.
    #[serde(default)]
    pub on_demand: CapacityPool,
}

fn default_fallback_after() -> u32 {
    30
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            mode: CapacityMode::SpotWithFallback,
            base_on_demand_replicas: 0,
            fallback_after_seconds: default_fallback_after(),
            spot: CapacityPool::default(),
            on_demand: CapacityPool::default(),
        }
    }
}

/// Scheduling and cost of one capacity type.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPool {
    /// Node labels the workers must run on (e.g. `karpenter.sh/capacity-type: spot`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the workers (e.g. for a spot taint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// What one replica-hour costs the platform, in micro-units of the pricing currency
    /// (for the platform cost report; 0 records replica time without a cost).
    #[serde(default)]
    #[schemars(range(max = 1000000000000i64))]
    pub cost_per_replica_hour_micros: i64,
}

/// What tenants pay, per million tokens, in integer micro-units of `currency`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    /// ISO 4217 currency code.
    #[serde(default = "default_currency")]
    #[schemars(pattern(r"^[A-Z]{3}$"))]
    pub currency: String,
    /// Per million computed prompt tokens.
    #[schemars(range(min = 0, max = 1000000000000i64))]
    pub input_per_million_micros: i64,
    /// Per million prompt tokens served from the prefix cache.
    #[schemars(range(min = 0, max = 1000000000000i64))]
    pub cached_input_per_million_micros: i64,
    /// Per million generated tokens.
    #[schemars(range(min = 0, max = 1000000000000i64))]
    pub output_per_million_micros: i64,
}

fn default_currency() -> String {
    "USD".into()
}
