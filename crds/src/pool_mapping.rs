//! A `ModelPool`'s spec as the placement policy reads it ([`PoolSpec`]), and the checks its
//! CEL rules also make (for clusters and tools that do not run CEL).

use std::time::Duration;

use tidal_autoscaler::pool::PoolSpec;

use crate::mapping::{policy_scaling, ColdStart, InvalidSpec};
use crate::pool::{ModelPoolSpec, PoolCache, PoolScaling};
use crate::spec::Scaling;

/// Where the weights sit in the pool pods, and on which kind of volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheVolume {
    /// A directory of the node.
    HostPath(String),
    /// A PersistentVolumeClaim.
    Claim(String),
}

impl PoolCache {
    /// The cache's volume, or why the section is malformed.
    pub fn volume(&self) -> Result<CacheVolume, InvalidSpec> {
        match (&self.host_path, &self.volume_claim) {
            (Some(path), None) if path.starts_with('/') => Ok(CacheVolume::HostPath(path.clone())),
            (None, Some(claim)) => Ok(CacheVolume::Claim(claim.clone())),
            _ => Err(InvalidSpec::PoolCache),
        }
    }
}

impl PoolScaling {
    /// The section read as a Model fleet's `scaling` (workers for replicas), so the pool's
    /// sizing maps onto the policy exactly as a Model's does. The gateway's admission
    /// settings are per Model and do not apply.
    pub fn as_fleet_scaling(&self) -> Scaling {
        Scaling {
            min_replicas: self.min_workers,
            max_replicas: self.max_workers,
            target_in_flight_per_replica: self.target_in_flight_per_worker,
            cold_start_seconds: self.cold_start_seconds,
            scale_to_zero_after_seconds: self.scale_to_zero_after_seconds,
            stable_window_seconds: self.stable_window_seconds,
            stable_aggregate: self.stable_aggregate,
            panic_window_seconds: self.panic_window_seconds,
            panic_threshold_percent: self.panic_threshold_percent,
            scale_down_delay_seconds: self.scale_down_delay_seconds,
            scale_down_hold: self.scale_down_hold,
            max_scale_up_rate: self.max_scale_up_rate,
            max_scale_down_rate: self.max_scale_down_rate,
            prefill_tokens_per_second: self.prefill_tokens_per_second,
            decoding_weight_percent: self.decoding_weight_percent,
            ttft_target_milliseconds: self.ttft_target_milliseconds,
            floor_schedule: self.floor_schedule.clone(),
            ..Scaling::default()
        }
    }
}

impl ModelPoolSpec {
    /// The cold start the unset time constants are sized on: `scaling.coldStartSeconds`,
    /// else the assumed one (the controller does not measure a pool's yet).
    pub fn cold_start(&self) -> ColdStart {
        match self.scaling.cold_start_seconds {
            Some(s) => ColdStart::given(Duration::from_secs(u64::from(s))),
            None => ColdStart::ASSUMED,
        }
    }

    /// Every check the reconciler needs; the placement's spec.
    pub fn pool_spec(&self) -> Result<PoolSpec, InvalidSpec> {
        self.cache.volume()?;
        let workers = policy_scaling(
            &self.scaling.as_fleet_scaling(),
            &self.capacity,
            self.cold_start(),
        )?;
        let spec = PoolSpec {
            worker_memory_bytes: self.worker_memory_bytes,
            idle_unload_after: Duration::from_secs(u64::from(self.idle_unload_after_seconds)),
            workers,
        };
        spec.validate()?;
        Ok(spec)
    }
}
