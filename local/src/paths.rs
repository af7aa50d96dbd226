//! Where a local platform keeps its files.

use std::path::PathBuf;

/// `$TIDAL_DATA_DIR`, else `$XDG_DATA_HOME/tidal`, else `~/.local/share/tidal`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TIDAL_DATA_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("tidal")
}

/// URL of the SQLite ledger in `data_dir` (created on first use).
pub fn local_ledger_url(data_dir: &std::path::Path) -> String {
    format!(
        "sqlite://{}?mode=rwc",
        data_dir.join("ledger.sqlite").display()
    )
}
