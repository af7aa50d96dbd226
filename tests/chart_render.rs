//! The chart as Helm renders it (skipped with a message when Helm cannot run here: see
//! tests/chart_common): Helm refuses bad values; every rendered object of a core kind
//! survives a round trip through its Kubernetes type (a misspelt or misplaced field is
//! dropped by the round trip and fails the test); the workloads run non-root on a read-only
//! root filesystem with probes and resources; the rendered command lines are the binary's;
//! Services, PDBs and the HPA select what exists; the controller's RBAC is what it needs;
//! the example Model passes the CRD's schema.

mod chart_common;
mod skip;

use std::collections::{BTreeMap, BTreeSet};

use chart_common::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::apps::v1::Deployment;
use tidal_controller::k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use tidal_controller::k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use tidal_controller::k8s_openapi::api::networking::v1::Ingress;
use tidal_controller::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use tidal_controller::k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding,
};

fn render_ok(r: &Renderer, values: &Value, what: &str) -> Vec<Manifest> {
    render(r, values).unwrap_or_else(|e| panic!("{what}: Helm refused to render: {e}"))
}

fn variants() -> Vec<(&'static str, Value)> {
    let minimal = ci_values("minimal-values.yaml");
    let mut other_ns = minimal.clone();
    coalesce(
        &mut other_ns,
        &json!({"controller": {"watchNamespace": "models"}, "exampleModel": {"enabled": true},
                "workerPodMonitor": {"enabled": true}}),
    );
    let mut single = minimal.clone();
    coalesce(
        &mut single,
        &json!({"controller": {"replicas": 1}, "gateway": {"replicas": 1}, "billing": {"replicas": 1}}),
    );
    vec![
        ("ci/minimal-values.yaml", minimal),
        ("ci/full-values.yaml", ci_values("full-values.yaml")),
        ("watching another namespace", other_ns),
        ("one replica each", single),
    ]
}

fn roundtrip<T: DeserializeOwned + Serialize>(m: &Manifest) {
    let typed: T = serde_json::from_value(m.doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: not a valid {}: {e}", m.kind, m.name, m.kind));
    let back = serde_json::to_value(&typed).expect("serialises");
    assert_eq!(
        back, m.doc,
        "{} {}: a field is misplaced or misspelt (the typed round trip dropped or changed it)",
        m.kind, m.name
    );
}

fn check_types(manifests: &[Manifest]) {
    for m in manifests {
        match m.kind.as_str() {
            "Deployment" => roundtrip::<Deployment>(m),
            "Service" => roundtrip::<Service>(m),
            "ServiceAccount" => roundtrip::<ServiceAccount>(m),
            "Secret" => roundtrip::<Secret>(m),
            "ConfigMap" => roundtrip::<ConfigMap>(m),
            "Role" => roundtrip::<Role>(m),
            "RoleBinding" => roundtrip::<RoleBinding>(m),
            "ClusterRole" => roundtrip::<ClusterRole>(m),
            "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(m),
            "PodDisruptionBudget" => roundtrip::<PodDisruptionBudget>(m),
            "HorizontalPodAutoscaler" => roundtrip::<HorizontalPodAutoscaler>(m),
            "Ingress" => roundtrip::<Ingress>(m),
            "Model" => {
                let errors: Vec<String> = model_validator()
                    .iter_errors(&m.doc)
                    .map(|e| format!("{e} at {}", e.instance_path()))
                    .collect();
                assert!(errors.is_empty(), "Model {}: {errors:#?}", m.name);
                let model: tidal_crds::Model =
                    serde_json::from_value(m.doc.clone()).expect("a Model");
                model
                    .spec
                    .validate(tidal_crds::ColdStart::ASSUMED)
                    .expect("the controller accepts it");
            }
            "ServiceMonitor" | "PodMonitor" => {
                assert_eq!(m.doc["apiVersion"], "monitoring.coreos.com/v1");
            }
            other => panic!("unexpected kind {other} ({})", m.name),
        }
    }
}

fn of_kind<'a>(manifests: &'a [Manifest], kind: &str) -> Vec<&'a Manifest> {
    manifests.iter().filter(|m| m.kind == kind).collect()
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

