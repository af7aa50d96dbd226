//! The Helm chart's plain files, without Helm: every YAML file parses, the chart's CRD is the
//! generated one, values.schema.json accepts the values an install would use and rejects bad
//! ones, the example Model passes the CRD's schema, and the Grafana dashboard parses and
//! queries only metrics the code exports.

mod chart_common;
mod skip;

use chart_common::*;
use serde_json::{json, Value};

#[test]
fn every_plain_yaml_file_of_the_chart_parses() {
    let mut files = vec![
        "Chart.yaml".to_string(),
        "values.yaml".to_string(),
        "crds/model.yaml".to_string(),
        "crds/modelpool.yaml".to_string(),
    ];
    for dir in ["ci"] {
        for entry in std::fs::read_dir(chart_dir().join(dir)).expect("ci/") {
            let name = entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("utf-8");
            if name.ends_with(".yaml") {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(files.len() >= 5, "expected the ci/ values files: {files:?}");
    for f in &files {
        let v = chart_yaml(f);
        assert!(v.is_object(), "{f} is not a YAML mapping");
    }
}

#[test]
fn chart_metadata_matches_the_binary() {
    let chart = chart_yaml("Chart.yaml");
    assert_eq!(chart["apiVersion"], "v2", "Helm 3 chart");
    assert_eq!(chart["name"], "tidal");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml appVersion must be the tidal crate's version (the default image tag)"
    );
    assert!(chart["version"].as_str().is_some_and(|v| !v.is_empty()));
}

#[test]
fn the_chart_ships_the_generated_crd() {
    let shipped = chart_file("crds/model.yaml");
    let committed =
        std::fs::read_to_string(root().join("crds/model.yaml")).expect("crds/model.yaml");
    assert!(
        shipped == committed,
        "charts/tidal/crds/model.yaml differs from crds/model.yaml: \
         run `cp crds/model.yaml charts/tidal/crds/model.yaml`"
    );
    let generated = tidal_crds::crd_yaml().expect("CRD renders");
    assert!(
        shipped == generated,
        "charts/tidal/crds/model.yaml is not what `tidal crd` prints: \
         run `tidal crd > crds/model.yaml && cp crds/model.yaml charts/tidal/crds/`"
    );
    let pool = chart_file("crds/modelpool.yaml");
    assert!(
        pool == tidal_crds::pool_crd_yaml().expect("ModelPool CRD renders"),
        "charts/tidal/crds/modelpool.yaml is not what `tidal crd --pool` prints: \
         run `tidal crd --pool > crds/modelpool.yaml && cp crds/modelpool.yaml charts/tidal/crds/`"
    );
    // Helm's crds/ directory takes plain manifests only: no template syntax.
    assert!(
        !shipped.contains("{{"),
        "crds/ files are not templated by Helm"
    );
}

#[test]
fn values_for_an_install_pass_the_schema() {
    let v = values_validator();
    for file in ["minimal-values.yaml", "full-values.yaml"] {
        let values = merged_values(&ci_values(file));
        let errors = schema_errors(&v, &values);
        assert!(errors.is_empty(), "ci/{file}: {errors:#?}");
    }
}

#[test]
fn the_defaults_alone_lack_only_the_connection_urls() {
    // values.yaml cannot name the operator's PostgreSQL and Redis: an install without them
    // must fail, and for that reason only.
    let v = values_validator();
    let errors = schema_errors(&v, &chart_yaml("values.yaml"));
    assert!(!errors.is_empty(), "values.yaml alone must not install");
    for e in &errors {
        assert!(
            e.contains("/postgresql") || e.contains("/redis"),
            "unexpected schema error in values.yaml: {e}"
        );
    }
}

/// (what is wrong, user values) pairs an install must refuse.
fn bad_values() -> Vec<(&'static str, Value)> {
    let pg = json!({"url": "postgres://u:p@db:5432/tidal"});
    let rd = json!({"url": "redis://redis:6379/0"});
    let with = |extra: Value| {
        let mut v = json!({"postgresql": pg.clone(), "redis": rd.clone()});
        coalesce(&mut v, &extra);
        v
    };
    vec![
        ("no redis", json!({"postgresql": pg.clone()})),
        ("no postgresql", json!({"redis": rd.clone()})),
        (
            "a MySQL ledger",
            with(json!({"postgresql": {"url": "mysql://db/tidal"}})),
        ),
        (
            "a SQLite ledger (read-only root filesystem, several replicas)",
            with(json!({"postgresql": {"url": "sqlite:/data/ledger.db"}})),
        ),
        (
            "rediss:// (no TLS in the binary)",
            with(json!({"redis": {"url": "rediss://redis:6380"}})),
        ),
        (
            "both a URL and an existing Secret",
            with(json!({"postgresql": {"existingSecret": "db"}})),
        ),
        (
            "pull policy out of the enum",
            with(json!({"image": {"pullPolicy": "Sometimes"}})),
        ),
        (
            "service type out of the enum",
            with(json!({"gateway": {"service": {"type": "ExternalName"}}})),
        ),
        (
            "replicas as a string",
            with(json!({"controller": {"replicas": "two"}})),
        ),
        (
            "port out of range",
            with(json!({"gateway": {"port": 70000}})),
        ),
        ("zero tick", with(json!({"controller": {"tickSeconds": 0}}))),
        (
            "zero pool tick",
            with(json!({"controller": {"poolTickSeconds": 0}})),
        ),
        ("a misspelt key", with(json!({"gateway": {"replica": 3}}))),
        ("an unknown top-level key", with(json!({"gatway": {}}))),
        (
            "a key prefix with a space",
            with(json!({"keyPrefix": "my prefix:"})),
        ),
        (
            "an empty image repository",
            with(json!({"image": {"repository": ""}})),
        ),
        (
            "an ingress path without a leading slash",
            with(json!({"gateway": {"ingress": {"enabled": true, "hosts": [
                {"host": "api.example.com", "paths": [{"path": "v1", "pathType": "Prefix"}]}
            ]}}})),
        ),
        (
            "an admin token given twice",
            with(json!({"gateway": {"adminToken": {"value": "x", "existingSecret": "s"}}})),
        ),
        (
            "an upper-case example Model name",
            with(json!({"exampleModel": {"name": "SmolLM"}})),
        ),
    ]
}

#[test]
fn bad_values_are_rejected_by_the_schema() {
    let v = values_validator();
    for (what, over) in bad_values() {
        let values = merged_values(&over);
        assert!(
            !schema_errors(&v, &values).is_empty(),
            "the schema accepted {what}: {over}"
        );
    }
}

/// The example Model as the template writes it: values' spec, `runtime.image` defaulting to
/// the chart's image.
fn example_model(values: &Value) -> Value {
    let mut spec = values["exampleModel"]["spec"].clone();
    if spec["runtime"]["image"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        let tag = values["image"]["tag"]
            .as_str()
            .filter(|t| !t.is_empty())
            .unwrap_or(env!("CARGO_PKG_VERSION"));
        let image = format!(
            "{}:{tag}",
            values["image"]["repository"].as_str().unwrap_or_default()
        );
        spec["runtime"]["image"] = json!(image);
    }
    json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": values["exampleModel"]["name"], "namespace": NAMESPACE},
        "spec": spec,
    })
}

