//! The generated CRD: the committed YAML is current, the schema is structural and validates,
//! and the example manifests pass it.

use serde_json::{json, Value};
use tidal_crds::{crd, crd_yaml, Model};

const EXAMPLES: [(&str, &str); 3] = [
    (
        "llama-spot-fallback.yaml",
        include_str!("../examples/llama-spot-fallback.yaml"),
    ),
    (
        "small-cpu-ondemand.yaml",
        include_str!("../examples/small-cpu-ondemand.yaml"),
    ),
    (
        "https-spot-with-base.yaml",
        include_str!("../examples/https-spot-with-base.yaml"),
    ),
];

fn schema() -> Value {
    let crd = serde_json::to_value(crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&schema()).unwrap()
}

fn manifest(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

fn errors(v: &Value) -> Vec<String> {
    validator()
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn committed_crd_matches_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/model.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = crd_yaml().unwrap();
    if committed != generated {
        if std::env::var_os("TIDAL_UPDATE_CRD").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        panic!("crds/model.yaml is stale: run `tidal crd > crds/model.yaml` (or this test with TIDAL_UPDATE_CRD=1)");
    }
}

#[test]
fn crd_has_group_version_status_and_printer_columns() {
    let crd = serde_json::to_value(crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "models.tidal.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert!(v["subresources"]["status"].is_object());
    let columns: Vec<(&str, &str)> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Phase", ".status.phase"),
            ("Ready", ".status.readyReplicas"),
            ("Spot", ".status.spot.ready"),
            ("On-Demand", ".status.onDemand.ready"),
            ("Backlog", ".status.backlog"),
            ("Cold-Start", ".status.timeConstants.coldStartSeconds"),
            ("Stable-Window", ".status.timeConstants.stableWindowSeconds"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

/// Kubernetes rejects non-structural schemas: every node needs a type (or
/// x-kubernetes-int-or-string / x-kubernetes-preserve-unknown-fields), and no $ref, anyOf
/// with types, or additionalProperties next to properties.
fn assert_structural(node: &Value, path: &str) {
    let obj = node
        .as_object()
        .unwrap_or_else(|| panic!("{path} is not an object"));
    assert!(!obj.contains_key("$ref"), "{path} has $ref");
    let typed = obj.contains_key("type")
        || obj.contains_key("x-kubernetes-int-or-string")
        || obj.contains_key("x-kubernetes-preserve-unknown-fields");
    assert!(typed, "{path} has no type: {node}");
    assert!(
        !(obj.contains_key("properties") && obj.contains_key("additionalProperties")),
        "{path} has properties and additionalProperties"
    );
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            assert_structural(v, &format!("{path}.{k}"));
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
    if let Some(ap) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        assert_structural(ap, &format!("{path}{{}}"));
    }
}

#[test]
fn schema_is_structural() {
    assert_structural(&schema(), "");
}

/// Formats the API server knows (apiextensions-apiserver's `supportedVersionedFormats` for
/// strings; Kubernetes' own APIs' `int32`, `int64`, `float`, `double` for numbers). It warns
/// `unrecognized format` for any other.
fn kubernetes_knows(type_: &str, format: &str) -> bool {
    const STRINGS: [&str; 27] = [
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
        "date-time",
        "k8s-short-name",
        "k8s-long-name",
    ];
    match type_ {
        "integer" => ["int32", "int64"].contains(&format),
        "number" => ["float", "double"].contains(&format),
        "string" => STRINGS.contains(&format),
        _ => false,
    }
}

/// Every `format` below `node`, with its path and the node's type.
fn formats(node: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
    if let Some(format) = node["format"].as_str() {
        let type_ = node["type"].as_str().unwrap_or_default();
        out.push((path.to_string(), type_.to_string(), format.to_string()));
    }
    if let Some(props) = node["properties"].as_object() {
        for (k, v) in props {
            formats(v, &format!("{path}.{k}"), out);
        }
    }
    if node["items"].is_object() {
        formats(&node["items"], &format!("{path}[]"), out);
    }
    if node["additionalProperties"].is_object() {
        formats(&node["additionalProperties"], &format!("{path}{{}}"), out);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for (i, v) in node[key].as_array().into_iter().flatten().enumerate() {
            formats(v, &format!("{path}/{key}[{i}]"), out);
        }
    }
    if node["not"].is_object() {
        formats(&node["not"], &format!("{path}/not"), out);
    }
}

#[test]
fn every_format_is_one_kubernetes_knows() {
    let mut found = Vec::new();
    formats(&schema(), "", &mut found);
    let unknown: Vec<_> = found
        .iter()
        .filter(|(_, t, f)| !kubernetes_knows(t, f))
        .collect();
    assert_eq!(unknown, Vec::<&(String, String, String)>::new());
    // the walk reaches the nested fields (a list's items, the status)
    for path in [
        ".spec.capacity.spot.tolerations[].tolerationSeconds",
        ".status.backlog",
        ".status.conditions[].lastTransitionTime",
    ] {
        assert!(found.iter().any(|(p, _, _)| p == path), "{path}: {found:?}");
    }
    assert_eq!(
        found.len(),
        tidal_crds::crd_yaml().unwrap().matches("format:").count()
    );
    // unsigned integers keep the sign bound their Rust type gave them
    let s = schema();
    let status = &s["properties"]["status"]["properties"];
    assert_eq!(status["backlog"]["format"], "int64");
    assert_eq!(status["backlog"]["minimum"].as_f64(), Some(0.0));
    assert_eq!(status["readyReplicas"]["minimum"].as_f64(), Some(0.0));
    let port = &s["properties"]["spec"]["properties"]["runtime"]["properties"]["port"];
    assert_eq!(port["format"], "int32");
    assert_eq!(
        (port["minimum"].as_f64(), port["maximum"].as_f64()),
        (Some(1.0), Some(65535.0))
    );
}

/// The cross-field rules the schema leaves to CEL, by the field path each names.
fn cel_rules(node: &Value, path: &str, out: &mut Vec<String>) {
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let field = rule["fieldPath"].as_str().unwrap_or_default();
        out.push(format!("{path}{field}"));
        assert!(
            rule["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{path}: {rule}"
        );
    }
    if let Some(props) = node["properties"].as_object() {
        for (k, v) in props {
            cel_rules(v, &format!("{path}.{k}"), out);
        }
    }
    if node["items"].is_object() {
        cel_rules(&node["items"], &format!("{path}[]"), out);
    }
}

#[test]
fn cel_rules_name_their_field_and_the_controller_checks_agree() {
    let mut rules = Vec::new();
    cel_rules(&schema(), "", &mut rules);
    rules.sort();
    assert_eq!(
        rules,
        [
            ".spec.capacity",
            ".spec.capacity.baseOnDemandReplicas",
            ".spec.resources",
            ".spec.runtime.sharedPrefixes[].text",
            ".spec.runtime.speculative.draftModel",
            ".spec.runtime.speculative.draftModel.sha256",
            ".spec.scaling",
            ".spec.scaling.floorSchedule",
            ".spec.scaling.minReplicas",
            ".spec.scaling.panicWindowSeconds",
            ".spec.source.cacheVolumeClaim",
            ".spec.source.sha256",
        ]
    );
    // each rule's mistake, which the controller refuses as well (clusters that skip CEL)
    let base = manifest(EXAMPLES[1].1);
    type Change = fn(&mut Value);
    let mistakes: [(&str, Change); 8] = [
        ("sharedPrefixes[0]", |v| {
            v["spec"]["runtime"]["sharedPrefixes"] = json!([{"text": "a", "system": "b"}])
        }),
        ("baseOnDemandReplicas", |v| {
            v["spec"]["capacity"]["baseOnDemandReplicas"] = json!(4)
        }),
        (
            "floorSchedule",
            |v| {
                v["spec"]["scaling"]["floorSchedule"] =
                    json!([{"start": "08:00", "end": "19:00", "minReplicas": 4}])
            },
        ),
        ("minReplicas", |v| {
            v["spec"]["scaling"]["minReplicas"] = json!(4)
        }),
        ("panicWindow", |v| {
            v["spec"]["scaling"]["stableWindowSeconds"] = json!(60);
            v["spec"]["scaling"]["panicWindowSeconds"] = json!(61);
        }),
        ("sha256", |v| {
            v["spec"]["source"]["uri"] = json!("https://example.com/m.gguf")
        }),
        ("draftModel", |v| {
            v["spec"]["runtime"]["speculative"] = json!({"method": "draft"})
        }),
        ("draftModel", |v| {
            v["spec"]["runtime"]["speculative"] = json!({
                "method": "draft",
                "draftModel": {"uri": "https://example.com/d.gguf"}
            })
        }),
    ];
    for (what, change) in mistakes {
        let mut v = base.clone();
        change(&mut v);
        assert_eq!(
            errors(&v),
            Vec::<String>::new(),
            "{what}: only CEL refuses it"
        );
        let model: Model = serde_json::from_value(v).unwrap();
        let err = model
            .spec
            .validate(tidal_crds::ColdStart::ASSUMED)
            .expect_err(what);
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

#[test]
fn schema_carries_validation() {
    let s = schema();
    let spec = &s["properties"]["spec"];
    let required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in ["source", "runtime", "pricing"] {
        assert!(
            required.contains(&field),
            "{field} not required: {required:?}"
        );
    }
    let scaling = &spec["properties"]["scaling"];
    assert_eq!(
        scaling["properties"]["maxReplicas"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(
        scaling["properties"]["maxReplicas"]["maximum"].as_f64(),
        Some(1000.0)
    );
    let rules: Vec<&str> = scaling["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.contains(&"self.minReplicas <= self.maxReplicas"),
        "{rules:?}"
    );
    assert!(
        rules.contains(
            &"!has(self.floorSchedule) || self.floorSchedule.all(w, w.minReplicas <= self.maxReplicas)"
        ),
        "{rules:?}"
    );
    let weight = &scaling["properties"]["decodingWeightPercent"];
    assert_eq!(
        (weight["minimum"].as_f64(), weight["maximum"].as_f64()),
        (Some(0.0), Some(100.0))
    );
    assert_eq!(scaling["default"]["decodingWeightPercent"], 100);
    let floor = &scaling["properties"]["floorSchedule"]["items"];
    assert_eq!(floor["required"], json!(["end", "minReplicas", "start"]));
    assert_eq!(
        floor["properties"]["start"]["pattern"],
        "^([01][0-9]|2[0-3]):[0-5][0-9]$"
    );
    assert_eq!(floor["properties"]["timeZone"]["type"], "string");
    assert_eq!(floor["properties"]["timeZone"]["maxLength"], 64);
    assert_eq!(
        floor["properties"]["days"]["items"]["enum"],
        json!(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])
    );
    let mode = &spec["properties"]["capacity"]["properties"]["mode"];
    assert_eq!(
        mode["enum"],
        json!(["Spot", "OnDemand", "SpotWithFallback"])
    );
    let source_rules = &spec["properties"]["source"]["x-kubernetes-validations"];
    assert!(source_rules.to_string().contains("has(self.sha256)"));
    let phase = &s["properties"]["status"]["properties"]["phase"];
    assert_eq!(
        phase["enum"],
        json!(["ScaledToZero", "Starting", "Ready", "Degraded"])
    );
}

#[test]
fn examples_pass_the_schema_and_the_controller_checks() {
    for (name, text) in EXAMPLES {
        let v = manifest(text);
        assert_eq!(errors(&v), Vec::<String>::new(), "{name}");
        let model: Model = serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        model
            .spec
            .validate(tidal_crds::ColdStart::ASSUMED)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn schema_rejects_bad_manifests() {
    let base = manifest(EXAMPLES[1].1);
    let bad = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        errors(&v)
    };
    assert!(!bad(&|v| v["spec"]["scaling"]["maxReplicas"] = json!(0)).is_empty());
    assert!(!bad(&|v| v["spec"]["scaling"]["maxReplicas"] = json!(1001)).is_empty());
    assert!(!bad(&|v| v["spec"]["capacity"]["mode"] = json!("Cheap")).is_empty());
    assert!(!bad(&|v| v["spec"]["source"]["uri"] = json!("s3://bucket/m.gguf")).is_empty());
    assert!(!bad(&|v| v["spec"]["source"]["sha256"] = json!("ABC")).is_empty());
    assert!(!bad(&|v| v["spec"]["pricing"]["outputPerMillionMicros"] = json!(-1)).is_empty());
    assert!(!bad(&|v| v["spec"]["pricing"]["currency"] = json!("usd")).is_empty());
    assert!(!bad(&|v| v["spec"]["runtime"]["quantisation"] = json!("q2_k")).is_empty());
    assert!(!bad(&|v| v["spec"]["runtime"]["kvCacheMemory"] = json!("lots")).is_empty());
    assert!(!bad(&|v| v["spec"]["drainTimeoutSeconds"] = json!(0)).is_empty());
    assert!(!bad(&|v| {
        v["spec"].as_object_mut().unwrap().remove("pricing");
    })
    .is_empty());
    assert!(!bad(&|v| {
        v["spec"]["runtime"]
            .as_object_mut()
            .unwrap()
            .remove("image");
    })
    .is_empty());
}
