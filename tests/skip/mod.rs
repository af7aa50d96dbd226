//! Runtime skips that count as skipped: a test that cannot do its work here (no cluster, no
//! Helm, no PostgreSQL binaries) returns early, which cargo counts as passed, so it also
//! records itself in `$TIDAL_SKIP_LOG`; `scripts/test.sh` moves those from passed to skipped
//! in the closing line.

#![allow(dead_code)]

use std::io::Write;

/// Records that the calling test skips, and why (the test's name is its thread's name).
pub fn skip(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    eprintln!("skipped {test}: {why}");
    if let Some(path) = std::env::var_os("TIDAL_SKIP_LOG") {
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(log, "{test}: {why}");
        }
    }
}