#[test]
fn the_example_model_passes_the_crd_schema_and_the_controller_checks() {
    let values = merged_values(&ci_values("minimal-values.yaml"));
    let model = example_model(&values);
    let errors: Vec<String> = model_validator()
        .iter_errors(&model)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "example Model: {errors:#?}");
    let typed: tidal_crds::Model = serde_json::from_value(model).expect("a Model");
    typed
        .spec
        .validate(tidal_crds::ColdStart::ASSUMED)
        .expect("the controller accepts the spec");
    let source = typed.spec.source().expect("a source");
    assert!(
        source
            .download_url()
            .is_some_and(|u| u.starts_with("https://huggingface.co/")),
        "the example downloads from the Hub"
    );
    assert_eq!(
        typed.spec.runtime.image,
        format!("tidal:{}", env!("CARGO_PKG_VERSION"))
    );
}

/// Metric names a PromQL expression selects: `tidal_...` identifiers followed by `{` (the
/// dashboard writes every selector with braces, so label names such as `tidal_model` in
/// `by (...)` clauses are not taken for metrics). Histogram series suffixes are removed.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(off) = expr[i..].find("tidal_") {
        let start = i + off;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary && bytes.get(end) == Some(&b'{') {
            let name = &expr[start..end];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            out.push(base.to_string());
        }
        i = end.max(start + 1);
    }
    out
}

/// Every `.rs` file of the workspace's crates (not tests, not the build output).
fn crate_sources() -> String {
    fn walk(dir: &std::path::Path, out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !["target", "tests", "benches", ".git", "charts"].contains(&name.as_str()) {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let mut all = String::new();
    walk(&root(), &mut all);
    all
}

#[test]
fn the_dashboard_parses_and_queries_only_exported_metrics() {
    let dash: Value =
        serde_json::from_str(&chart_file("dashboards/tidal.json")).expect("dashboard JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let sources = crate_sources();
    let mut titles = Vec::new();
    let mut used = std::collections::BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().expect("panel title").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("target expr");
            let names = metrics_in(expr);
            assert!(
                !names.is_empty() || expr.starts_with("sum by (capacity) (up{"),
                "panel {title:?}: no tidal metric in {expr}"
            );
            used.extend(names);
        }
        titles.push(title.to_lowercase());
    }
    for name in &used {
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "the dashboard queries {name}, which no crate exports"
        );
    }
    for topic in [
        "queue backlog",
        "replicas by capacity type",
        "time to first token",
        "tokens per second",
        "cost per million tokens",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel about {topic}: {titles:?}"
        );
    }
    // The model variable reads a label the controller exports.
    let var = &dash["templating"]["list"][1];
    assert_eq!(var["name"], "model");
    assert!(var["definition"]
        .as_str()
        .is_some_and(|d| d.contains("tidal_autoscaler_desired_replicas")));
}

#[test]
fn the_metric_extractor_reads_selectors_only() {
    assert_eq!(
        metrics_in("sum by (tidal_model) (rate(tidal_prompt_tokens_total{job=\"x\"}[1m]))"),
        vec!["tidal_prompt_tokens_total"]
    );
    assert_eq!(
        metrics_in(
            "histogram_quantile(0.5, sum by (le) (rate(tidal_x_seconds_bucket{a=\"b\"}[5m])))"
        ),
        vec!["tidal_x_seconds"]
    );
    assert!(metrics_in("up{tidal_model=~\"$model\"}").is_empty());
}
