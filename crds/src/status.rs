//! The `Model`'s status, written by the controller on the status subresource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Serving phase of a model.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    /// No replicas; the first queued request starts one.
    #[default]
    ScaledToZero,
    /// Replicas requested, none ready yet.
    Starting,
    /// At least one replica serving.
    Ready,
    /// The controller cannot act on the model (invalid spec, queue or ledger unreachable).
    Degraded,
}

/// Replicas of one capacity type.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityStatus {
    /// Replicas the autoscaler wants.
    pub desired: u32,
    /// Replicas ready to claim work.
    pub ready: u32,
}

/// What the controller last observed and decided for a model.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelStatus {
    /// Serving phase.
    #[serde(default)]
    pub phase: Phase,
    /// Ready replicas across capacity types.
    #[serde(default)]
    pub ready_replicas: u32,
    /// Spot replicas.
    #[serde(default)]
    pub spot: CapacityStatus,
    /// On-demand replicas.
    #[serde(default)]
    pub on_demand: CapacityStatus,
    /// On-demand replicas standing in for unavailable or interrupted spot replicas.
    #[serde(default)]
    pub fallback_replicas: u32,
    /// Jobs queued and not yet claimed.
    #[serde(default)]
    pub backlog: u64,
    /// Jobs claimed and not yet finished.
    #[serde(default)]
    pub in_flight: u64,
    /// Of `inFlight`, the jobs whose first token is out (only decoding now).
    #[serde(default)]
    pub decoding: u64,
    /// When the controller last saw work for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request_time: Option<Time>,
    /// `Ready`, `SpotAvailable` and `SpecValid` conditions with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
