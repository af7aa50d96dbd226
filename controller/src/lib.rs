//! Tidal's Kubernetes controller: turns each `Model` into two Deployments of runtime workers
//! (`{name}-spot`, `{name}-ondemand`) and keeps their replicas matched to the model's queue
//! with the autoscaling policy of `tidal-autoscaler` (design.md, "Autoscaling" and "Spot
//! capacity").
//!
//! A `ModelPool` gets `{pool}-spot` and `{pool}-ondemand` of pool workers instead, built by
//! [`pool_deployment`] and applied by [`pool_reconcile`], which runs the pool's assignment
//! loop each tick ([`pool_assign`]); a Model in a pool has none of its own ([`pooled`]).
//!
//! Pure parts (tested with plain unit tests): [`deployment`] (the Deployment a Model gets),
//! [`observe`] (pods and nodes → the policy's view), [`report`] (status, record state,
//! Events), [`fleet_time`] (replica time per minute), [`fleet_cost`] (the cost-rate gauge),
//! [`model_metrics`] (the per-Model series of `/metrics`).
//! I/O parts: [`reconcile`] (one tick of one Model, and the finaliser), [`events`] (publishing
//! Events), [`leader`] (Lease election), [`watch_mode`] (streaming lists or lists), [`http`]
//! (`/health`, `/metrics`), [`mod@run`] (the process).

pub mod context;
pub mod deployment;
pub mod error;
pub mod events;
pub mod fleet_cost;
pub mod fleet_time;
pub mod http;
pub mod leader;
pub mod model_metrics;
pub mod names;
pub mod observe;
pub mod pool_assign;
pub mod pool_deployment;
pub mod pool_reconcile;
pub mod pooled;
pub mod reconcile;
pub mod report;
pub mod run;
pub mod watch_mode;

pub use context::{Clock, Context, Settings};
pub use error::{Error, Result};
pub use run::{run, RunConfig, RunError};

/// Re-exported so tests and the CLI use the same client versions.
pub use k8s_openapi;
pub use kube;
