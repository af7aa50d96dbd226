//! The pool's spec: how much a worker holds, when an idle model is unloaded, and how the
//! worker count is sized. The sizing is a model fleet's [`ScalingSpec`] read for the pool as
//! a whole, so windows, panic mode, scale to zero and capacity types behave as they do for
//! one model's fleet (docs/autoscaling.md, "Model pools").

use crate::spec::{ScalingSpec, SpecError};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use thiserror::Error;

/// One pool of runtime workers shared by many models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// Device memory of one worker that its models may use, bytes: each model's weights,
    /// KV cache and activations.
    pub worker_memory_bytes: u64,
    /// A model loaded on a worker with no work there and none queued for this long is
    /// unloaded (its memory is then free without an eviction).
    #[serde(with = "crate::spec::secs")]
    pub idle_unload_after: Duration,
    /// The worker count's sizing, as for one model's fleet: `minReplicas`/`maxReplicas` are
    /// the min/max workers, `stableWindow` and `scaleDownDelay` the scale-down stability,
    /// `scaleToZeroAfter` how long the whole pool idles before it goes to zero,
    /// `targetInFlightPerReplica` the requests (of all models) one worker is sized for.
    pub workers: ScalingSpec,
}

impl Default for PoolSpec {
    fn default() -> Self {
        Self {
            // an 80 GiB device, less the runtime's own buffers and headroom
            worker_memory_bytes: 60 << 30,
            idle_unload_after: Duration::from_secs(60),
            workers: ScalingSpec::default(),
        }
    }
}

/// A pool spec the placement cannot act on.
#[derive(Debug, Error, PartialEq)]
pub enum PoolSpecError {
    /// A worker that can hold nothing.
    #[error("workerMemoryBytes must be above zero")]
    NoWorkerMemory,
    /// The worker sizing is invalid as a model's scaling spec would be.
    #[error("workers: {0}")]
    Workers(#[from] SpecError),
}

impl PoolSpec {
    /// Checks what [`super::plan`] relies on.
    pub fn validate(&self) -> Result<(), PoolSpecError> {
        if self.worker_memory_bytes == 0 {
            return Err(PoolSpecError::NoWorkerMemory);
        }
        self.workers.validate()?;
        Ok(())
    }

    /// Min workers.
    pub fn min_workers(&self) -> u32 {
        self.workers.min_replicas
    }

    /// Max workers.
    pub fn max_workers(&self) -> u32 {
        self.workers.max_replicas
    }

    /// How many workers one model wants to hold it, sized by the same policy on that model's
    /// own demand: the worker sizing with no floor, up to every worker, and zero once the
    /// model has idled for `idle_unload_after` (its copies are then unloadable).
    pub fn model_scaling(&self) -> ScalingSpec {
        ScalingSpec {
            min_replicas: 0,
            floor_schedule: Vec::new(),
            scale_to_zero_after: self.idle_unload_after,
            ..self.workers.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_what_is_wrong() {
        assert_eq!(PoolSpec::default().validate(), Ok(()));
        let none = PoolSpec {
            worker_memory_bytes: 0,
            ..PoolSpec::default()
        };
        assert_eq!(none.validate(), Err(PoolSpecError::NoWorkerMemory));
        let mut bad = PoolSpec::default();
        bad.workers.min_replicas = 20;
        bad.workers.max_replicas = 2;
        assert_eq!(
            bad.validate(),
            Err(PoolSpecError::Workers(SpecError::MinAboveMax {
                min: 20,
                max: 2
            }))
        );
    }

    #[test]
    fn a_model_is_sized_without_the_pool_floor_and_idles_out_on_the_unload_timeout() {
        let mut spec = PoolSpec::default();
        spec.workers.min_replicas = 3;
        spec.idle_unload_after = Duration::from_secs(7);
        let m = spec.model_scaling();
        assert_eq!(m.min_replicas, 0);
        assert_eq!(m.scale_to_zero_after, Duration::from_secs(7));
        assert_eq!(m.max_replicas, spec.max_workers());
    }

    #[test]
    fn round_trips_as_json_in_seconds() {
        let spec = PoolSpec::default();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["idleUnloadAfter"], 60.0);
        let back: PoolSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }
}
