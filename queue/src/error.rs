//! Typed errors of every broker operation.

use uuid::Uuid;

/// What a broker operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The Redis server could not be reached or answered with an error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A record could not be encoded or decoded.
    #[error("codec: {0}")]
    Codec(#[from] serde_json::Error),
    /// A stored record is missing a field or holds a value of the wrong shape.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// Which record.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// A response event's seq is not the next one of its stream: someone else already wrote
    /// that seq (another worker owns the request now) or a token would be skipped.
    #[error("response {id}: event seq {seq} is not the next one (last written {last})")]
    SeqConflict {
        /// The request.
        id: Uuid,
        /// The seq that was offered.
        seq: u64,
        /// The last seq in the stream.
        last: u64,
    },
    /// The response stream already ended with `done` or `error`.
    #[error("response {id}: stream already finished")]
    ResponseFinished {
        /// The request.
        id: Uuid,
    },
    /// The job entry is no longer pending for this consumer (taken over, withdrawn or acked).
    #[error("job entry {entry} of model {model} is not owned by consumer {consumer}")]
    NotOwner {
        /// The model whose jobs stream holds the entry.
        model: String,
        /// The stream entry id.
        entry: String,
        /// The consumer that tried to act on it.
        consumer: String,
    },
    /// An argument the caller passed is out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl QueueError {
    /// Whether the same call may succeed if tried again: Redis unreachable, restarting,
    /// loading its data or busy; not a refusal, a bad reply or a fencing answer.
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::Redis(e) => !matches!(e.retry_method(), redis::RetryMethod::NoRetry),
            _ => false,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