fn check_workloads(manifests: &[Manifest], values: &Value) {
    let secrets: BTreeMap<String, BTreeSet<String>> = of_kind(manifests, "Secret")
        .into_iter()
        .map(|s| {
            let keys = s.doc["stringData"]
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            (s.name.clone(), keys)
        })
        .collect();
    let existing: BTreeSet<&str> = [
        values["postgresql"]["existingSecret"].as_str(),
        values["redis"]["existingSecret"].as_str(),
        values["gateway"]["adminToken"]["existingSecret"].as_str(),
    ]
    .into_iter()
    .flatten()
    .filter(|s| !s.is_empty())
    .collect();
    let accounts: BTreeSet<&str> = of_kind(manifests, "ServiceAccount")
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let deployments = of_kind(manifests, "Deployment");
    assert_eq!(deployments.len(), 3, "controller, gateway and billing");
    for d in deployments {
        let pod = &d.doc["spec"]["template"]["spec"];
        let what = format!("Deployment {}", d.name);
        assert!(
            labels_match(
                &d.doc["spec"]["selector"]["matchLabels"],
                &d.doc["spec"]["template"]["metadata"]["labels"]
            ),
            "{what}: selector does not match its pods"
        );
        let sa = pod["serviceAccountName"]
            .as_str()
            .expect("a service account");
        assert!(
            accounts.contains(sa),
            "{what}: ServiceAccount {sa} is not rendered"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{what}"
        );
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{what}");
        let c = &containers[0];
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "{what}: cpu request"
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{what}: memory limit"
        );
        let ports: BTreeSet<&str> = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str())
            .collect();
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], "/health", "{what}: {probe}");
            let port = get["port"].as_str().expect("named probe port");
            assert!(
                ports.contains(port),
                "{what}: {probe} port {port} is not a container port"
            );
        }
        // Writable /tmp on the read-only root.
        assert!(c["volumeMounts"]
            .as_array()
            .is_some_and(|v| v.iter().any(|m| m["mountPath"] == "/tmp")));
        // Rendered command line against the binary.
        assert_eq!(c["command"], json!(["tidal"]), "{what}");
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string argument"))
            .collect();
        let role = args[0];
        let help_text = help(role);
        for a in &args[1..] {
            let flag = a.split('=').next().unwrap_or(a);
            assert!(
                has_flag(&help_text, flag),
                "{what}: `tidal {role}` has no option {flag}"
            );
        }
        // The listen address's port is the container port the probes use.
        for a in &args[1..] {
            if let Some(addr) = a
                .strip_prefix("--listen=")
                .or_else(|| a.strip_prefix("--metrics-listen="))
            {
                let port: i64 = addr
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("port");
                assert!(
                    c["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|p| p["containerPort"] == port),
                    "{what}: listens on {port}, which is not a container port"
                );
                assert!(
                    addr.starts_with("0.0.0.0:"),
                    "{what}: must listen on all interfaces"
                );
            }
        }
        // Secrets the pod reads exist (rendered here, or named by the operator).
        for env in c["env"].as_array().into_iter().flatten() {
            let r = &env["valueFrom"]["secretKeyRef"];
            if r.is_null() {
                continue;
            }
            let name = r["name"].as_str().expect("secret name");
            let key = r["key"].as_str().expect("secret key");
            if !existing.contains(name) {
                assert!(
                    secrets.get(name).is_some_and(|keys| keys.contains(key)),
                    "{what}: env {} reads {name}/{key}, which the chart does not create",
                    env["name"]
                );
            }
        }
        let token = pod["automountServiceAccountToken"].as_bool();
        assert_eq!(
            token,
            Some(role == "controller"),
            "{what}: only the controller talks to the API"
        );
    }
}

fn check_selection(manifests: &[Manifest]) {
    let pods: Vec<(String, Value, Value)> = of_kind(manifests, "Deployment")
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                d.doc["spec"]["template"]["metadata"]["labels"].clone(),
                d.doc["spec"]["template"]["spec"]["containers"][0]["ports"].clone(),
            )
        })
        .collect();
    for s in of_kind(manifests, "Service") {
        let matched: Vec<&(String, Value, Value)> = pods
            .iter()
            .filter(|(_, labels, _)| labels_match(&s.doc["spec"]["selector"], labels))
            .collect();
        assert_eq!(
            matched.len(),
            1,
            "Service {} selects one Deployment",
            s.name
        );
        for p in s.doc["spec"]["ports"].as_array().expect("ports") {
            let target = p["targetPort"].as_str().expect("named target port");
            assert!(
                matched[0]
                    .2
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|cp| cp["name"] == target),
                "Service {}: target port {target} is not a port of {}",
                s.name,
                matched[0].0
            );
        }
    }
    for pdb in of_kind(manifests, "PodDisruptionBudget") {
        let sel = &pdb.doc["spec"]["selector"]["matchLabels"];
        let n = pods.iter().filter(|(_, l, _)| labels_match(sel, l)).count();
        assert_eq!(
            n, 1,
            "PodDisruptionBudget {} selects one Deployment",
            pdb.name
        );
    }
    for hpa in of_kind(manifests, "HorizontalPodAutoscaler") {
        let target = hpa.doc["spec"]["scaleTargetRef"]["name"]
            .as_str()
            .expect("target");
        assert!(
            pods.iter().any(|(n, _, _)| n == target),
            "HPA targets {target}"
        );
    }
    for ing in of_kind(manifests, "Ingress") {
        let services: BTreeSet<&str> = of_kind(manifests, "Service")
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        for rule in ing.doc["spec"]["rules"].as_array().expect("rules") {
            for p in rule["http"]["paths"].as_array().expect("paths") {
                let svc = p["backend"]["service"]["name"].as_str().expect("backend");
                assert!(services.contains(svc), "Ingress backend {svc}");
            }
        }
    }
}

