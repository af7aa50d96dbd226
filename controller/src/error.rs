//! The controller's errors.

use thiserror::Error;

/// Why a reconcile failed (it is retried after a back-off).
#[derive(Debug, Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The queue broker failed.
    #[error("queue: {0}")]
    Queue(#[from] tidal_queue::QueueError),
    /// The ledger failed.
    #[error("ledger: {0}")]
    Ledger(#[from] tidal_billing::Error),
    /// The finaliser is waiting for in-flight jobs to finish or be re-enqueued.
    #[error("waiting for {in_flight} in-flight jobs of {model} to drain")]
    Draining {
        /// Model id.
        model: String,
        /// Jobs still claimed by workers.
        in_flight: u64,
    },
    /// The object has no namespace or name.
    #[error("the Model has no {0}")]
    Incomplete(&'static str),
    /// The Model is no longer in the API (a reconcile that started before its deletion
    /// finished): not a failure, nothing to retry.
    #[error("the Model is gone")]
    Gone,
    /// Adding or removing the finaliser failed.
    #[error("finaliser: {0}")]
    Finalizer(String),
}

/// Results of the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;
