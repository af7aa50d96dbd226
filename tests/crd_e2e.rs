//! The `Model` CRD on a real API server: runs only when `KUBECONFIG` is set (skipped with a
//! message otherwise). Applies `crds/model.yaml` server-side and waits for it to be
//! Established; checks that creating the CRD draws no warnings (unrecognized formats), that
//! every example in `crds/examples/` is accepted with none, that each of a list of mistaken
//! Models is refused with a message naming the field, and that `kubectl get models` columns
//! (the Table form) show a Model's status readably.

mod crd_setup;
mod process;
mod skip;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::core::v1::Namespace;
use tidal_controller::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tidal_controller::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tidal_controller::kube::client::Body;
use tidal_controller::kube::Client;
use tidal_crds::Model;

const CRD_YAML: &str = include_str!("../crds/model.yaml");
const CRD_NAME: &str = "models.tidal.dev";
const FIELD_MANAGER: &str = "tidal-crd-e2e";

const EXAMPLES: [(&str, &str); 3] = [
    (
        "llama-spot-fallback.yaml",
        include_str!("../crds/examples/llama-spot-fallback.yaml"),
    ),
    (
        "small-cpu-ondemand.yaml",
        include_str!("../crds/examples/small-cpu-ondemand.yaml"),
    ),
    (
        "https-spot-with-base.yaml",
        include_str!("../crds/examples/https-spot-with-base.yaml"),
    ),
];

/// What the API server answered: status code, body, and `Warning` headers.
struct Answer {
    status: u16,
    body: Value,
    warnings: Vec<String>,
}

impl Answer {
    /// The `message` of a `Status` body (what `kubectl` prints for a refusal).
    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// One raw request: kube's typed calls keep neither the `Warning` headers nor the Table form.
async fn send(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> Answer {
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, accept)
        .body(Body::from(body))
        .expect("request");
    let response = client.send(request).await.expect("API server answers");
    let status = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Answer {
        status,
        body,
        warnings,
    }
}

/// Creates `model` in `ns` as a dry run, with unknown fields refused (`kubectl apply
/// --dry-run=server --validate=strict`).
async fn dry_run_create(client: &Client, ns: &str, mut model: Value) -> Answer {
    model["metadata"]["namespace"] = json!(ns);
    let uri = format!(
        "/apis/tidal.dev/v1alpha1/namespaces/{ns}/models?dryRun=All&fieldValidation=Strict"
    );
    send(
        client,
        "POST",
        &uri,
        "application/json",
        "application/json",
        serde_json::to_vec(&model).expect("json"),
    )
    .await
}

/// A mistake: how it changes a valid Model, and what the refusal must say (the field's path
/// first).
struct Mistake {
    what: &'static str,
    change: fn(&mut Value),
    says: &'static [&'static str],
}

fn remove(v: &mut Value, key: &str) {
    if let Some(map) = v.as_object_mut() {
        map.remove(key);
    }
}