/// `(apiGroup, resource) → verbs` of a rule list.
fn grants(rules: &Value) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in rules.as_array().into_iter().flatten() {
        for g in r["apiGroups"].as_array().into_iter().flatten() {
            for res in r["resources"].as_array().into_iter().flatten() {
                let entry = out
                    .entry((
                        g.as_str().unwrap_or_default().into(),
                        res.as_str().unwrap_or_default().into(),
                    ))
                    .or_default();
                for v in r["verbs"].as_array().into_iter().flatten() {
                    entry.insert(v.as_str().unwrap_or_default().into());
                }
            }
        }
    }
    out
}

fn set(verbs: &[&str]) -> BTreeSet<String> {
    verbs.iter().map(|v| v.to_string()).collect()
}

fn check_rbac(manifests: &[Manifest], cluster_wide: bool, watch_ns: &str) {
    let controller_sa = format!("{RELEASE}-controller");
    let mut all: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut cluster: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for kind in ["Role", "ClusterRole"] {
        for role in of_kind(manifests, kind) {
            let binding_kind = if kind == "Role" {
                "RoleBinding"
            } else {
                "ClusterRoleBinding"
            };
            let bound = of_kind(manifests, binding_kind).iter().any(|b| {
                b.doc["roleRef"]["name"] == role.name.as_str()
                    && b.doc["roleRef"]["kind"] == kind
                    && b.doc["subjects"][0]["name"] == controller_sa.as_str()
                    && b.doc["subjects"][0]["namespace"] == NAMESPACE
                    && b.doc["metadata"]["namespace"] == role.doc["metadata"]["namespace"]
            });
            assert!(
                bound,
                "{kind} {} is bound to the controller's ServiceAccount",
                role.name
            );
            if kind == "Role" && role.doc["rules"].to_string().contains("tidal.dev") {
                assert_eq!(
                    role.doc["metadata"]["namespace"], watch_ns,
                    "Role {}",
                    role.name
                );
            }
            for (k, v) in grants(&role.doc["rules"]) {
                all.entry(k.clone()).or_default().extend(v.clone());
                if kind == "ClusterRole" {
                    cluster.entry(k).or_default().extend(v);
                }
            }
        }
    }
    let want = [
        (("tidal.dev", "models"), set(&["list", "watch", "patch"])),
        (("tidal.dev", "models/status"), set(&["patch"])),
        (("tidal.dev", "modelpools"), set(&["list", "watch"])),
        (("tidal.dev", "modelpools/status"), set(&["patch"])),
        (
            ("apps", "deployments"),
            set(&["list", "watch", "create", "patch", "delete"]),
        ),
        (("", "pods"), set(&["list", "watch"])),
        (("", "nodes"), set(&["list", "watch"])),
        (("events.k8s.io", "events"), set(&["create", "patch"])),
        (
            ("coordination.k8s.io", "leases"),
            set(&["create", "get", "update"]),
        ),
    ];
    let want: BTreeMap<(String, String), BTreeSet<String>> = want
        .into_iter()
        .map(|((g, r), v)| ((g.to_string(), r.to_string()), v))
        .collect();
    assert_eq!(all, want, "the controller's permissions");
    let cluster_scoped: BTreeSet<&str> = cluster.keys().map(|(_, r)| r.as_str()).collect();
    let expected: BTreeSet<&str> = if cluster_wide {
        [
            "models",
            "models/status",
            "modelpools",
            "modelpools/status",
            "deployments",
            "pods",
            "nodes",
            "events",
        ]
        .into()
    } else {
        ["nodes"].into()
    };
    assert_eq!(cluster_scoped, expected, "what is granted cluster-wide");
}

