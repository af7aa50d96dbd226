//! The `Model`'s status, written by the controller on the status subresource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::StableAggregate;

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
    /// The slowest cold start (pod created to Ready) among the Ready replicas the controller
    /// last saw, in whole seconds, kept while the model has none; replicas that restarted a
    /// container are left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_cold_start_seconds: Option<u32>,
    /// The time constants the autoscaler runs with: those the spec gives, the others sized
    /// on the cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_constants: Option<TimeConstants>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Where the cold start that sizes the time constants comes from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdStartSource {
    /// `scaling.coldStartSeconds`.
    Spec,
    /// The controller's measurement, `measuredColdStartSeconds`.
    Measured,
    /// 60 s, before any replica has been Ready.
    Assumed,
}

/// The autoscaler's time constants in force, and the cold start the unset ones are sized on.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TimeConstants {
    /// The cold start the time constants left out of the spec are sized on.
    pub cold_start_seconds: u32,
    /// Where it comes from.
    pub cold_start_source: ColdStartSource,
    /// Stable window.
    pub stable_window_seconds: u32,
    /// How the stable window summarises demand.
    pub stable_aggregate: StableAggregate,
    /// Panic window (may be fractional when sized: a tenth of the stable window).
    pub panic_window_seconds: f64,
    /// Scale-down delay.
    pub scale_down_delay_seconds: u32,
    /// Idle time before scaling to zero.
    pub scale_to_zero_after_seconds: u32,
}
