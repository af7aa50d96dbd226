//! Tests of the pool's Deployment builder on the example manifests: the exact bodies.

use super::*;
use crate::deployment::FETCH_SCRIPT;
use serde_json::json;

fn pool() -> ModelPool {
    let mut p: ModelPool =
        serde_yaml::from_str(include_str!("../../crds/examples/pool-gpu-hostpath.yaml")).unwrap();
    p.metadata.uid = Some("pool-uid".into());
    p
}

fn pooled() -> Model {
    serde_yaml::from_str(include_str!("../../crds/examples/pooled-llama.yaml")).unwrap()
}

fn cfg() -> WorkerConfig {
    WorkerConfig {
        queue_url: "redis://redis:6379".into(),
        key_prefix: None,
    }
}

fn security() -> serde_json::Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

/// Everything but the containers, which the tests below compare one by one.
fn want_deployment(
    capacity: &str,
    suffix: &str,
    replicas: u32,
    scheduling: serde_json::Value,
) -> serde_json::Value {
    let labels = json!({
        "tidal.dev/pool": "l4-pool",
        "tidal.dev/capacity": capacity,
        "app.kubernetes.io/name": "tidal-runtime",
        "app.kubernetes.io/instance": "l4-pool",
        "app.kubernetes.io/managed-by": "tidal-controller",
    });
    let mut pod = json!({
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 75,
        "volumes": [
            {"name": "model-cache", "hostPath": {"path": "/var/lib/tidal/model-cache", "type": "DirectoryOrCreate"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    });
    for (k, v) in scheduling.as_object().unwrap() {
        pod[k] = v.clone();
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": format!("l4-pool-{suffix}"),
            "namespace": "models",
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "tidal.dev/v1alpha1",
                "kind": "ModelPool",
                "name": "l4-pool",
                "uid": "pool-uid",
                "controller": true,
            }],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"tidal.dev/pool": "l4-pool", "tidal.dev/capacity": capacity}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })
}

fn without_containers(d: &Deployment) -> serde_json::Value {
    let mut v = serde_json::to_value(d).unwrap();
    let pod = v["spec"]["template"]["spec"].as_object_mut().unwrap();
    pod.remove("containers");
    pod.remove("initContainers");
    v
}

fn built(capacity: CapacityType, replicas: u32) -> Deployment {
    let p = pool();
    let m = pooled();
    let models = [PoolModel {
        model: &m,
        source: m.spec.source().unwrap(),
    }];
    let cache = p.spec.cache.volume().unwrap();
    build_pool(&p, &cache, &models, capacity, replicas, &cfg())
}

#[test]
fn spot_and_on_demand_deployments_of_a_pool_are_exact() {
    let toleration =
        json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    let spot = built(CapacityType::Spot, 2);
    assert_eq!(
        without_containers(&spot),
        want_deployment(
            "spot",
            "spot",
            2,
            json!({
                "nodeSelector": {"karpenter.sh/capacity-type": "spot", "nvidia.com/gpu.product": "NVIDIA-L4"},
                "tolerations": toleration,
            })
        )
    );
    let od = built(CapacityType::OnDemand, 0);
    assert_eq!(
        without_containers(&od),
        want_deployment(
            "on-demand",
            "ondemand",
            0,
            json!({
                "nodeSelector": {"karpenter.sh/capacity-type": "on-demand", "nvidia.com/gpu.product": "NVIDIA-L4"},
                "tolerations": toleration,
            })
        )
    );
}

#[test]
fn the_pool_worker_runs_tidal_runtime_on_the_cache_with_probes_and_drain() {
    let d = built(CapacityType::Spot, 1);
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        serde_json::to_value(&pod.containers).unwrap(),
        json!([{
            "name": "worker",
            "image": "ghcr.io/tidal/tidal:0.1.0",
            "command": ["tidal"],
            "args": [
                "runtime", "--pool", "models/l4-pool", "--model-dir", "/cache",
                "--queue", "redis://redis:6379", "--capacity-type", "spot",
                "--drain-timeout", "60s", "--listen", "0.0.0.0:8000",
                "--worker-memory", "17179869184", "--device", "cuda",
                "--pool-model",
                "models/llama-3-8b-pooled=/cache/models/llama-3-8b-pooled/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf",
                "--pool-model-sha256",
                "models/llama-3-8b-pooled=647a2b64cbcdbe670432d0502ebb2592b36dd364d51a9ef7a1387b7e3e4b8b8a",
            ],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
            "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
            "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http"}}},
            "resources": {
                "limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"},
                "requests": {"cpu": "4", "memory": "32Gi"},
            },
            "volumeMounts": [
                {"name": "model-cache", "mountPath": "/cache", "readOnly": true},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
            "securityContext": security(),
        }])
    );
}

#[test]
fn init_containers_own_the_host_path_then_fill_the_cache_per_model() {
    let d = built(CapacityType::Spot, 1);
    let pod = d.spec.unwrap().template.spec.unwrap();
    let mut root = security();
    root["runAsNonRoot"] = json!(false);
    root["runAsUser"] = json!(0);
    root["capabilities"] = json!({"drop": ["ALL"], "add": ["CHOWN"]});
    assert_eq!(
        serde_json::to_value(&pod.init_containers).unwrap(),
        json!([
            {
                "name": "cache-owner",
                "image": "curlimages/curl:8.11.1",
                "command": ["chown", "65532:65532", "/cache"],
                "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}],
                "securityContext": root,
            },
            {
                "name": "fetch-llama-3-8b-pooled",
                "image": "curlimages/curl:8.11.1",
                "command": ["sh", "-c", format!("mkdir -p \"$MODELS_DIR\"\n{FETCH_SCRIPT}")],
                "env": [
                    {"name": "MODELS_DIR", "value": "/cache/models/llama-3-8b-pooled"},
                    {"name": "MODEL_FILE", "value": "Meta-Llama-3-8B-Instruct-Q4_K_M.gguf"},
                    {"name": "MODEL_URL", "value": "https://huggingface.co/bartowski/Meta-Llama-3-8B-Instruct-GGUF/resolve/main/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf"},
                    {"name": "MODEL_SHA256", "value": "647a2b64cbcdbe670432d0502ebb2592b36dd364d51a9ef7a1387b7e3e4b8b8a"},
                    {"name": "MODEL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                ],
                "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}],
                "securityContext": security(),
            },
        ])
    );
    let m = pooled();
    assert_eq!(
        cached_path(&m, &m.spec.source().unwrap()),
        "/cache/models/llama-3-8b-pooled/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf"
    );
}

#[test]
fn a_claim_cache_needs_no_owner_step_and_a_file_source_no_download() {
    let mut p = pool();
    p.spec.cache = serde_json::from_value(json!({"volumeClaim": "pool-cache"})).unwrap();
    let mut m = pooled();
    m.spec.source = serde_json::from_value(json!({"uri": "file:///opt/models/m.gguf"})).unwrap();
    let models = [PoolModel {
        model: &m,
        source: m.spec.source().unwrap(),
    }];
    let cache = p.spec.cache.volume().unwrap();
    let d = build_pool(&p, &cache, &models, CapacityType::OnDemand, 1, &cfg());
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert!(pod.init_containers.is_none());
    assert_eq!(
        serde_json::to_value(&pod.volumes.unwrap()[0]).unwrap(),
        json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "pool-cache"}})
    );
    assert_eq!(cached_path(&m, &models[0].source), "/opt/models/m.gguf");
}
