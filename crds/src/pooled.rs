//! What a `Model` in a pool (`spec.pool`) must leave out: the settings of a fleet of its own
//! (replica floors, capacity, worker resources, a download cache), which the `ModelPool`
//! owns. The CEL rules on `ModelSpec` and [`ModelSpec::check_pooled`] make the same checks,
//! so clusters that skip CEL get the same message from the controller.
//!
//! The schema defaults `scaling`, `capacity` and `resources`, so the rules compare with the
//! defaults rather than test for presence; a field guarded by `has` may be absent where a
//! client sends the object without the API server's defaulting (the Rust checks, tests).

use crate::mapping::InvalidSpec;
use crate::spec::{Capacity, CapacityMode, CapacityPool, ModelSpec, Resources};

/// CEL: a pool Model keeps no replica floor of its own.
pub const POOLED_SCALING_RULE: &str = "!has(self.pool) || !has(self.scaling) || ((!has(self.scaling.minReplicas) || self.scaling.minReplicas == 0) && !has(self.scaling.floorSchedule))";
/// Message of [`POOLED_SCALING_RULE`].
pub const POOLED_SCALING_MESSAGE: &str = "a Model in a pool has no replicas of its own: leave scaling.minReplicas at 0 and scaling.floorSchedule out (the ModelPool's scaling keeps workers warm)";

/// CEL: a pool Model runs on the pool's capacity.
pub const POOLED_CAPACITY_RULE: &str = "!has(self.pool) || !has(self.capacity) || ((!has(self.capacity.baseOnDemandReplicas) || self.capacity.baseOnDemandReplicas == 0) && (!has(self.capacity.mode) || self.capacity.mode == 'SpotWithFallback') && (!has(self.capacity.fallbackAfterSeconds) || self.capacity.fallbackAfterSeconds == 30) && (!has(self.capacity.spot) || (!has(self.capacity.spot.nodeSelector) && !has(self.capacity.spot.tolerations) && (!has(self.capacity.spot.costPerReplicaHourMicros) || self.capacity.spot.costPerReplicaHourMicros == 0))) && (!has(self.capacity.onDemand) || (!has(self.capacity.onDemand.nodeSelector) && !has(self.capacity.onDemand.tolerations) && (!has(self.capacity.onDemand.costPerReplicaHourMicros) || self.capacity.onDemand.costPerReplicaHourMicros == 0))))";
/// Message of [`POOLED_CAPACITY_RULE`].
pub const POOLED_CAPACITY_MESSAGE: &str =
    "a Model in a pool runs on the pool's capacity: leave capacity out (set it on the ModelPool)";

/// CEL: a pool Model runs on the pool's workers.
pub const POOLED_RESOURCES_RULE: &str = "!has(self.pool) || !has(self.resources) || ((!has(self.resources.gpus) || self.resources.gpus == 0) && !has(self.resources.gpuType) && !has(self.resources.gpuTypeLabel) && !has(self.resources.gpuResource) && !has(self.resources.cpu) && !has(self.resources.memory))";
/// Message of [`POOLED_RESOURCES_RULE`].
pub const POOLED_RESOURCES_MESSAGE: &str =
    "a Model in a pool runs on the pool's workers: leave resources out (set them on the ModelPool)";

/// CEL: a pool Model's weights go to the pool's node cache.
pub const POOLED_CACHE_RULE: &str = "!has(self.pool) || !has(self.source.cacheVolumeClaim)";
/// Message of [`POOLED_CACHE_RULE`].
pub const POOLED_CACHE_MESSAGE: &str = "a Model in a pool is downloaded into the pool's node cache: leave source.cacheVolumeClaim out (set cache on the ModelPool)";

impl ModelSpec {
    /// For a Model with `spec.pool`, the checks of the `POOLED_*` CEL rules; nothing for
    /// any other Model.
    pub fn check_pooled(&self) -> Result<(), InvalidSpec> {
        if self.pool.is_none() {
            return Ok(());
        }
        let s = &self.scaling;
        if s.min_replicas != 0 || !s.floor_schedule.is_empty() {
            return Err(InvalidSpec::Pooled(POOLED_SCALING_MESSAGE));
        }
        let c = &self.capacity;
        let default = Capacity::default();
        let bare = |p: &CapacityPool| *p == CapacityPool::default();
        if c.base_on_demand_replicas != 0
            || c.mode != CapacityMode::SpotWithFallback
            || c.fallback_after_seconds != default.fallback_after_seconds
            || !bare(&c.spot)
            || !bare(&c.on_demand)
        {
            return Err(InvalidSpec::Pooled(POOLED_CAPACITY_MESSAGE));
        }
        if self.resources != Resources::default() {
            return Err(InvalidSpec::Pooled(POOLED_RESOURCES_MESSAGE));
        }
        if self.source.cache_volume_claim.is_some() {
            return Err(InvalidSpec::Pooled(POOLED_CACHE_MESSAGE));
        }
        Ok(())
    }
}
