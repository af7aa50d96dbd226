//! Shared test helpers: a scratch database per test on real PostgreSQL or SQLite.
#![allow(dead_code)]

use std::time::Duration;

use sqlx::Connection;
use tidal_billing::scratch::{ScratchDb, DEFAULT_SERVER_URL};
use tidal_billing::{Ledger, LedgerOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    Sqlite,
}

/// PostgreSQL server URL for tests (`TIDAL_TEST_DATABASE_URL`).
pub fn server_url() -> String {
    std::env::var("TIDAL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.to_string())
}

/// Makes sure the shared PostgreSQL server answers, starting its cluster if it is down.
pub async fn ensure_postgres() {
    let url = format!("{}/postgres", server_url());
    for attempt in 0..30 {
        if let Ok(c) = sqlx::PgConnection::connect(&url).await {
            let _ = c.close().await;
            return;
        }
        if attempt == 0 {
            if let Ok(entries) = std::fs::read_dir("/etc/postgresql") {
                for version in entries.flatten() {
                    let v = version.file_name().to_string_lossy().to_string();
                    let _ = std::process::Command::new("pg_ctlcluster")
                        .args(["--skip-systemctl-redirect", &v, "main", "start"])
                        .status();
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("PostgreSQL at {url} is not reachable");
}

/// A scratch database of `kind` and a ledger connected to it (migrated).
pub async fn ledger(kind: Kind, tag: &str) -> (ScratchDb, Ledger) {
    let db = match kind {
        Kind::Postgres => {
            ensure_postgres().await;
            ScratchDb::postgres(&server_url(), tag).await.unwrap()
        }
        Kind::Sqlite => ScratchDb::sqlite(tag),
    };
    let ledger = Ledger::connect_with(&db.url, &LedgerOptions::default())
        .await
        .unwrap();
    (db, ledger)
}

/// Declares `<name>_postgres` and `<name>_sqlite` tests running `async fn <name>(Kind)`.
#[macro_export]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Kind::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Kind::Sqlite).await
                }
            )*
        }
    };
}
