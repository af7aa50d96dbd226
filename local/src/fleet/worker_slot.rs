//! One worker the fleet started: its stop switch, task and readiness.

use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::launcher::LaunchError;

/// Lifecycle of a started worker as the fleet sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Loading the model.
    Starting,
    /// Claiming jobs.
    Ready,
    /// Asked to stop; draining.
    Stopping,
}

/// A worker task and the handles to watch and stop it.
pub struct WorkerSlot {
    pub name: String,
    pub phase: Phase,
    ready: Option<oneshot::Receiver<Duration>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), LaunchError>>,
}

impl WorkerSlot {
    pub fn new(
        name: String,
        ready: oneshot::Receiver<Duration>,
        stop: watch::Sender<bool>,
        task: JoinHandle<Result<(), LaunchError>>,
    ) -> Self {
        Self {
            name,
            phase: Phase::Starting,
            ready: Some(ready),
            stop,
            task,
        }
    }

    /// Moves a starting worker to ready when it reported its load time; returns that time.
    pub fn poll_ready(&mut self) -> Option<Duration> {
        let rx = self.ready.as_mut()?;
        match rx.try_recv() {
            Ok(load) => {
                self.ready = None;
                if self.phase == Phase::Starting {
                    self.phase = Phase::Ready;
                }
                Some(load)
            }
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => {
                self.ready = None;
                None
            }
        }
    }

    /// Asks the worker to drain and stop.
    pub fn request_stop(&mut self) {
        self.phase = Phase::Stopping;
        let _ = self.stop.send(true);
    }

    /// Whether the task has returned.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// The task's outcome (call once it is finished, or to wait for it).
    pub async fn join(self) -> Result<(), LaunchError> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(LaunchError(format!("worker task failed: {e}"))),
        }
    }

    /// Counts as serving capacity (not draining).
    pub fn is_active(&self) -> bool {
        self.phase != Phase::Stopping
    }
}
