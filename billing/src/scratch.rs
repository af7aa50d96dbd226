//! Throwaway databases for tests and benchmarks: `tidal_test_<uuid>` on a PostgreSQL server
//! (dropped again afterwards), or a temporary SQLite file.

use std::path::PathBuf;

use sqlx::{Connection, PgConnection};

use crate::error::{Error, Result};

/// Server URL used by tests when `TIDAL_TEST_DATABASE_URL` is unset.
pub const DEFAULT_SERVER_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// A scratch database; call [`ScratchDb::drop_db`] when done (dropping it without that
/// removes it from a helper thread as a fallback).
#[derive(Debug)]
pub struct ScratchDb {
    /// URL of the scratch database.
    pub url: String,
    server: Option<(String, String)>,
    file: Option<PathBuf>,
}

fn split_server(url: &str) -> &str {
    // Strip any "/database" after the authority.
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

impl ScratchDb {
    /// Creates `tidal_<tag>_<uuid>` on the PostgreSQL server of `server_url` (any database
    /// part of the URL is ignored; administrative commands go to database `postgres`).
    pub async fn postgres(server_url: &str, tag: &str) -> Result<ScratchDb> {
        let server = split_server(server_url).to_string();
        let name = format!("tidal_{tag}_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(&format!("{server}/postgres")).await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(ScratchDb {
            url: format!("{server}/{name}"),
            server: Some((server, name)),
            file: None,
        })
    }

    /// A fresh SQLite file in the temp directory.
    pub fn sqlite(tag: &str) -> ScratchDb {
        let path =
            std::env::temp_dir().join(format!("tidal_{tag}_{}.db", uuid::Uuid::now_v7().simple()));
        ScratchDb {
            url: format!("sqlite:{}", path.display()),
            server: None,
            file: Some(path),
        }
    }

    /// The database name (PostgreSQL) or file path (SQLite).
    pub fn name(&self) -> String {
        match (&self.server, &self.file) {
            (Some((_, name)), _) => name.clone(),
            (_, Some(path)) => path.display().to_string(),
            _ => String::new(),
        }
    }

    /// Drops the database (terminating its connections) or deletes the file.
    pub async fn drop_db(mut self) -> Result<()> {
        self.cleanup().await
    }

    async fn cleanup(&mut self) -> Result<()> {
        if let Some((server, name)) = self.server.take() {
            let mut admin = PgConnection::connect(&format!("{server}/postgres")).await?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&mut admin)
                .await?;
            admin.close().await?;
        }
        if let Some(path) = self.file.take() {
            for suffix in ["", "-wal", "-shm"] {
                let p = PathBuf::from(format!("{}{suffix}", path.display()));
                if p.exists() {
                    std::fs::remove_file(&p)
                        .map_err(|e| Error::Invalid(format!("remove {}: {e}", p.display())))?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        if self.server.is_none() && self.file.is_none() {
            return;
        }
        let mut me = ScratchDb {
            url: self.url.clone(),
            server: self.server.take(),
            file: self.file.take(),
        };
        // Async cleanup from a sync Drop: a helper thread with its own runtime.
        let handle = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                if let Err(e) = rt.block_on(me.cleanup()) {
                    tracing::warn!(error = %e, "scratch database cleanup failed");
                }
            }
        });
        let _ = handle.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_part_of_urls() {
        assert_eq!(
            split_server("postgres://postgres@127.0.0.1:5432"),
            "postgres://postgres@127.0.0.1:5432"
        );
        assert_eq!(
            split_server("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432"
        );
        assert_eq!(
            split_server("postgres://u@h/db?sslmode=disable"),
            "postgres://u@h"
        );
    }
}
