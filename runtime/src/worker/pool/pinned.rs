//! Models pinned to files on the command line (`--pool-model ID=PATH`, with
//! `--pool-model-sha256 ID=HEX`): the Kubernetes controller names each model's file and
//! checksum this way, so a pinned entry takes precedence over the model directory's
//! manifest and its `{id}.gguf` layout.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::model_dir::{check_id, check_sha256};
use super::PoolError;

/// A model id pinned to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedModel {
    /// The model id (`ns/name`).
    pub model: String,
    /// Its GGUF file: absolute, or relative to the model directory.
    pub path: PathBuf,
    /// The file's expected SHA-256 (lower-case hex), checked before the first load.
    pub sha256: Option<String>,
}

impl PinnedModel {
    /// The entries of `--pool-model ID=PATH` flags (`paths`) with the checksums of
    /// `--pool-model-sha256 ID=HEX` flags (`sums`). Refused: a value without `=`, a bad id,
    /// an id given twice in either list, a checksum that is not 64 hex digits, and a
    /// checksum for an id that has no path.
    pub fn from_flags(paths: &[String], sums: &[String]) -> Result<Vec<Self>, PoolError> {
        let mut pinned: BTreeMap<String, PinnedModel> = BTreeMap::new();
        for value in paths {
            let (id, path) = split(value, "--pool-model", "ID=PATH")?;
            if path.is_empty() {
                return Err(config(format!("--pool-model {value}: the path is empty")));
            }
            let entry = PinnedModel {
                model: id.to_owned(),
                path: PathBuf::from(path),
                sha256: None,
            };
            if pinned.insert(id.to_owned(), entry).is_some() {
                return Err(config(format!("--pool-model: model {id:?} is given twice")));
            }
        }
        let mut summed = BTreeMap::new();
        for value in sums {
            let (id, sum) = split(value, "--pool-model-sha256", "ID=HEX")?;
            check_sha256(sum).map_err(|why| config(format!("--pool-model-sha256 {id}: {why}")))?;
            if summed.insert(id, ()).is_some() {
                return Err(config(format!(
                    "--pool-model-sha256: model {id:?} is given twice"
                )));
            }
            let Some(entry) = pinned.get_mut(id) else {
                return Err(config(format!(
                    "--pool-model-sha256 {id}: no --pool-model {id}=PATH names its file"
                )));
            };
            entry.sha256 = Some(sum.to_ascii_lowercase());
        }
        Ok(pinned.into_values().collect())
    }
}

/// `ID=VALUE` with a valid id.
fn split<'a>(value: &'a str, flag: &str, form: &str) -> Result<(&'a str, &'a str), PoolError> {
    let (id, rest) = value
        .split_once('=')
        .ok_or_else(|| config(format!("{flag} {value}: expected {form}")))?;
    check_id(id)?;
    Ok((id, rest))
}

fn config(why: String) -> PoolError {
    PoolError::Config(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn flags_pair_paths_with_their_sums() {
        let sum = "AB".repeat(32);
        let pinned = PinnedModel::from_flags(
            &strings(&["ns/b=/abs/b.gguf", "ns/a=rel/a=1.gguf"]),
            &strings(&[&format!("ns/b={sum}")]),
        )
        .unwrap();
        assert_eq!(
            pinned,
            [
                PinnedModel {
                    model: "ns/a".into(),
                    path: "rel/a=1.gguf".into(),
                    sha256: None,
                },
                PinnedModel {
                    model: "ns/b".into(),
                    path: "/abs/b.gguf".into(),
                    sha256: Some("ab".repeat(32)),
                },
            ]
        );
        assert!(PinnedModel::from_flags(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn mistakes_are_refused_at_start() {
        let sum = "0".repeat(64);
        let cases: [(&[&str], &[&str], &str); 8] = [
            (&["ns/a=a.gguf", "ns/a=b.gguf"], &[], "given twice"),
            (&["ns/a=a.gguf"], &["ns/b=SUM"], "no --pool-model ns/b=PATH"),
            (&["ns/a=a.gguf"], &["ns/a=SUM", "ns/a=SUM"], "given twice"),
            (&["ns/a=a.gguf"], &["ns/a=xyz"], "64 hex digits"),
            (&["ns/a"], &[], "expected ID=PATH"),
            (&["ns/a="], &[], "the path is empty"),
            (&["../a=a.gguf"], &[], "bad model id"),
            (&["ns/a=a.gguf"], &["ns/a"], "expected ID=HEX"),
        ];
        for (paths, sums, why) in cases {
            let sums: Vec<String> = sums.iter().map(|s| s.replace("SUM", &sum)).collect();
            let e = PinnedModel::from_flags(&strings(paths), &sums).unwrap_err();
            assert!(e.to_string().contains(why), "{paths:?} {sums:?}: {e}");
        }
    }
}
