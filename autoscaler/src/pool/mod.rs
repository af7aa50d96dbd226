//! Many models, one warm pool: runtime workers that each hold one or more models and load or
//! unload one in about a second (from the node's page cache or local disk), assigned to
//! models by demand. The pure core, as the controller and `tidal sim --pool` call it:
//!
//! - [`spec`]: the pool's spec (worker memory, idle unload timeout, worker sizing);
//! - [`observed`]: what the placement reads (per-model demand, per-worker memory and models);
//! - [`placement`]: [`plan`], the placement policy (which model loads where, what is
//!   evicted, how many workers), following ServerlessLLM's locality-aware placement and the
//!   model fleets' autoscaling policy ([`crate::decide`]) for the counts;
//! - [`packing`]: workers needed by memory (first-fit decreasing);
//! - [`fleet_time`]: the ledger's split of a worker's time across the models it served.

pub mod fleet_time;
pub mod observed;
pub mod packing;
pub mod placement;
pub mod spec;

pub use fleet_time::{split_fleet_time, Payer};
pub use observed::{LoadedModel, ModelDemand, PoolObserved, WorkerState};
pub use placement::{plan, Action, Condition, PoolPlan, PoolState, Unload};
pub use spec::{PoolSpec, PoolSpecError};

#[cfg(test)]
mod tests;
