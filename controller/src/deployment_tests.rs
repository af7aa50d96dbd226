//! Tests of the Deployment builder on the example manifests.

use super::*;

fn example(text: &str) -> Model {
    serde_yaml::from_str(text).unwrap()
}

fn llama() -> Model {
    let mut m = example(include_str!("../../crds/examples/llama-spot-fallback.yaml"));
    m.metadata.uid = Some("uid-1".into());
    m
}

fn cfg() -> WorkerConfig {
    WorkerConfig {
        queue_url: "redis://redis:6379".into(),
        key_prefix: None,
    }
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

#[test]
fn worker_command_uses_the_runtime_worker_flags() {
    let m = llama();
    let src = m.spec.source().unwrap();
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    assert_eq!(
        args,
        [
            "runtime",
            "--model",
            "/models/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf",
            "--queue",
            "redis://redis:6379",
            "--model-id",
            "models/llama-3-8b",
            "--capacity-type",
            "spot",
            "--drain-timeout",
            "60s",
            "--listen",
            "0.0.0.0:8000",
            "--device",
            "cuda",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "2048",
            "--kv-cache-memory",
            "8GiB",
        ]
    );
    // A CPU model's workers run on the CPU.
    let cpu = example(include_str!("../../crds/examples/small-cpu-ondemand.yaml"));
    let cpu_args = worker_args(
        &cpu,
        &cpu.spec.source().unwrap(),
        CapacityType::OnDemand,
        &cfg(),
    );
    assert!(!cpu_args.iter().any(|a| a == "--device"), "{cpu_args:?}");
    let od = worker_args(&m, &src, CapacityType::OnDemand, &cfg());
    assert_eq!(od[8], "on-demand");
}

#[test]
fn file_source_is_loaded_in_place_with_extra_args_last() {
    let m = example(include_str!("../../crds/examples/small-cpu-ondemand.yaml"));
    let src = m.spec.source().unwrap();
    let args = worker_args(&m, &src, CapacityType::OnDemand, &cfg());
    assert_eq!(args[2], "/models/qwen2.5-0.5b-instruct-q4_0.gguf");
    assert_eq!(
        &args[args.len() - 6..],
        [
            "--kv-cache-memory",
            "512MiB",
            "--quantize",
            "q4_0",
            "--block-size",
            "16"
        ]
    );
    let d = build(&m, &src, CapacityType::OnDemand, 2, &cfg());
    let spec = pod_spec(&d);
    assert!(spec.init_containers.is_none(), "no download for file://");
    let volumes: Vec<_> = spec.volumes.iter().flatten().map(|v| &v.name).collect();
    assert_eq!(volumes, ["tmp"], "only the scratch directory");
}

/// What the chart's `podSecurityContext` and `securityContext` say, plus the cache chown
/// policy; checked as JSON so a field added or dropped fails here.
fn want_security() -> (serde_json::Value, serde_json::Value) {
    (
        serde_json::json!({
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }),
        serde_json::json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
        }),
    )
}

#[test]
fn every_container_runs_locked_down_with_a_writable_tmp() {
    let (pod_want, container_want) = want_security();
    for (m, what) in [
        (llama(), "https with cache claim"),
        (
            example(include_str!("../../crds/examples/small-cpu-ondemand.yaml")),
            "file",
        ),
        (
            example(include_str!(
                "../../crds/examples/https-spot-with-base.yaml"
            )),
            "https without cache",
        ),
    ] {
        let src = m.spec.source().unwrap();
        for cap in [CapacityType::Spot, CapacityType::OnDemand] {
            let d = build(&m, &src, cap, 1, &cfg());
            let spec = pod_spec(&d);
            assert_eq!(
                serde_json::to_value(&spec.security_context).unwrap(),
                pod_want,
                "{what}"
            );
            assert_eq!(spec.automount_service_account_token, Some(false), "{what}");
            let containers = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten());
            for c in containers {
                assert_eq!(
                    serde_json::to_value(&c.security_context).unwrap(),
                    container_want,
                    "{what}: {}",
                    c.name
                );
            }
            let worker = &spec.containers[0];
            let tmp = worker
                .volume_mounts
                .iter()
                .flatten()
                .find(|v| v.mount_path == TMP_DIR)
                .expect("a /tmp mount");
            assert_eq!(tmp.read_only, None, "{what}: /tmp is writable");
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == tmp.name)
                .unwrap();
            assert_eq!(
                serde_json::to_value(volume).unwrap(),
                serde_json::json!({"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}),
                "{what}"
            );
        }
    }
}

