//! The ledger: one type over PostgreSQL (production) and SQLite (embedded default).
//!
//! Why an enum of pools rather than sqlx's `Any` driver: `Any` erases types to a small common
//! set and gives up each driver's own connect options (SQLite WAL, busy timeout, foreign
//! keys) and typed migrations; with an enum, each arm is ordinary statically typed sqlx code.
//! The SQL is the same for both (`$n` placeholders, `ON CONFLICT`, `RETURNING`), so one body
//! is expanded for each arm by the `on_pool!` macro instead of being written twice.
//!
//! Migrations are embedded (`migrations/postgres`, `migrations/sqlite`) and run by
//! [`Ledger::connect`]; the same folders work with the `sqlx migrate` CLI.

mod catalogue;
mod holds;
mod ingest;
mod limits;
mod reads;
mod reprice;
mod tenants;

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::{Error, Result};

pub use catalogue::FleetUsage;
pub use holds::{decide_hold, HoldOutcome, HoldRequest};
pub use ingest::IngestOutcome;
pub use limits::{RateLimits, TenantSettings};
pub use reprice::RepriceOutcome;
pub use tenants::{BudgetStatus, IssuedKey, KeyInfo, Tenant};

/// Embedded PostgreSQL migrations.
pub static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");
/// Embedded SQLite migrations.
pub static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// Expands `$body` once per backend with `$pool` bound to the pool and `$db` naming the
/// sqlx database type, so the same SQL code is type-checked against both drivers.
macro_rules! on_pool {
    ($ledger:expr, |$pool:ident, $db:ident| $body:block) => {
        match &$ledger.backend {
            $crate::ledger::Backend::Postgres($pool) => {
                #[allow(dead_code)]
                type $db = sqlx::Postgres;
                $body
            }
            $crate::ledger::Backend::Sqlite($pool) => {
                #[allow(dead_code)]
                type $db = sqlx::Sqlite;
                $body
            }
        }
    };
}
pub(crate) use on_pool;

#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// Which database a [`Ledger`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
}

/// Connection settings beyond the URL.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Pool size.
    pub max_connections: u32,
    /// How long to wait for a connection before failing (the caller retries).
    pub acquire_timeout: Duration,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// The billing ledger. Cheap to clone (it holds a connection pool).
#[derive(Clone, Debug)]
pub struct Ledger {
    pub(crate) backend: Backend,
}

impl Ledger {
    /// Connects to `postgres://...` or `sqlite:...` and runs the embedded migrations.
    pub async fn connect(url: &str) -> Result<Ledger> {
        Ledger::connect_with(url, &LedgerOptions::default()).await
    }

    /// [`Ledger::connect`] with explicit options.
    pub async fn connect_with(url: &str, opts: &LedgerOptions) -> Result<Ledger> {
        let ledger = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(opts.max_connections)
                .acquire_timeout(opts.acquire_timeout)
                .connect(url)
                .await?;
            Ledger {
                backend: Backend::Postgres(pool),
            }
        } else if url.starts_with("sqlite:") {
            let connect = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10));
            let pool = SqlitePoolOptions::new()
                .max_connections(opts.max_connections.min(4))
                .acquire_timeout(opts.acquire_timeout)
                .connect_with(connect)
                .await?;
            Ledger {
                backend: Backend::Sqlite(pool),
            }
        } else {
            return Err(Error::UnsupportedUrl(url.to_string()));
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// Runs the embedded migrations (idempotent; done by `connect`).
    pub async fn migrate(&self) -> Result<()> {
        match &self.backend {
            Backend::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await?,
            Backend::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await?,
        }
        Ok(())
    }

    /// The backend in use.
    pub fn backend_kind(&self) -> BackendKind {
        match &self.backend {
            Backend::Postgres(_) => BackendKind::Postgres,
            Backend::Sqlite(_) => BackendKind::Sqlite,
        }
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        match &self.backend {
            Backend::Postgres(pool) => pool.close().await,
            Backend::Sqlite(pool) => pool.close().await,
        }
    }
}

/// Microseconds since the epoch, the stored form of an instant.
pub(crate) fn to_us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// Inverse of [`to_us`].
pub(crate) fn from_us(us: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| Error::Corrupt(format!("instant {us} out of range")))
}

/// A stored day; both backends decode `DATE`/`TEXT` into `NaiveDate`.
pub(crate) type Day = NaiveDate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_through_micros() {
        let t = DateTime::from_timestamp_micros(1_795_000_000_123_456).unwrap();
        assert_eq!(from_us(to_us(t)).unwrap(), t);
        assert!(from_us(i64::MAX).is_err());
    }
}
