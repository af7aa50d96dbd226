//! schemathesis (PyPI, the version `scripts/schemathesis-venv.sh` pins) against a gateway
//! and its own `/openapi.json`: requests generated from the document, valid and invalid,
//! under every check schemathesis has (`--checks all`): no 5xx; statuses, content types,
//! headers and bodies as documented; what the document forbids refused and what it allows
//! accepted; auth enforced; other methods refused with `Allow`. Bounded and reproducible: a
//! fixed seed, a bounded number of examples per operation, no example database, no stateful phase. Skipped
//! (with a message) only when Python or pip cannot provide schemathesis.

mod common;
#[path = "../../tests/skip/mod.rs"]
mod skip;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Test cases per operation and phase: about 2,000 requests, 30 s on two cores.
const MAX_EXAMPLES: &str = "100";

/// The run must finish well within this.
const LIMIT: Duration = Duration::from_secs(300);

/// The `schemathesis` executable: `$TIDAL_SCHEMATHESIS` (set by `scripts/test.sh`), else the
/// one the venv script provides (installing it when missing).
fn schemathesis() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TIDAL_SCHEMATHESIS") {
        return Some(PathBuf::from(path));
    }
    let script = format!("{ROOT}/../scripts/schemathesis-venv.sh");
    let out = match std::process::Command::new("bash").arg(&script).output() {
        Ok(out) => out,
        Err(e) => {
            skip::skip(&format!("cannot run {script}: {e}"));
            return None;
        }
    };
    if !out.status.success() {
        skip::skip(&format!(
            "cannot install schemathesis with pip:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Auth for both security schemes, and a key id that exists for
/// `DELETE /v1/admin/keys/{key_id}`.
fn config_toml(key: &str, revocable: &str) -> String {
    format!(
        r#"[auth.openapi.apiKey]
bearer = "{key}"

[auth.openapi.adminToken]
bearer = "{ADMIN}"

[[operations]]
include-operation-id = "revoke_key"
parameters = {{ key_id = "{revocable}" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing() {
    let Some(st) = schemathesis() else { return };
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let dir = std::env::temp_dir().join(format!("tidal-st-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    // A key for the revocation tests to revoke (not the one the run authenticates with).
    let spare = h
        .ledger
        .issue_key("beta", tidal_billing::Role::Tenant, chrono::Utc::now())
        .await
        .unwrap();
    let config = dir.join("schemathesis.toml");
    std::fs::write(&config, config_toml(&h.key, &spare.key_id)).unwrap();
    let started = Instant::now();
    let run = tokio::process::Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{}/openapi.json", h.base)])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", "20261203"])
        .args(["--generation-database", "none"])
        // One worker: hypothesis's lambda descriptions are not thread-safe on CPython 3.11
        // (`SystemError: AST constructor recursion depth mismatch`).
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .arg("--no-color")
        .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
        .env("PYTHONPATH", format!("{ROOT}/tests"))
        .env("TIDAL_ST_MODEL", MODEL)
        .current_dir(&dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT, run)
        .await
        .expect("schemathesis finished in time")
        .expect("schemathesis ran");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("schemathesis took {:.1} s", took.as_secs_f64());
    assert!(
        out.status.success(),
        "schemathesis found defects (see its report above)"
    );
    w.stop().await;
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