#[test]
fn helm_renders_valid_objects_for_every_variant() {
    let Some(r) = renderer_or_skip("helm_renders_valid_objects_for_every_variant") else {
        return;
    };
    for (what, values) in variants() {
        let manifests = render_ok(&r, &values, what);
        let merged = merged_values(&values);
        check_types(&manifests);
        check_workloads(&manifests, &merged);
        check_selection(&manifests);
        let cluster_wide = merged["controller"]["clusterWide"]
            .as_bool()
            .unwrap_or(false);
        let watch_ns = merged["controller"]["watchNamespace"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(NAMESPACE);
        check_rbac(&manifests, cluster_wide, watch_ns);
        let names: BTreeSet<(String, String)> = manifests
            .iter()
            .map(|m| (m.kind.clone(), m.name.clone()))
            .collect();
        assert_eq!(
            names.len(),
            manifests.len(),
            "{what}: two objects share a kind and name"
        );
    }
}

#[test]
fn optional_parts_follow_their_switches() {
    let Some(r) = renderer_or_skip("optional_parts_follow_their_switches") else {
        return;
    };
    let kinds = |m: &[Manifest]| -> BTreeSet<String> { m.iter().map(|x| x.kind.clone()).collect() };
    let minimal = render_ok(&r, &ci_values("minimal-values.yaml"), "minimal");
    let k = kinds(&minimal);
    for absent in [
        "Ingress",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "PodMonitor",
        "ConfigMap",
        "Model",
    ] {
        assert!(!k.contains(absent), "minimal values render a {absent}");
    }
    assert_eq!(of_kind(&minimal, "PodDisruptionBudget").len(), 3);
    let full = render_ok(&r, &ci_values("full-values.yaml"), "full");
    let k = kinds(&full);
    for present in [
        "Ingress",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "PodMonitor",
        "ConfigMap",
        "Model",
    ] {
        assert!(k.contains(present), "full values render no {present}");
    }
    // The HPA owns the gateway's replica count.
    let gw = full
        .iter()
        .find(|m| m.kind == "Deployment" && m.name.ends_with("-gateway"))
        .expect("gateway");
    assert!(gw.doc["spec"]["replicas"].is_null());
    // The dashboard ConfigMap carries the dashboard file verbatim.
    let cm = of_kind(&full, "ConfigMap")[0];
    let dash: Value = serde_json::from_str(cm.doc["data"]["tidal.json"].as_str().expect("data"))
        .expect("dashboard JSON");
    let file: Value = serde_json::from_str(&chart_file("dashboards/tidal.json")).expect("file");
    assert_eq!(dash, file);
    // No PDB over a single pod (it would block node drains).
    let mut single = ci_values("minimal-values.yaml");
    coalesce(
        &mut single,
        &json!({"controller": {"replicas": 1}, "gateway": {"replicas": 1}, "billing": {"replicas": 1}}),
    );
    assert!(of_kind(&render_ok(&r, &single, "single"), "PodDisruptionBudget").is_empty());
    // A chart Secret only when a value needs one.
    let mut existing =
        json!({"postgresql": {"existingSecret": "db"}, "redis": {"existingSecret": "redis"}});
    assert!(of_kind(&render_ok(&r, &existing, "existing secrets"), "Secret").is_empty());
    coalesce(&mut existing, &json!({"controller": {"enabled": false}}));
    let no_controller = render_ok(&r, &existing, "no controller");
    assert!(of_kind(&no_controller, "ClusterRole").is_empty());
    assert_eq!(of_kind(&no_controller, "Deployment").len(), 2);
}

#[test]
fn helm_refuses_bad_values() {
    let Some(r) = renderer_or_skip("helm_refuses_bad_values") else {
        return;
    };
    let err = render(&r, &json!({})).expect_err("no URLs");
    assert!(err.contains("postgresql") && err.contains("redis"), "{err}");
    // (what, values, what the message names: the value's path and the rule broken, in words
    // that Helm 3 and 4 both use, compared case-insensitively)
    for (what, values, names) in [
        (
            "a MySQL ledger",
            json!({"postgresql": {"url": "mysql://db/x"}, "redis": {"url": "redis://r:6379"}}),
            ["postgresql", "url", "pattern"],
        ),
        (
            "a misspelt key",
            json!({"postgresql": {"url": "postgres://db/x"}, "redis": {"url": "redis://r:6379"}, "gateway": {"replica": 2}}),
            ["gateway", "replica", "not allowed"],
        ),
        (
            "an enum violation",
            json!({"postgresql": {"url": "postgres://db/x"}, "redis": {"url": "redis://r:6379"}, "image": {"pullPolicy": "Sometimes"}}),
            ["pullPolicy", "IfNotPresent", "Always"],
        ),
        (
            "a string for a number",
            json!({"postgresql": {"url": "postgres://db/x"}, "redis": {"url": "redis://r:6379"}, "controller": {"replicas": "two"}}),
            ["controller", "replicas", "integer"],
        ),
    ] {
        let err = render(&r, &values).expect_err(&format!("Helm rendered {what}"));
        for name in names {
            assert!(
                err.to_lowercase().contains(&name.to_lowercase()),
                "{what}: the message does not name {name:?}: {err}"
            );
        }
    }
}
