//! The `ModelPool`'s status, written by the controller on the status subresource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::CapacityStatus;

/// What the controller last observed of a pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelPoolStatus {
    /// Ready workers across capacity types.
    #[serde(default)]
    pub ready_workers: u32,
    /// Spot workers.
    #[serde(default)]
    pub spot: CapacityStatus,
    /// On-demand workers.
    #[serde(default)]
    pub on_demand: CapacityStatus,
    /// Number of `models`.
    #[serde(default)]
    pub model_count: u32,
    /// The Models (names in the pool's namespace) whose `spec.pool` names this pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Each worker and the models it holds, from the workers' heartbeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<PoolWorkerStatus>,
    /// `Ready` and `SpecValid` conditions with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One pool worker and what it holds.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolWorkerStatus {
    /// The worker (its pod name).
    pub name: String,
    /// The node it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Models loaded or loading on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}
