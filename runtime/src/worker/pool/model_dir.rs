//! The node-local model directory of a pool worker (`--model-dir`): where a model id's
//! GGUF file is, how big it is, and whether it is the file the operator meant (SHA-256).
//!
//! Two layouts: a manifest `models.json` mapping ids to files,
//! `{"models": {"ns/a": {"path": "a.gguf", "sha256": "<hex>"}}}` (relative paths are
//! under the directory; `sha256` is optional), or, without one, `{id}.gguf` under the
//! directory (an id `ns/name` is the file `ns/name.gguf`). Models pinned on the command line
//! ([`PinnedModel`], `--pool-model`) come before either: a pinned id is always its pinned
//! file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::pinned::PinnedModel;
use super::PoolError;

/// The manifest's file name inside the model directory.
pub const MANIFEST: &str = "models.json";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    models: BTreeMap<String, ManifestEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestEntry {
    path: PathBuf,
    #[serde(default)]
    sha256: Option<String>,
}

/// One model file found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// The model id.
    pub model: String,
    /// Its GGUF file.
    pub path: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// The SHA-256 the file must have (lower-case hex), from `--pool-model-sha256` or the
    /// manifest; `None`: not checked.
    pub sha256: Option<String>,
}

/// A model directory, read afresh on every look (files may be added while the worker runs),
/// its pinned models, and the files whose SHA-256 was already checked.
#[derive(Debug)]
pub struct ModelDir {
    root: PathBuf,
    /// Models pinned to files, by id (paths already joined to `root`).
    pinned: BTreeMap<String, PinnedModel>,
    /// Files checked, with the size and modification time they had: a file replaced since
    /// is checked again.
    verified: Mutex<BTreeMap<PathBuf, (u64, Option<SystemTime>)>>,
}