const MISTAKES: &[Mistake] = &[
    Mistake {
        what: "negative minReplicas",
        change: |m| m["spec"]["scaling"]["minReplicas"] = json!(-1),
        says: &["spec.scaling.minReplicas", "greater than or equal to 0"],
    },
    Mistake {
        what: "minReplicas above maxReplicas",
        change: |m| {
            m["spec"]["scaling"]["minReplicas"] = json!(5);
            m["spec"]["scaling"]["maxReplicas"] = json!(3);
        },
        says: &[
            "spec.scaling.minReplicas",
            "minReplicas must not exceed maxReplicas",
        ],
    },
    Mistake {
        what: "zero maxReplicas",
        change: |m| m["spec"]["scaling"]["maxReplicas"] = json!(0),
        says: &["spec.scaling.maxReplicas", "greater than or equal to 1"],
    },
    Mistake {
        what: "unknown capacity mode",
        change: |m| m["spec"]["capacity"]["mode"] = json!("Cheap"),
        says: &["spec.capacity.mode", "\"Cheap\"", "SpotWithFallback"],
    },
    Mistake {
        what: "baseOnDemandReplicas above maxReplicas",
        change: |m| m["spec"]["capacity"]["baseOnDemandReplicas"] = json!(4),
        says: &[
            "spec.capacity.baseOnDemandReplicas",
            "baseOnDemandReplicas must not exceed scaling.maxReplicas",
        ],
    },
    Mistake {
        what: "malformed sha256",
        change: |m| m["spec"]["source"]["sha256"] = json!("ABC"),
        says: &["spec.source.sha256", "^[0-9a-f]{64}$"],
    },
    Mistake {
        what: "source missing",
        change: |m| remove(&mut m["spec"], "source"),
        says: &["spec.source", "Required value"],
    },
    Mistake {
        what: "https:// source without sha256",
        change: |m| m["spec"]["source"]["uri"] = json!("https://models.example.com/m.gguf"),
        says: &["spec.source.sha256", "an https:// source needs sha256"],
    },
    Mistake {
        what: "unsupported source scheme",
        change: |m| m["spec"]["source"]["uri"] = json!("s3://bucket/m.gguf"),
        says: &["spec.source.uri", "should match"],
    },
    Mistake {
        what: "worker image missing",
        change: |m| remove(&mut m["spec"]["runtime"], "image"),
        says: &["spec.runtime.image", "Required value"],
    },
    Mistake {
        what: "negative price",
        change: |m| m["spec"]["pricing"]["outputPerMillionMicros"] = json!(-1),
        says: &[
            "spec.pricing.outputPerMillionMicros",
            "greater than or equal to 0",
        ],
    },
    Mistake {
        what: "lowercase currency",
        change: |m| m["spec"]["pricing"]["currency"] = json!("usd"),
        says: &["spec.pricing.currency", "^[A-Z]{3}$"],
    },
    Mistake {
        what: "memory not a quantity",
        change: |m| m["spec"]["resources"]["memory"] = json!("16 gigs"),
        says: &["spec.resources.memory", "should match"],
    },
    Mistake {
        what: "KV-cache size not a size",
        change: |m| m["spec"]["runtime"]["kvCacheMemory"] = json!("lots"),
        says: &["spec.runtime.kvCacheMemory", "should match"],
    },
    Mistake {
        what: "unknown quantisation",
        change: |m| m["spec"]["runtime"]["quantisation"] = json!("q2_k"),
        says: &["spec.runtime.quantisation", "\"q2_k\"", "q4_0"],
    },
    Mistake {
        what: "shared prefix with both text and system",
        change: |m| {
            m["spec"]["runtime"]["sharedPrefixes"] =
                json!([{"system": "Be brief."}, {"text": "a", "system": "b"}])
        },
        says: &[
            "spec.runtime.sharedPrefixes[1].text",
            "a shared prefix has exactly one of text or system",
        ],
    },
    Mistake {
        what: "port out of range",
        change: |m| m["spec"]["runtime"]["port"] = json!(70000),
        says: &["spec.runtime.port", "less than or equal to 65535"],
    },
    Mistake {
        what: "zero drain timeout",
        change: |m| m["spec"]["drainTimeoutSeconds"] = json!(0),
        says: &["spec.drainTimeoutSeconds", "greater than or equal to 1"],
    },
    Mistake {
        what: "panic window longer than the stable window",
        change: |m| {
            m["spec"]["scaling"]["stableWindowSeconds"] = json!(60);
            m["spec"]["scaling"]["panicWindowSeconds"] = json!(120);
        },
        says: &[
            "spec.scaling.panicWindowSeconds",
            "panicWindowSeconds must not exceed stableWindowSeconds",
        ],
    },
    Mistake {
        what: "stable window under 6 s",
        change: |m| m["spec"]["scaling"]["stableWindowSeconds"] = json!(2),
        says: &[
            "spec.scaling.stableWindowSeconds",
            "greater than or equal to 6",
        ],
    },
    Mistake {
        what: "floor window at 25:00",
        change: |m| {
            m["spec"]["scaling"]["floorSchedule"] =
                json!([{"start": "25:00", "end": "19:00", "minReplicas": 1}])
        },
        says: &["spec.scaling.floorSchedule[0].start", "should match"],
    },
    Mistake {
        what: "scheduled floor above maxReplicas",
        change: |m| {
            m["spec"]["scaling"]["floorSchedule"] =
                json!([{"start": "08:00", "end": "19:00", "minReplicas": 9}])
        },
        says: &[
            "spec.scaling.floorSchedule",
            "floorSchedule minReplicas must not exceed maxReplicas",
        ],
    },
    Mistake {
        what: "misspelt field",
        change: |m| m["spec"]["scaling"]["maxReplica"] = json!(3),
        says: &["spec.scaling.maxReplica", "unknown field"],
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_enforces_the_model_schema() {
    if std::env::var_os("KUBECONFIG").is_none() {
        skip::skip("set KUBECONFIG to a disposable cluster to run the CRD end-to-end test");
        return;
    }
    let client = Client::try_default().await.expect("kubernetes client");
    let crd: CustomResourceDefinition = serde_yaml::from_str(CRD_YAML).expect("crds/model.yaml");

    // Warnings ratchet (an update warns only of formats the stored CRD lacked), so a copy under
    // a group of its own, created as a dry run, is what shows every warning the CRD draws.
    let group = format!("e2e-{}.tidal.dev", std::process::id());
    let mut copy = serde_json::to_value(&crd).expect("json");
    copy["metadata"]["name"] = json!(format!("models.{group}"));
    copy["spec"]["group"] = json!(group);
    let created = send(
        &client,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions?dryRun=All",
        "application/json",
        "application/json",
        serde_json::to_vec(&copy).expect("json"),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.warnings, Vec::<String>::new(), "creating the CRD");

    // crds/model.yaml itself, applied as `kubectl apply --server-side` does
    let applied = send(
        &client,
        "PATCH",
        &format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}?fieldManager={FIELD_MANAGER}&force=true&fieldValidation=Strict"
        ),
        "application/apply-patch+yaml",
        "application/json",
        CRD_YAML.as_bytes().to_vec(),
    )
    .await;
    assert!(
        matches!(applied.status, 200 | 201),
        "apply crds/model.yaml: {} {}",
        applied.status,
        applied.body
    );
    let unrecognized: Vec<&String> = applied
        .warnings
        .iter()
        .filter(|w| w.contains("unrecognized format"))
        .collect();
    assert!(unrecognized.is_empty(), "{unrecognized:?}");
    crd_setup::wait_established(&client, CRD_NAME).await;

    let ns = format!("tidal-crd-e2e-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    let failures = check_models(&client, &ns).await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The examples, the mistakes and the printer columns in namespace `ns`; what went wrong.
async fn check_models(client: &Client, ns: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, text) in EXAMPLES {
        let model: Value = serde_yaml::from_str(text).expect("example YAML");
        let answer = dry_run_create(client, ns, model).await;
        if answer.status != 201 || !answer.warnings.is_empty() {
            failures.push(format!(
                "{name}: {} {} warnings {:?}",
                answer.status,
                answer.message(),
                answer.warnings
            ));
        }
    }

    // small-cpu-ondemand.yaml with maxReplicas 3 is the base every mistake changes
    let base: Value = serde_yaml::from_str(EXAMPLES[1].1).expect("example YAML");
    assert_eq!(base["spec"]["scaling"]["maxReplicas"], 3);
    for mistake in MISTAKES {
        let mut model = base.clone();
        (mistake.change)(&mut model);
        let answer = dry_run_create(client, ns, model).await;
        let message = answer.message();
        eprintln!("{}: {} {message}", mistake.what, answer.status);
        let missing: Vec<&&str> = mistake
            .says
            .iter()
            .filter(|s| !message.contains(**s))
            .collect();
        if !(400..500).contains(&answer.status) || !missing.is_empty() {
            failures.push(format!(
                "{}: {} {message:?} lacks {missing:?}",
                mistake.what, answer.status
            ));
        }
    }

    failures.extend(printer_columns(client, ns, &base).await);
    failures
}

/// Creates `model` in `ns`, writes a status as the controller would, and reads it back in
/// the Table form `kubectl get` prints; what is wrong with the columns.
async fn printer_columns(client: &Client, ns: &str, model: &Value) -> Vec<String> {
    let models: Api<Model> = Api::namespaced(client.clone(), ns);
    let mut model: Model = serde_json::from_value(model.clone()).expect("example is a Model");
    model.metadata.namespace = Some(ns.to_string());
    let name = model.metadata.name.clone().expect("example has a name");
    models
        .create(&PostParams::default(), &model)
        .await
        .expect("create the Model");
    let status = json!({"status": {
        "phase": "Ready",
        "readyReplicas": 3,
        "spot": {"desired": 2, "ready": 2},
        "onDemand": {"desired": 1, "ready": 1},
        "backlog": 7,
        "timeConstants": {
            "coldStartSeconds": 45,
            "coldStartSource": "Measured",
            "stableWindowSeconds": 225,
            "stableAggregate": "Max",
            "panicWindowSeconds": 22.5,
            "scaleDownDelaySeconds": 225,
            "scaleToZeroAfterSeconds": 450
        }
    }});
    models
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("write the status");
    let table = send(
        client,
        "GET",
        &format!("/apis/tidal.dev/v1alpha1/namespaces/{ns}/models/{name}?includeObject=None"),
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
        Vec::new(),
    )
    .await;
    let mut failures = Vec::new();
    if table.status != 200 || table.body["kind"] != "Table" {
        return vec![format!("Table: {} {}", table.status, table.body)];
    }
    let columns: Vec<(String, String, i64)> = table.body["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["type"].as_str().unwrap_or_default().to_string(),
                c["priority"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    let expected: Vec<(String, String, i64)> = [
        ("Name", "string", 0),
        ("Phase", "string", 0),
        ("Ready", "integer", 0),
        ("Spot", "integer", 0),
        ("On-Demand", "integer", 0),
        ("Backlog", "integer", 0),
        ("Cold-Start", "integer", 1),
        ("Stable-Window", "integer", 1),
        ("Age", "date", 0),
    ]
    .iter()
    .map(|(n, t, p)| (n.to_string(), t.to_string(), *p))
    .collect();
    if columns != expected {
        failures.push(format!("columns {columns:?}, expected {expected:?}"));
    }
    let undescribed: Vec<&str> = table.body["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["description"].as_str().unwrap_or_default().is_empty())
        .filter_map(|c| c["name"].as_str())
        .collect();
    if !undescribed.is_empty() {
        failures.push(format!("columns without a description: {undescribed:?}"));
    }
    let cells = &table.body["rows"][0]["cells"];
    eprintln!("Table row: {cells}");
    let expected_cells = json!([name, "Ready", 3, 2, 1, 7, 45, 225]);
    let leading: Vec<Value> = cells
        .as_array()
        .into_iter()
        .flatten()
        .take(8)
        .cloned()
        .collect();
    if Value::Array(leading) != expected_cells {
        failures.push(format!(
            "cells {cells}, expected {expected_cells} then the age"
        ));
    }
    // a date column reads as an age (`5s`, `3m`), not as a timestamp
    let age = cells[8].as_str().unwrap_or_default();
    let is_age = age.starts_with(|c: char| c.is_ascii_digit())
        && age.ends_with(['s', 'm', 'h', 'd', 'y'])
        && age
            .chars()
            .all(|c| c.is_ascii_digit() || "smhdy".contains(c));
    if !is_age {
        failures.push(format!("Age cell {:?} is not an age", cells[8]));
    }
    failures
}
