//! The crate's typed errors.

/// Everything the ledger, reports and the consumer can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database failed or is unreachable (transient: retry).
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Running the embedded migrations failed.
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The URL names no supported backend.
    #[error("unsupported database url {0:?} (expected postgres://... or sqlite:...)")]
    UnsupportedUrl(String),
    /// The caller may not read or change this tenant's data.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// A named thing does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The input was malformed.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// What was to be created exists already.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A price version exists at that time with different prices (versions are immutable).
    #[error("price conflict: {0}")]
    PriceConflict(String),
    /// An invoice cannot be issued while usage in it has no price.
    #[error("usage without a price: {0}")]
    Unpriced(String),
    /// The month is not over yet, so its invoice cannot be issued.
    #[error("month {0} is not closed")]
    MonthNotClosed(String),
    /// An amount did not fit its integer type.
    #[error("arithmetic overflow in {0}")]
    Overflow(&'static str),
    /// A stored value could not be interpreted.
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
    /// The usage stream's broker failed (benchmarks; the consumer retries instead).
    #[error("queue: {0}")]
    Queue(#[from] tidal_queue::QueueError),
    /// CSV rendering failed.
    #[error("csv: {0}")]
    Csv(String),
}

impl Error {
    /// Whether retrying the same operation later can succeed (database or network trouble).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Database(_))
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