#[test]
fn spot_deployment_has_owner_probes_drain_and_scheduling() {
    let m = llama();
    let src = m.spec.source().unwrap();
    let d = build(&m, &src, CapacityType::Spot, 3, &cfg());
    assert_eq!(d.metadata.name.as_deref(), Some("llama-3-8b-spot"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("models"));
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        ("Model", "llama-3-8b", "uid-1", Some(true))
    );
    let ds = d.spec.as_ref().unwrap();
    assert_eq!(ds.replicas, Some(3));
    assert_eq!(
        ds.selector.match_labels.as_ref().unwrap(),
        &selector_labels("llama-3-8b", CapacityType::Spot)
    );
    let spec = pod_spec(&d);
    assert_eq!(
        spec.termination_grace_period_seconds,
        Some(60 + GRACE_MARGIN_SECONDS)
    );
    let sel = spec.node_selector.as_ref().unwrap();
    assert_eq!(sel["karpenter.sh/capacity-type"], "spot");
    assert_eq!(sel[DEFAULT_GPU_TYPE_LABEL], "NVIDIA-L4");
    assert_eq!(
        spec.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("nvidia.com/gpu")
    );
    let c = &spec.containers[0];
    assert_eq!(c.command.as_deref(), Some(&["tidal".to_string()][..]));
    assert_eq!(
        c.readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/health")
    );
    assert!(c.liveness_probe.as_ref().unwrap().tcp_socket.is_some());
    let pre_stop = c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    assert_eq!(
        pre_stop.http_get.as_ref().unwrap().path.as_deref(),
        Some("/drain")
    );
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["nvidia.com/gpu"], Quantity("1".into()));
    assert_eq!(limits["memory"], Quantity("24Gi".into()));
    let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(requests["cpu"], Quantity("4".into()));
    assert!(!requests.contains_key("nvidia.com/gpu"));
    // the download goes to the cache claim, checked against its hash, with the token
    let init = &spec.init_containers.as_ref().unwrap()[0];
    let env: BTreeMap<_, _> = init
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e))
        .collect();
    assert_eq!(
        env["MODEL_URL"].value.as_deref(),
        Some("https://huggingface.co/bartowski/Meta-Llama-3-8B-Instruct-GGUF/resolve/main/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf")
    );
    assert_eq!(
        env["MODEL_SHA256"].value.as_deref(),
        Some("647a2b64cbcdbe670432d0502ebb2592b36dd364d51a9ef7a1387b7e3e4b8b8a")
    );
    let secret = env["MODEL_TOKEN"]
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (secret.name.as_str(), secret.key.as_str()),
        ("hf-token", "token")
    );
    let volume = &spec.volumes.as_ref().unwrap()[0];
    assert_eq!(
        volume.persistent_volume_claim.as_ref().unwrap().claim_name,
        "model-cache"
    );
}

#[test]
fn on_demand_deployment_uses_its_own_pool() {
    let m = llama();
    let src = m.spec.source().unwrap();
    let d = build(&m, &src, CapacityType::OnDemand, 0, &cfg());
    assert_eq!(d.metadata.name.as_deref(), Some("llama-3-8b-ondemand"));
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
    let sel = pod_spec(&d).node_selector.as_ref().unwrap();
    assert_eq!(sel["karpenter.sh/capacity-type"], "on-demand");
    let labels = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(labels["tidal.dev/capacity"], "on-demand");
}

#[test]
fn https_source_without_cache_uses_an_empty_dir() {
    let m = example(include_str!(
        "../../crds/examples/https-spot-with-base.yaml"
    ));
    let src = m.spec.source().unwrap();
    let d = build(&m, &src, CapacityType::Spot, 1, &cfg());
    let spec = pod_spec(&d);
    assert!(spec.volumes.as_ref().unwrap()[0].empty_dir.is_some());
    let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
    assert_eq!(
        (mounts[0].mount_path.as_str(), mounts[0].read_only),
        (MODELS_DIR, Some(true))
    );
    assert!(spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()
        .contains_key("memory"));
}

#[test]
fn a_custom_key_prefix_is_passed_to_the_workers() {
    let m = llama();
    let src = m.spec.source().unwrap();
    let cfg = WorkerConfig {
        queue_url: "redis://r:6379".into(),
        key_prefix: Some("prod:".into()),
    };
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg);
    assert_eq!(&args[13..15], ["--queue-prefix", "prod:"]);
}

