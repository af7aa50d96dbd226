//! Shared test helpers: locating the shared folder and the default model.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// `$TIDAL_SHARED_DIR`, else `<crate>/../../shared` (CI clones the repo beside `shared/`).
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("TIDAL_SHARED_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// The default model's path, fetched (and verified) by `scripts/fetch-model.sh`.
pub fn default_model() -> PathBuf {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-model.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("run scripts/fetch-model.sh");
    assert!(
        out.status.success(),
        "fetch-model.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}
