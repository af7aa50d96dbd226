//! The first tenant, its API key and the admin token of a local platform.
//!
//! The ledger stores keys only as hashes, so the secrets `tidal up` prints are kept in
//! `credentials.json` in the data directory (mode 0600) and reused by later starts as long
//! as the ledger still accepts them.

use std::path::{Path, PathBuf};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tidal_billing::{Ledger, Role};

/// Tenant created on first start.
pub const LOCAL_TENANT: &str = "local";

/// What a newcomer needs to call the local platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub tenant: String,
    pub api_key: String,
    pub admin_token: String,
}

/// Why credentials could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{context}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0} is not valid credentials JSON: {1}")]
    Corrupt(PathBuf, serde_json::Error),
    #[error("ledger")]
    Ledger(#[from] tidal_billing::Error),
}

/// Path of the credentials file in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("credentials.json")
}

/// Loads the saved credentials (`None` when there are none yet).
pub fn load(data_dir: &Path) -> Result<Option<Credentials>, CredentialsError> {
    let file = path(data_dir);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| CredentialsError::Corrupt(file, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CredentialsError::Io {
            context: format!("reading {}", file.display()),
            source,
        }),
    }
}

/// The saved credentials if the ledger still accepts their key, else a new tenant key (and,
/// on first start, a new admin token), saved for next time. Returns them and whether they
/// are new.
pub async fn ensure(
    data_dir: &Path,
    ledger: &Ledger,
) -> Result<(Credentials, bool), CredentialsError> {
    let saved = load(data_dir)?;
    if let Some(c) = &saved {
        if ledger.authenticate(&c.api_key).await?.is_some() {
            return Ok((c.clone(), false));
        }
        tracing::warn!("the saved API key is not in this ledger (new ledger?); issuing a new one");
    }
    let now = Utc::now();
    ledger
        .create_tenant(LOCAL_TENANT, "Local developer", now)
        .await?;
    let key = ledger.issue_key(LOCAL_TENANT, Role::Tenant, now).await?;
    let admin_token = saved
        .map(|c| c.admin_token)
        .unwrap_or_else(|| tidal_billing::keys::generate().secret);
    let creds = Credentials {
        tenant: LOCAL_TENANT.to_owned(),
        api_key: key.secret,
        admin_token,
    };
    save(data_dir, &creds)?;
    Ok((creds, true))
}

fn save(data_dir: &Path, creds: &Credentials) -> Result<(), CredentialsError> {
    let file = path(data_dir);
    let io = |context: String| move |source| CredentialsError::Io { context, source };
    std::fs::create_dir_all(data_dir).map_err(io(format!("creating {}", data_dir.display())))?;
    let tmp = file.with_extension("json.tmp");
    let json = serde_json::to_vec_pretty(creds).unwrap_or_default();
    write_private(&tmp, &json).map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &file).map_err(io(format!("writing {}", file.display())))
}

/// Writes a file only its owner can read (it holds secrets).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ledger(dir: &Path) -> Ledger {
        let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite").display());
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        ledger
    }

    #[tokio::test]
    async fn first_start_creates_later_starts_reuse() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger(dir.path()).await;
        let (first, new) = ensure(dir.path(), &ledger).await.unwrap();
        assert!(new);
        let who = ledger.authenticate(&first.api_key).await.unwrap().unwrap();
        assert_eq!(who.tenant, LOCAL_TENANT);
        let (second, new) = ensure(dir.path(), &ledger).await.unwrap();
        assert!(!new);
        assert_eq!(second, first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[tokio::test]
    async fn a_key_the_ledger_no_longer_knows_is_replaced_and_the_admin_token_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = ensure(dir.path(), &ledger(dir.path()).await).await.unwrap();
        let other = tempfile::tempdir().unwrap();
        let fresh_ledger = ledger(other.path()).await;
        let (second, new) = ensure(dir.path(), &fresh_ledger).await.unwrap();
        assert!(new);
        assert_ne!(second.api_key, first.api_key);
        assert_eq!(second.admin_token, first.admin_token);
        assert!(fresh_ledger
            .authenticate(&second.api_key)
            .await
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn corrupt_credentials_are_an_error_not_silently_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), b"{not json").unwrap();
        let err = ensure(dir.path(), &ledger(dir.path()).await)
            .await
            .unwrap_err();
        assert!(matches!(err, CredentialsError::Corrupt(..)), "{err}");
    }
}
