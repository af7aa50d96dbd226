//! The generated `ModelPool` CRD: the committed YAML is current, the schema is structural and
//! validates the example, the CEL rules and the controller's checks refuse the same
//! impossible pools, the spec maps 1:1 onto the placement's `PoolSpec`; and a `Model` in a
//! pool may not set what only its own fleet would use.

use std::time::Duration;

use serde_json::{json, Value};
use tidal_autoscaler::pool::PoolSpec;
use tidal_crds::{pool_crd, pool_crd_yaml, CacheVolume, ColdStart, Model, ModelPool};

const POOL: &str = include_str!("../examples/pool-gpu-hostpath.yaml");
const POOLED_MODEL: &str = include_str!("../examples/pooled-llama.yaml");

fn schema_of(crd: &impl serde::Serialize) -> Value {
    let crd = serde_json::to_value(crd).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn errors(schema: &Value, v: &Value) -> Vec<String> {
    jsonschema::validator_for(schema)
        .unwrap()
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

fn manifest(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

fn cel_rules(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let field = rule["fieldPath"].as_str().unwrap_or_default();
        let message = rule["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{path}: {rule}");
        out.push((
            format!("{path}{field}"),
            rule["rule"].as_str().unwrap().into(),
        ));
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

fn assert_structural(node: &Value, path: &str) {
    let obj = node.as_object().unwrap();
    assert!(!obj.contains_key("$ref"), "{path} has $ref");
    assert!(
        obj.contains_key("type")
            || obj.contains_key("x-kubernetes-int-or-string")
            || obj.contains_key("x-kubernetes-preserve-unknown-fields"),
        "{path} has no type"
    );
    for (k, v) in obj
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        assert_structural(v, &format!("{path}.{k}"));
    }
    if let Some(items) = obj.get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
}

#[test]
fn committed_pool_crd_matches_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/modelpool.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = pool_crd_yaml().unwrap();
    if committed != generated {
        if std::env::var_os("TIDAL_UPDATE_CRD").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        panic!("crds/modelpool.yaml is stale: run `tidal crd --pool > crds/modelpool.yaml` (or this test with TIDAL_UPDATE_CRD=1)");
    }
}

#[test]
fn pool_crd_is_namespaced_structural_with_status_and_columns() {
    let crd = serde_json::to_value(pool_crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "modelpools.tidal.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], "ModelPool");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert!(v["subresources"]["status"].is_object());
    let schema = schema_of(&pool_crd());
    assert_structural(&schema, "");
    let spec = &schema["properties"]["spec"];
    assert_eq!(
        spec["required"],
        json!(["cache", "runtime", "workerMemoryBytes"])
    );
    let status = &schema["properties"]["status"]["properties"];
    for field in ["readyWorkers", "models", "workers", "conditions"] {
        assert!(status[field].is_object(), "status.{field}");
    }
}

#[test]
fn the_example_pool_passes_the_schema_and_maps_onto_the_placement_spec() {
    let schema = schema_of(&pool_crd());
    assert_eq!(errors(&schema, &manifest(POOL)), Vec::<String>::new());
    let pool: ModelPool = serde_yaml::from_str(POOL).unwrap();
    let spec = pool.spec.pool_spec().unwrap();
    let workers = &spec.workers;
    assert_eq!(
        (
            spec.worker_memory_bytes,
            spec.idle_unload_after,
            workers.min_replicas,
            workers.max_replicas,
            workers.target_in_flight_per_replica,
        ),
        (16 << 30, Duration::from_secs(300), 0, 6, 16.0)
    );
    assert_eq!(
        workers.fallback_after,
        Duration::from_secs(60),
        "capacity maps as a Model's"
    );
    // the sizing is exactly a Model fleet's for the same numbers
    let fleet = tidal_crds::ModelSpec {
        scaling: pool.spec.scaling.as_fleet_scaling(),
        capacity: pool.spec.capacity.clone(),
        ..serde_yaml::from_str::<Model>(POOLED_MODEL).unwrap().spec
    };
    let cold = ColdStart::given(Duration::from_secs(90));
    assert_eq!(workers, &fleet.scaling_spec(cold).unwrap());
    assert_eq!(
        pool.spec.cache.volume().unwrap(),
        CacheVolume::HostPath("/var/lib/tidal/model-cache".into())
    );
    assert_ne!(spec, PoolSpec::default());
}

#[test]
fn cel_rules_refuse_impossible_pools_and_the_controller_checks_agree() {
    let schema = schema_of(&pool_crd());
    let mut rules = Vec::new();
    cel_rules(&schema, "", &mut rules);
    let mut paths: Vec<&str> = rules.iter().map(|(p, _)| p.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            ".spec.cache.hostPath",
            ".spec.capacity.baseOnDemandReplicas",
            ".spec.scaling.floorSchedule",
            ".spec.scaling.minWorkers",
            ".spec.scaling.panicWindowSeconds",
        ]
    );
    let base = manifest(POOL);
    type Change = fn(&mut Value);
    let mistakes: [(&str, Change); 6] = [
        ("minReplicas", |v| {
            v["spec"]["scaling"]["minWorkers"] = json!(7)
        }),
        ("baseOnDemandReplicas", |v| {
            v["spec"]["capacity"]["baseOnDemandReplicas"] = json!(7)
        }),
        ("panicWindow", |v| {
            v["spec"]["scaling"]["stableWindowSeconds"] = json!(60);
            v["spec"]["scaling"]["panicWindowSeconds"] = json!(61);
        }),
        (
            "floorSchedule",
            |v| {
                v["spec"]["scaling"]["floorSchedule"] =
                    json!([{"start": "08:00", "end": "19:00", "minReplicas": 7}])
            },
        ),
        ("exactly one of hostPath or volumeClaim", |v| {
            v["spec"]["cache"]["volumeClaim"] = json!("cache")
        }),
        ("exactly one of hostPath or volumeClaim", |v| {
            v["spec"]["cache"] = json!({})
        }),
    ];
    for (what, change) in mistakes {
        let mut v = base.clone();
        change(&mut v);
        assert_eq!(
            errors(&schema, &v),
            Vec::<String>::new(),
            "{what}: only CEL refuses it"
        );
        let pool: ModelPool = serde_json::from_value(v).unwrap();
        let err = pool.spec.pool_spec().expect_err(what);
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
    // what the schema itself refuses
    let bad = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        errors(&schema, &v)
    };
    assert!(!bad(&|v| v["spec"]["workerMemoryBytes"] = json!(0)).is_empty());
    assert!(!bad(&|v| v["spec"]["scaling"]["maxWorkers"] = json!(0)).is_empty());
    assert!(!bad(&|v| v["spec"]["cache"]["hostPath"] = json!("relative/dir")).is_empty());
    assert!(!bad(&|v| v["spec"]["idleUnloadAfterSeconds"] = json!(0)).is_empty());
    assert!(!bad(&|v| {
        v["spec"].as_object_mut().unwrap().remove("cache");
    })
    .is_empty());
}

#[test]
fn a_model_in_a_pool_may_not_set_what_only_its_own_fleet_uses() {
    let schema = schema_of(&tidal_crds::crd());
    let base = manifest(POOLED_MODEL);
    assert_eq!(errors(&schema, &base), Vec::<String>::new());
    let model: Model = serde_yaml::from_str(POOLED_MODEL).unwrap();
    assert_eq!(model.spec.pool.as_deref(), Some("l4-pool"));
    model.spec.validate(ColdStart::ASSUMED).unwrap();
    type Change = fn(&mut Value);
    let mistakes: [(&str, Change); 6] = [
        ("scaling.minReplicas at 0", |v| {
            v["spec"]["scaling"]["minReplicas"] = json!(1)
        }),
        ("scaling.floorSchedule out", |v| {
            v["spec"]["scaling"]["floorSchedule"] =
                json!([{"start": "08:00", "end": "19:00", "minReplicas": 1}])
        }),
        ("leave capacity out", |v| {
            v["spec"]["capacity"] = json!({"mode": "OnDemand"})
        }),
        ("leave capacity out", |v| {
            v["spec"]["capacity"] = json!({"spot": {"nodeSelector": {"a": "b"}}})
        }),
        ("leave resources out", |v| {
            v["spec"]["resources"] = json!({"gpus": 1})
        }),
        ("leave source.cacheVolumeClaim out", |v| {
            v["spec"]["source"]["cacheVolumeClaim"] = json!("model-cache")
        }),
    ];
    for (what, change) in mistakes {
        let mut v = base.clone();
        change(&mut v);
        assert_eq!(
            errors(&schema, &v),
            Vec::<String>::new(),
            "{what}: only CEL refuses it"
        );
        let m: Model = serde_json::from_value(v.clone()).unwrap();
        let err = m.spec.validate(ColdStart::ASSUMED).expect_err(what);
        assert!(err.to_string().contains(what), "{what}: {err}");
        // the same Model without a pool is fine
        v["spec"].as_object_mut().unwrap().remove("pool");
        let own: Model = serde_json::from_value(v).unwrap();
        own.spec.validate(ColdStart::ASSUMED).expect(what);
    }
    let mut rules = Vec::new();
    cel_rules(&schema, "", &mut rules);
    let pooled: Vec<&str> = rules
        .iter()
        .filter(|(_, r)| r.starts_with("!has(self.pool)"))
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(
        pooled,
        [
            ".spec.scaling",
            ".spec.capacity",
            ".spec.resources",
            ".spec.source.cacheVolumeClaim"
        ]
    );
    let pool = &schema["properties"]["spec"]["properties"]["pool"];
    assert_eq!(pool["maxLength"], 54);
}