impl ModelDir {
    /// The directory `root` (which must exist).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, PoolError> {
        Self::with_pinned(root, Vec::new())
    }

    /// The directory `root` (which must exist) with models pinned to files, which take
    /// precedence over its manifest and layout (a relative path is under `root`). An id
    /// pinned twice, or a bad id or checksum, is [`PoolError::Config`] or
    /// [`PoolError::BadModelId`]; a pinned file that does not exist is not an error until a
    /// load needs it.
    pub fn with_pinned(
        root: impl Into<PathBuf>,
        pinned: Vec<PinnedModel>,
    ) -> Result<Self, PoolError> {
        let root = root.into();
        if !root.is_dir() {
            return Err(PoolError::ModelDir(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        let mut by_id = BTreeMap::new();
        for mut p in pinned {
            check_id(&p.model)?;
            if let Some(sum) = &mut p.sha256 {
                check_sha256(sum).map_err(|why| {
                    PoolError::Config(format!("the sha256 of pinned model {}: {why}", p.model))
                })?;
                *sum = sum.to_ascii_lowercase();
            }
            p.path = root.join(&p.path); // an absolute path stays as it is
            if let Some(first) = by_id.insert(p.model.clone(), p) {
                return Err(PoolError::Config(format!(
                    "model {:?} is pinned twice",
                    first.model
                )));
            }
        }
        let dir = ModelDir {
            root,
            pinned: by_id,
            verified: Mutex::new(BTreeMap::new()),
        };
        dir.manifest()?; // a broken manifest is refused at start, not at the first load
        Ok(dir)
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn manifest(&self) -> Result<Option<Manifest>, PoolError> {
        let path = self.root.join(MANIFEST);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(PoolError::ModelDir(format!(
                    "reading {}: {e}",
                    path.display()
                )))
            }
        };
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| PoolError::ModelDir(format!("{}: {e}", path.display())))?;
        for (id, entry) in &manifest.models {
            check_id(id)?;
            if let Some(sum) = &entry.sha256 {
                check_sha256(sum).map_err(|why| {
                    PoolError::ModelDir(format!("{}: the sha256 of {id}: {why}", path.display()))
                })?;
            }
        }
        Ok(Some(manifest))
    }

    /// Where model `id`'s file is: its pinned file, else the manifest's, else `{id}.gguf`.
    /// [`PoolError::NotInModelDir`] when it has none, [`PoolError::FileUnreadable`] when
    /// the file pinned or named by the manifest cannot be read.
    pub fn resolve(&self, id: &str) -> Result<ModelEntry, PoolError> {
        check_id(id)?;
        let (path, sha256, named) = match self.pinned.get(id) {
            Some(p) => (p.path.clone(), p.sha256.clone(), true),
            None => match self.manifest()? {
                Some(m) => match m.models.get(id) {
                    Some(e) => (self.root.join(&e.path), e.sha256.clone(), true),
                    None => return Err(PoolError::NotInModelDir(id.to_owned())),
                },
                None => (self.root.join(format!("{id}.gguf")), None, false),
            },
        };
        let meta = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => m,
            // A file named for the model that is not there is the operator's to fix: say which.
            Ok(_) if named => return Err(unreadable(id, path, "it is not a file".into())),
            Err(e) if named => return Err(unreadable(id, path, e.to_string())),
            _ => return Err(PoolError::NotInModelDir(id.to_owned())),
        };
        Ok(ModelEntry {
            model: id.to_owned(),
            path,
            bytes: meta.len(),
            sha256: sha256.map(|s| s.to_ascii_lowercase()),
        })
    }

    /// Every model the directory holds whose file exists, by id: the pinned ones and the
    /// manifest's, else the `.gguf` files at the top and one directory down.
    pub fn list(&self) -> Result<Vec<ModelEntry>, PoolError> {
        let mut ids: BTreeSet<String> = match self.manifest()? {
            Some(m) => m.models.into_keys().collect(),
            None => self.scan()?.into_iter().collect(),
        };
        ids.extend(self.pinned.keys().cloned());
        Ok(ids.iter().filter_map(|id| self.resolve(id).ok()).collect())
    }

    fn scan(&self) -> Result<Vec<String>, PoolError> {
        let mut ids = Vec::new();
        let read = |dir: &Path| {
            std::fs::read_dir(dir)
                .map_err(|e| PoolError::ModelDir(format!("reading {}: {e}", dir.display())))
        };
        for entry in read(&self.root)?.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                for inner in read(&path)?.flatten() {
                    let file = inner.file_name().to_string_lossy().into_owned();
                    if let Some(stem) = file.strip_suffix(".gguf") {
                        ids.push(format!("{name}/{stem}"));
                    }
                }
            } else if let Some(stem) = name.strip_suffix(".gguf") {
                ids.push(stem.to_owned());
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Checks `entry`'s file against its expected SHA-256, once per file version (a file
    /// without one in the manifest is not checked). Reads the whole file: call it from a
    /// blocking thread. [`PoolError::Checksum`] when it differs.
    pub fn verify(&self, entry: &ModelEntry) -> Result<(), PoolError> {
        let Some(want) = &entry.sha256 else {
            return Ok(());
        };
        let version = file_version(&entry.path)?;
        let checked = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if checked.get(&entry.path) == Some(&version) {
            return Ok(());
        }
        drop(checked);
        let got = sha256_file(&entry.path)?;
        if &got != want {
            return Err(PoolError::Checksum {
                model: entry.model.clone(),
                path: entry.path.clone(),
                want: want.clone(),
                got,
            });
        }
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(entry.path.clone(), version);
        Ok(())
    }
}

fn file_version(path: &Path) -> Result<(u64, Option<SystemTime>), PoolError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    Ok((meta.len(), meta.modified().ok()))
}

fn unreadable(model: &str, path: PathBuf, reason: String) -> PoolError {
    PoolError::FileUnreadable {
        model: model.to_owned(),
        path,
        reason,
    }
}

fn io_error(path: &Path, e: std::io::Error) -> PoolError {
    PoolError::ModelDir(format!("reading {}: {e}", path.display()))
}

/// The SHA-256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String, PoolError> {
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| io_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A SHA-256 as 64 hex digits (either case); why not otherwise.
pub(super) fn check_sha256(sum: &str) -> Result<(), String> {
    if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("not 64 hex digits".into());
    }
    Ok(())
}

