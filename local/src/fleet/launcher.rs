//! How the fleet runs one worker: load the model, serve the queue, drain on request.
//!
//! A trait so the fleet's scaling logic is tested with instant fake workers, and `tidal up`
//! plugs in the real runtime (model load + queue worker).

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

/// Starts workers for the fleet.
#[async_trait]
pub trait Launcher: Send + Sync + 'static {
    /// Loads `model` and serves its queue as worker `name` until `stop` becomes true, then
    /// drains and returns once the model's memory is released. Sends the load time on
    /// `ready` once the worker claims jobs (dropping `ready` unsent means it never got there).
    async fn run(
        &self,
        model: &str,
        name: &str,
        ready: oneshot::Sender<Duration>,
        stop: watch::Receiver<bool>,
    ) -> Result<(), LaunchError>;
}

/// Why a worker could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);