#[test]
fn shared_prefixes_reach_the_worker_as_json_in_its_environment() {
    let mut m = llama();
    let src = m.spec.source().unwrap();
    let env_of = |m: &Model| -> Vec<(String, Option<String>)> {
        let d = build(m, &src, CapacityType::Spot, 1, &cfg());
        pod_spec(&d).containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect()
    };
    // None declared: every tenant's cache stays apart, nothing is passed.
    assert_eq!(env_of(&m), [("POD_NAME".into(), None)]);
    m.spec.runtime.shared_prefixes = serde_json::from_value(serde_json::json!([
        {"system": "You are a helpful assistant."},
        {"text": "<|begin_of_text|>Answer briefly."}
    ]))
    .unwrap();
    let env = env_of(&m);
    assert_eq!(env[1].0, "TIDAL_SHARED_PREFIXES");
    // The `--shared-prefix-file` format: strings for texts, {"system": ...} for messages.
    let json: serde_json::Value = serde_json::from_str(env[1].1.as_deref().unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!([
            {"system": "You are a helpful assistant."},
            "<|begin_of_text|>Answer briefly."
        ])
    );
    // The worker's arguments stay short: the texts are not on its command line.
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    assert!(!args.iter().any(|a| a.contains("helpful")), "{args:?}");
}

#[test]
fn speculative_decoding_reaches_the_worker_flags() {
    let mut m = llama();
    let src = m.spec.source().unwrap();
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    assert!(
        !args.iter().any(|a| a == "--speculative"),
        "off unless asked: {args:?}"
    );
    m.spec.runtime.speculative = serde_json::from_value(serde_json::json!({
        "method": "ngram",
        "numSpeculativeTokens": 3
    }))
    .unwrap();
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    let at = args.iter().position(|a| a == "--speculative").unwrap();
    assert_eq!(
        &args[at..at + 4],
        ["--speculative", "ngram", "--num-speculative-tokens", "3"]
    );
    assert!(!args.iter().any(|a| a == "--draft-model"));
}

#[test]
fn a_draft_model_is_downloaded_into_its_own_volume_and_passed_to_the_worker() {
    let mut m = llama();
    let src = m.spec.source().unwrap();
    m.spec.runtime.speculative = serde_json::from_value(serde_json::json!({
        "method": "draft",
        "draftModel": {
            "uri": "hf://org/small/small-Q4_0.gguf",
            "revision": "v1",
            "cacheVolumeClaim": "draft-cache"
        }
    }))
    .unwrap();
    m.spec.validate(tidal_crds::ColdStart::ASSUMED).unwrap();
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    let at = args.iter().position(|a| a == "--speculative").unwrap();
    assert_eq!(
        &args[at..at + 4],
        [
            "--speculative",
            "draft",
            "--draft-model",
            "/draft-model/small-Q4_0.gguf"
        ]
    );
    let d = build(&m, &src, CapacityType::Spot, 1, &cfg());
    let spec = pod_spec(&d);
    let init = spec.init_containers.as_ref().unwrap();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["fetch-model", "fetch-draft-model"]);
    let env: BTreeMap<&str, Option<&str>> = init[1]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(env["MODELS_DIR"], Some(DRAFT_MODEL_DIR));
    assert_eq!(env["MODEL_FILE"], Some("small-Q4_0.gguf"));
    assert_eq!(
        env["MODEL_URL"],
        Some("https://huggingface.co/org/small/resolve/v1/small-Q4_0.gguf")
    );
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "draft-model")
        .unwrap();
    assert_eq!(
        volume.persistent_volume_claim.as_ref().unwrap().claim_name,
        "draft-cache"
    );
    let worker = &spec.containers[0];
    assert!(worker
        .volume_mounts
        .iter()
        .flatten()
        .any(|v| v.name == "draft-model" && v.mount_path == DRAFT_MODEL_DIR));

    // A draft in the image needs no download; a draft method without one is refused.
    m.spec.runtime.speculative = serde_json::from_value(serde_json::json!({
        "method": "draft",
        "draftModel": {"uri": "file:///opt/small.gguf"}
    }))
    .unwrap();
    let args = worker_args(&m, &src, CapacityType::Spot, &cfg());
    assert!(args
        .windows(2)
        .any(|w| w == ["--draft-model", "/opt/small.gguf"]));
    let d = build(&m, &src, CapacityType::Spot, 1, &cfg());
    assert_eq!(pod_spec(&d).init_containers.as_ref().unwrap().len(), 1);
    m.spec.runtime.speculative =
        serde_json::from_value(serde_json::json!({"method": "draft"})).unwrap();
    let e = m.spec.validate(tidal_crds::ColdStart::ASSUMED).unwrap_err();
    assert!(e.to_string().contains("draftModel"), "{e}");
}