/// A model id usable as a path under the directory: relative, no `.` or `..` parts.
pub(super) fn check_id(id: &str) -> Result<(), PoolError> {
    let bad = |why: &str| Err(PoolError::BadModelId(id.to_owned(), why.to_owned()));
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.contains('\\') || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("it holds a backslash, whitespace or control characters");
    }
    // Split by hand: `Path::components` drops interior `.` parts and empty ones.
    if id
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("it must be a relative path without `.` or `..` parts");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn files_by_name_and_by_manifest() {
        let d = dir();
        std::fs::write(d.path().join("a.gguf"), b"aaaa").unwrap();
        std::fs::create_dir(d.path().join("ns")).unwrap();
        std::fs::write(d.path().join("ns/b.gguf"), b"bb").unwrap();
        let md = ModelDir::open(d.path()).unwrap();
        let ids: Vec<_> = md.list().unwrap().into_iter().map(|e| e.model).collect();
        assert_eq!(ids, ["a", "ns/b"]);
        assert_eq!(md.resolve("ns/b").unwrap().bytes, 2);
        assert!(matches!(md.resolve("c"), Err(PoolError::NotInModelDir(_))));
        for bad in ["../a", "/etc/passwd", "a/./b", "", "a b"] {
            assert!(
                matches!(md.resolve(bad), Err(PoolError::BadModelId(..))),
                "{bad}"
            );
        }
        let sum = sha256_file(&d.path().join("a.gguf")).unwrap();
        std::fs::write(
            d.path().join(MANIFEST),
            format!(r#"{{"models": {{"x/y": {{"path": "a.gguf", "sha256": "{sum}"}}}}}}"#),
        )
        .unwrap();
        let e = md.resolve("x/y").unwrap();
        assert_eq!((e.bytes, e.sha256.as_deref()), (4, Some(sum.as_str())));
        md.verify(&e).unwrap();
        // the manifest is the whole list
        assert!(matches!(md.resolve("a"), Err(PoolError::NotInModelDir(_))));
    }

    #[test]
    fn a_file_that_does_not_match_its_sum_is_refused() {
        let d = dir();
        std::fs::write(d.path().join("a.gguf"), b"aaaa").unwrap();
        let wrong = "0".repeat(64);
        std::fs::write(
            d.path().join(MANIFEST),
            format!(r#"{{"models": {{"a": {{"path": "a.gguf", "sha256": "{wrong}"}}}}}}"#),
        )
        .unwrap();
        let md = ModelDir::open(d.path()).unwrap();
        let e = md.verify(&md.resolve("a").unwrap()).unwrap_err();
        assert!(e.to_string().contains("sha256"), "{e}");
        std::fs::write(
            d.path().join(MANIFEST),
            r#"{"models": {"a": {"path": "a.gguf", "sha256": "xyz"}}}"#,
        )
        .unwrap();
        assert!(ModelDir::open(d.path()).is_err());
    }

    fn pin(model: &str, path: impl Into<PathBuf>, sha256: Option<String>) -> PinnedModel {
        PinnedModel {
            model: model.into(),
            path: path.into(),
            sha256,
        }
    }

    #[test]
    fn pinned_models_come_before_the_manifest_and_the_layout() {
        let d = dir();
        let elsewhere = dir();
        std::fs::write(d.path().join("a.gguf"), b"aaaa").unwrap();
        std::fs::create_dir(d.path().join("ns")).unwrap();
        std::fs::write(d.path().join("ns/p.gguf"), b"pp").unwrap();
        std::fs::write(d.path().join("ns/q.gguf"), b"q").unwrap();
        let abs = elsewhere.path().join("other.gguf");
        std::fs::write(&abs, b"abcdef").unwrap();
        let md = ModelDir::with_pinned(
            d.path(),
            vec![
                // relative to the directory, and over the layout's `a.gguf`
                pin("a", "ns/p.gguf", None),
                // absolute, outside the directory
                pin("ns/x", &abs, None),
            ],
        )
        .unwrap();
        let a = md.resolve("a").unwrap();
        assert_eq!((a.path, a.bytes), (d.path().join("ns/p.gguf"), 2));
        assert_eq!(md.resolve("ns/x").unwrap().path, abs);
        // The layout still serves the ids not pinned; pinned ones are listed with it.
        assert_eq!(md.resolve("ns/q").unwrap().bytes, 1);
        let listed: Vec<(String, u64)> = md
            .list()
            .unwrap()
            .into_iter()
            .map(|e| (e.model, e.bytes))
            .collect();
        let want = [("a", 2), ("ns/p", 2), ("ns/q", 1), ("ns/x", 6)];
        let want: Vec<(String, u64)> = want.iter().map(|(m, b)| ((*m).into(), *b)).collect();
        assert_eq!(listed, want);

        // Over a manifest too, which otherwise is the whole list.
        std::fs::write(
            d.path().join(MANIFEST),
            r#"{"models": {"a": {"path": "a.gguf"}, "m": {"path": "ns/q.gguf"}}}"#,
        )
        .unwrap();
        assert_eq!(md.resolve("a").unwrap().bytes, 2);
        let ids: Vec<String> = md.list().unwrap().into_iter().map(|e| e.model).collect();
        assert_eq!(ids, ["a", "m", "ns/x"]);
        assert!(matches!(
            md.resolve("ns/q"),
            Err(PoolError::NotInModelDir(_))
        ));
    }

    #[test]
    fn a_missing_pinned_file_is_not_listed_and_names_its_path() {
        let d = dir();
        let md = ModelDir::with_pinned(d.path(), vec![pin("ns/a", "gone.gguf", None)]).unwrap();
        assert!(md.list().unwrap().is_empty());
        match md.resolve("ns/a") {
            Err(PoolError::FileUnreadable { model, path, .. }) => {
                assert_eq!((model.as_str(), path), ("ns/a", d.path().join("gone.gguf")));
            }
            other => panic!("{other:?}"),
        }
        // It is listed once it appears (as is `gone`, by the layout).
        std::fs::write(d.path().join("gone.gguf"), b"g").unwrap();
        let ids: Vec<String> = md.list().unwrap().into_iter().map(|e| e.model).collect();
        assert_eq!(ids, ["gone", "ns/a"]);
    }

    #[test]
    fn a_pinned_sum_is_checked_before_the_first_load() {
        let d = dir();
        std::fs::write(d.path().join("a.gguf"), b"aaaa").unwrap();
        std::fs::write(d.path().join("b.gguf"), b"bbbb").unwrap();
        let right = sha256_file(&d.path().join("a.gguf")).unwrap();
        let md = ModelDir::with_pinned(
            d.path(),
            vec![
                pin("ns/a", "a.gguf", Some(right.to_ascii_uppercase())),
                pin("ns/b", "b.gguf", Some(right.clone())),
            ],
        )
        .unwrap();
        let a = md.resolve("ns/a").unwrap();
        assert_eq!(a.sha256.as_deref(), Some(right.as_str()));
        md.verify(&a).unwrap();
        let b = md.resolve("ns/b").unwrap();
        match md.verify(&b) {
            Err(PoolError::Checksum { model, want, .. }) => {
                assert_eq!((model.as_str(), want), ("ns/b", right.clone()));
            }
            other => panic!("{other:?}"),
        }
        // The heartbeat's cache lists the expected sums (none for the layout's `a` and `b`).
        let sums: Vec<(String, Option<String>)> = md
            .list()
            .unwrap()
            .into_iter()
            .map(|e| (e.model, e.sha256))
            .collect();
        let want = [
            ("a", None),
            ("b", None),
            ("ns/a", Some(&right)),
            ("ns/b", Some(&right)),
        ];
        let want: Vec<(String, Option<String>)> = want
            .iter()
            .map(|(m, s)| ((*m).to_owned(), s.cloned()))
            .collect();
        assert_eq!(sums, want);
    }

    #[test]
    fn pinning_mistakes_are_refused_at_start() {
        let d = dir();
        let twice = vec![pin("ns/a", "a.gguf", None), pin("ns/a", "b.gguf", None)];
        let e = ModelDir::with_pinned(d.path(), twice).unwrap_err();
        assert!(e.to_string().contains("pinned twice"), "{e}");
        let bad_sum = vec![pin("ns/a", "a.gguf", Some("12".into()))];
        let e = ModelDir::with_pinned(d.path(), bad_sum).unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
        let bad_id = vec![pin("../a", "a.gguf", None)];
        let e = ModelDir::with_pinned(d.path(), bad_id).unwrap_err();
        assert!(matches!(e, PoolError::BadModelId(..)), "{e}");
    }
}
