//! A model pool's assignment loop (docs/autoscaling.md, "Model pools"): the I/O around the
//! pure placement [`tidal_autoscaler::pool::plan`], shared by the Kubernetes controller and
//! the local fleet of `tidal up`. One [`PoolDriver::tick`]:
//!
//! 1. expires workers whose heartbeat is stale (their assignment goes with them) and reads
//!    the live workers' heartbeats and every written assignment;
//! 2. reads each model's queue;
//! 3. plans ([`observe`] turns the records into what the placement reads);
//! 4. writes the assignment of each worker whose models change ([`assign`]); the workers
//!    load and unload when they next read it (every 200 ms);
//! 5. splits each worker's time since the previous tick across the models it served
//!    ([`share`]), for the fleet-time ledger.
//!
//! Scaling the workers (the plan's `workers` decision) is the caller's: Deployments on
//! Kubernetes, in-process workers locally.

pub mod assign;
pub mod driver;
pub mod observe;
pub mod share;

pub use driver::{PoolDriver, PoolTick, STALE_AFTER};
pub use observe::ModelQueue;
pub use share::{FleetShare, Shares};
