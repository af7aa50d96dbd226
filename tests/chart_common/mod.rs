//! Support of the Helm chart tests (`tests/chart_*.rs`): the chart's files, Helm's way of
//! merging values, the values schema and the CRD schema as validators, the `--help` text of
//! each role of the built binary, and rendering the chart with Helm when Helm is at hand.
//!
//! Rendering needs Helm's template engine, which is Go: the tests use the `helm` binary when
//! it is on PATH, else a Python interpreter with the `helm_python` module (PyPI package
//! `helm-python-sdk`, Helm's Go SDK behind a C ABI) named by `TIDAL_HELM_PYTHON` or found as
//! `python3`; without either, the rendering tests print why they skipped.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

/// Release name and namespace the tests render with.
pub const RELEASE: &str = "tidal";
/// Namespace the tests render into.
pub const NAMESPACE: &str = "tidal";

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `charts/tidal`.
pub fn chart_dir() -> PathBuf {
    root().join("charts/tidal")
}

/// Text of a file under the chart.
pub fn chart_file(rel: &str) -> String {
    let path = chart_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A YAML file of the chart as JSON values.
pub fn chart_yaml(rel: &str) -> Value {
    serde_yaml::from_str(&chart_file(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

/// A YAML text as a JSON value.
pub fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not YAML: {e}\n{text}"))
}

/// Helm's coalescing of user values over the chart's defaults: maps merge key by key, any
/// other value replaces the default, and `null` deletes the key.
pub fn coalesce(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(slot) = b.get_mut(k) {
                    if slot.is_object() && v.is_object() {
                        coalesce(slot, v);
                    } else {
                        *slot = v.clone();
                    }
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// values.yaml with `over` coalesced on top (what an install uses).
pub fn merged_values(over: &Value) -> Value {
    let mut v = chart_yaml("values.yaml");
    coalesce(&mut v, over);
    v
}

/// The chart's `values.schema.json` as a validator.
pub fn values_validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(&chart_file("values.schema.json"))
        .expect("values.schema.json is JSON");
    jsonschema::validator_for(&schema).expect("values.schema.json is a valid JSON Schema")
}

/// Every schema error of `values`, as `message at /path`.
pub fn schema_errors(validator: &jsonschema::Validator, values: &Value) -> Vec<String> {
    validator
        .iter_errors(values)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// The Model CRD's OpenAPI schema as a validator.
pub fn model_validator() -> jsonschema::Validator {
    let crd = serde_json::to_value(tidal_crds::crd()).expect("CRD serialises");
    let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    jsonschema::validator_for(&schema).expect("the CRD schema is a valid JSON Schema")
}

/// The built `tidal` binary.
pub fn tidal_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tidal")
}

/// `tidal <role> --help`, run once per role.
pub fn help(role: &str) -> String {
    static CACHE: OnceLock<Mutex<BTreeMap<String, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(text) = cache.get(role) {
        return text.clone();
    }
    let out = Command::new(tidal_bin())
        .args([role, "--help"])
        .output()
        .expect("running tidal");
    assert!(
        out.status.success(),
        "`tidal {role} --help` failed (is `{role}` a subcommand?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    cache.insert(role.to_string(), text.clone());
    text
}

/// Whether `flag` (e.g. `--listen`) is an option in `help_text`: it appears followed by
/// neither a letter, a digit nor `-` (so `--listen` does not match `--listen-foo`).
pub fn has_flag(help_text: &str, flag: &str) -> bool {
    help_text.match_indices(flag).any(|(i, _)| {
        let before_ok = help_text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || c == ',');
        let after_ok = help_text[i + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        before_ok && after_ok
    })
}

/// Whether some option in `help_text` reads environment variable `name` (clap prints
/// `[env: NAME=value]` or `[env: NAME]`).
pub fn has_env(help_text: &str, name: &str) -> bool {
    help_text.contains(&format!("[env: {name}=")) || help_text.contains(&format!("[env: {name}]"))
}

/// How the chart can be rendered here.
#[derive(Debug, Clone)]
pub enum Renderer {
    /// The `helm` binary.
    Helm(PathBuf),
    /// A Python interpreter that imports `helm_python`.
    Python(PathBuf),
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn python_has_helm(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import helm_python"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The renderer to use, or why there is none.
pub fn renderer() -> Result<Renderer, String> {
    if let Some(helm) = on_path("helm") {
        return Ok(Renderer::Helm(helm));
    }
    let candidates: Vec<PathBuf> = match std::env::var_os("TIDAL_HELM_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => on_path("python3").into_iter().collect(),
    };
    for python in candidates {
        if python_has_helm(&python) {
            return Ok(Renderer::Python(python));
        }
    }
    Err(
        "neither `helm` on PATH nor a Python with `helm_python` (pip install \
         helm-python-sdk; point TIDAL_HELM_PYTHON at its interpreter)"
            .into(),
    )
}

const PY_RENDER: &str = r#"
import json, sys
import helm_python as helm
chart, values_path, name, namespace = sys.argv[1:5]
with open(values_path) as f:
    values = json.load(f)
try:
    with helm.Chart.load(chart) as c:
        out = c.render(values, name=name, namespace=namespace, is_install=True)
except helm.HelmError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
json.dump(out, sys.stdout)
"#;

/// One rendered manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// `kind`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// The object.
    pub doc: Value,
}

fn split_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d)
                .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{text}"));
            serde_json::to_value(v).expect("YAML maps to JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Renders the chart with `values` (user values, coalesced over values.yaml by Helm).
/// `Err` carries Helm's message (bad values, a failed `required`, a template error).
pub fn render(r: &Renderer, values: &Value) -> Result<Vec<Manifest>, String> {
    render_release(r, values, RELEASE, NAMESPACE)
}

/// [`render`] as release `release` in namespace `namespace` (what `helm install -n` would
/// name things; the tests that install into a cluster use their own namespace).
pub fn render_release(
    r: &Renderer,
    values: &Value,
    release: &str,
    namespace: &str,
) -> Result<Vec<Manifest>, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let values_path = dir.path().join("values.json");
    // JSON is YAML, so both renderers read the same file.
    std::fs::write(&values_path, serde_json::to_vec(values).expect("values")).expect("write");
    let chart = chart_dir();
    let out = match r {
        Renderer::Helm(helm) => Command::new(helm)
            .arg("template")
            .arg(release)
            .arg(&chart)
            .args(["--namespace", namespace, "--values"])
            .arg(&values_path)
            .output(),
        Renderer::Python(py) => Command::new(py)
            .arg("-c")
            .arg(PY_RENDER)
            .arg(&chart)
            .arg(&values_path)
            .args([release, namespace])
            .output(),
    }
    .expect("running the renderer");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let docs = match r {
        Renderer::Helm(_) => split_docs(&stdout),
        Renderer::Python(_) => {
            let files: BTreeMap<String, String> =
                serde_json::from_str(&stdout).expect("renderer output is JSON");
            files
                .iter()
                .filter(|(path, _)| !path.ends_with("NOTES.txt"))
                .flat_map(|(_, text)| split_docs(text))
                .collect()
        }
    };
    Ok(docs
        .into_iter()
        .map(|doc| Manifest {
            kind: doc["kind"].as_str().unwrap_or_default().to_string(),
            name: doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            doc,
        })
        .collect())
}

/// The renderer, or `None` after printing why the calling test skips.
pub fn renderer_or_skip(test: &str) -> Option<Renderer> {
    match renderer() {
        Ok(r) => Some(r),
        Err(why) => {
            crate::skip::skip(&format!("{test}: cannot render the chart: {why}"));
            None
        }
    }
}

/// The values files under `charts/tidal/ci/` the tests install with.
pub fn ci_values(name: &str) -> Value {
    chart_yaml(&format!("ci/{name}"))
}
