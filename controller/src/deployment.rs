//! The Deployment of one capacity type of a Model (pure): the worker command, probes, drain
//! budget, resources and scheduling. The reconciler server-side-applies what this returns.
//!
//! Workers pull from the queue, so the pods need no Service. A worker that gets SIGTERM
//! stops claiming, finishes or re-enqueues its sequences within `--drain-timeout`, so the
//! grace period is the drain timeout plus [`GRACE_MARGIN_SECONDS`] for the preStop hook and
//! exit. `https://` and `hf://` weights are downloaded by an init container into `/models`
//! (an emptyDir, or the spec's cache claim) and checked against their SHA-256; a draft model
//! for speculative decoding likewise into `/draft-model`, a volume of its own.
//!
//! The pods are locked down like the chart's own: user and group [`WORKER_UID`] (the image's
//! `nonroot` user), a read-only root filesystem with an emptyDir on `/tmp`, no capabilities,
//! no privilege escalation, the `RuntimeDefault` seccomp profile and no API token. The worker
//! writes nothing to disk (the weights are memory-mapped read-only); only the init container
//! writes, into `/models`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, TCPSocketAction,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use tidal_crds::{
    Capacity, CapacityPool, Model, ModelSource, Resources, RuntimeSettings, SecretKeyRef, Source,
};
use tidal_queue::CapacityType;

use crate::names::{capacity_value, deployment_name, labels, model_id, selector_labels};

/// Seconds added to the drain timeout for the termination grace period.
pub const GRACE_MARGIN_SECONDS: i64 = 15;
/// Where downloaded weights live in the pod.
pub const MODELS_DIR: &str = "/models";
/// Where a downloaded draft model (`runtime.speculative.draftModel`) lives in the pod: a
/// volume of its own, so that its file name and cache claim never clash with the model's.
pub const DRAFT_MODEL_DIR: &str = "/draft-model";
/// User and group id of the worker pods: distroless's `nonroot`, the `USER` of the Dockerfile
/// and the chart's `podSecurityContext`.
pub const WORKER_UID: i64 = 65532;
/// The writable scratch directory on the read-only root filesystem.
pub const TMP_DIR: &str = "/tmp";
/// Size limit of the `/tmp` emptyDir (the chart's pods use the same).
pub const TMP_SIZE_LIMIT: &str = "64Mi";
/// Default node label carrying the GPU model (NVIDIA GPU feature discovery).
pub const DEFAULT_GPU_TYPE_LABEL: &str = "nvidia.com/gpu.product";
/// Default extended resource of a GPU.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Settings of the workers that come from the controller, not from the Model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Redis URL the workers use (`--queue`).
    pub queue_url: String,
    /// Broker key prefix (the worker's `--queue-prefix`), when not the default `tidal:`.
    pub key_prefix: Option<String>,
}

/// The worker's arguments after `tidal` (the container's command is `tidal`).
pub fn worker_args(
    model: &Model,
    source: &Source,
    capacity: CapacityType,
    cfg: &WorkerConfig,
) -> Vec<String> {
    let ns = model.namespace().unwrap_or_default();
    let rt = &model.spec.runtime;
    let path = match source {
        Source::File { path } => path.clone(),
        other => format!("{MODELS_DIR}/{}", other.file_name()),
    };
    let mut args: Vec<String> = [
        "runtime",
        "--model",
        &path,
        "--queue",
        &cfg.queue_url,
        "--model-id",
        &model_id(&ns, &model.name_any()),
        "--capacity-type",
        capacity_value(capacity),
        "--drain-timeout",
        &format!("{}s", model.spec.drain_timeout_seconds),
        "--listen",
        &format!("0.0.0.0:{}", rt.port),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(p) = &cfg.key_prefix {
        args.extend(["--queue-prefix".into(), p.clone()]);
    }
    // The container sees the GPUs it was given from number 0; the engine runs on one.
    if model.spec.resources.gpus > 0 {
        args.extend(["--device".into(), "cuda".into()]);
    }
    if let Some(n) = rt.max_sequences {
        args.extend(["--max-num-seqs".into(), n.to_string()]);
    }
    if let Some(n) = rt.token_budget {
        args.extend(["--max-num-batched-tokens".into(), n.to_string()]);
    }
    if let Some(m) = &rt.kv_cache_memory {
        args.extend(["--kv-cache-memory".into(), m.clone()]);
    }
    if let Some(q) = rt.quantisation {
        args.extend(["--quantize".into(), q.as_arg().into()]);
    }
    if let Some(spec) = &rt.speculative {
        let draft = draft_source(model).map(|(source, _)| match source {
            Source::File { path } => path,
            other => format!("{DRAFT_MODEL_DIR}/{}", other.file_name()),
        });
        args.extend(spec.args(draft.as_deref()));
    }
    args.extend(rt.extra_args.iter().cloned());
    args
}

/// The parsed draft model of `runtime.speculative` and its spec, when method `draft` names
/// one (the reconciler has validated the spec).
fn draft_source(model: &Model) -> Option<(Source, &ModelSource)> {
    let source = model.spec.draft_source().ok().flatten()?;
    let spec = model
        .spec
        .runtime
        .speculative
        .as_ref()?
        .draft_model
        .as_ref()?;
    Some((source, spec))
}

/// Shell script of the init container that downloads the weights (idempotent: a cached file
/// with the right checksum is kept).
pub(crate) const FETCH_SCRIPT: &str = r#"set -eu
f="$MODELS_DIR/$MODEL_FILE"
if [ -f "$f" ]; then
  if [ -z "${MODEL_SHA256:-}" ]; then exit 0; fi
  if echo "$MODEL_SHA256  $f" | sha256sum -c - >/dev/null 2>&1; then exit 0; fi
fi
tmp="$f.part.$HOSTNAME"
if [ -n "${MODEL_TOKEN:-}" ]; then
  curl -fsSL --retry 5 -H "Authorization: Bearer $MODEL_TOKEN" -o "$tmp" "$MODEL_URL"
else
  curl -fsSL --retry 5 -o "$tmp" "$MODEL_URL"
fi
if [ -n "${MODEL_SHA256:-}" ]; then echo "$MODEL_SHA256  $tmp" | sha256sum -c -; fi
mv "$tmp" "$f"
"#;

/// The pod-level security context of the worker pods.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(WORKER_UID),
        run_as_group: Some(WORKER_UID),
        // Makes an emptyDir or the cache claim writable for the init container.
        fs_group: Some(WORKER_UID),
        // A cache claim can hold many GiB of weights: chown it once, not on every pod start.
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// The security context of every container of the worker pods.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

pub(crate) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// An environment variable set from a field of the pod (`metadata.name`, `spec.nodeName`).
pub(crate) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The worker's environment: its pod name, and the Model's shared prefixes (as an
/// environment variable rather than an argument: they may be long texts).
fn worker_env(rt: &RuntimeSettings) -> Vec<EnvVar> {
    let mut envs = vec![field_env("POD_NAME", "metadata.name")];
    if let Some(json) = rt.shared_prefixes_json() {
        envs.push(env("TIDAL_SHARED_PREFIXES", &json));
    }
    envs
}

/// One download of an init container: what, from where, into which volume.
pub(crate) struct Fetch<'a> {
    /// Container name.
    pub name: String,
    /// Volume mounted at `mount`.
    pub volume: &'static str,
    /// Where the volume is mounted.
    pub mount: &'static str,
    /// The directory the file goes to (`mount` or below it; created when missing).
    pub dir: String,
    pub source: &'a Source,
    pub url: String,
    pub token: Option<&'a SecretKeyRef>,
}

/// The init container that downloads `fetch` with `image` (the script keeps a cached file
/// whose checksum matches).
pub(crate) fn fetch_container(image: &str, fetch: Fetch<'_>) -> Container {
    // A Model's own volume is its directory; a pool's cache has one directory per Model.
    let script = if fetch.dir == fetch.mount {
        FETCH_SCRIPT.to_string()
    } else {
        format!("mkdir -p \"$MODELS_DIR\"\n{FETCH_SCRIPT}")
    };
    let mut envs = vec![
        env("MODELS_DIR", &fetch.dir),
        env("MODEL_FILE", fetch.source.file_name()),
        env("MODEL_URL", &fetch.url),
    ];
    if let Some(sha) = fetch.source.sha256() {
        envs.push(env("MODEL_SHA256", sha));
    }
    if let Some(secret) = fetch.token {
        envs.push(EnvVar {
            name: "MODEL_TOKEN".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    Container {
        name: fetch.name,
        image: Some(image.to_string()),
        command: Some(vec!["sh".into(), "-c".into(), script]),
        env: Some(envs),
        volume_mounts: Some(vec![VolumeMount {
            name: fetch.volume.into(),
            mount_path: fetch.mount.into(),
            ..VolumeMount::default()
        }]),
        security_context: Some(container_security_context()),
        ..Container::default()
    }
}

/// The volume a download goes to: the source's cache claim, else an emptyDir.
fn download_volume(name: &str, claim: Option<&String>) -> Volume {
    match claim {
        Some(claim) => Volume {
            name: name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: None,
            }),
            ..Volume::default()
        },
        None => Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    }
}

fn resources(r: &Resources) -> ResourceRequirements {
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if r.gpus > 0 {
        let key = r
            .gpu_resource
            .clone()
            .unwrap_or_else(|| DEFAULT_GPU_RESOURCE.into());
        limits.insert(key, Quantity(r.gpus.to_string()));
    }
    for (key, value) in [("cpu", &r.cpu), ("memory", &r.memory)] {
        if let Some(v) = value {
            requests.insert(key.to_string(), Quantity(v.clone()));
            limits.insert(key.to_string(), Quantity(v.clone()));
        }
    }
    ResourceRequirements {
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!requests.is_empty()).then_some(requests),
        ..ResourceRequirements::default()
    }
}

fn pool(c: &Capacity, capacity: CapacityType) -> &CapacityPool {
    match capacity {
        CapacityType::Spot => &c.spot,
        CapacityType::OnDemand => &c.on_demand,
    }
}

fn node_selector(pool: &CapacityPool, r: &Resources) -> Option<BTreeMap<String, String>> {
    let mut sel = pool.node_selector.clone();
    if let Some(gpu) = &r.gpu_type {
        let label = r
            .gpu_type_label
            .clone()
            .unwrap_or_else(|| DEFAULT_GPU_TYPE_LABEL.into());
        sel.insert(label, gpu.clone());
    }
    (!sel.is_empty()).then_some(sel)
}

/// The Deployment of `capacity` for `model` with `replicas` replicas. `source` is the parsed
/// `spec.source` (the reconciler has validated the spec).
pub fn build(
    model: &Model,
    source: &Source,
    capacity: CapacityType,
    replicas: u32,
    cfg: &WorkerConfig,
) -> Deployment {
    let name = model.name_any();
    let rt = &model.spec.runtime;
    let mut mounts = vec![];
    let mut volumes = vec![];
    let mut init = vec![];
    let draft = draft_source(model);
    let downloads = [
        source.download_url().map(|url| {
            let fetch = Fetch {
                name: "fetch-model".into(),
                volume: "models",
                mount: MODELS_DIR,
                dir: MODELS_DIR.into(),
                source,
                url,
                token: model.spec.source.token_secret.as_ref(),
            };
            (fetch, model.spec.source.cache_volume_claim.as_ref())
        }),
        draft.as_ref().and_then(|(draft, spec)| {
            let fetch = Fetch {
                name: "fetch-draft-model".into(),
                volume: "draft-model",
                mount: DRAFT_MODEL_DIR,
                dir: DRAFT_MODEL_DIR.into(),
                source: draft,
                url: draft.download_url()?,
                token: spec.token_secret.as_ref(),
            };
            Some((fetch, spec.cache_volume_claim.as_ref()))
        }),
    ];
    for (fetch, claim) in downloads.into_iter().flatten() {
        mounts.push(VolumeMount {
            name: fetch.volume.into(),
            mount_path: fetch.mount.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(download_volume(fetch.volume, claim));
        init.push(fetch_container(&rt.fetch_image, fetch));
    }
    assemble(
        WorkerPods {
            name: deployment_name(&name, capacity),
            namespace: model.namespace(),
            owner: model.controller_owner_ref(&()),
            labels: labels(&name, capacity),
            selector: selector_labels(&name, capacity),
            image: rt.image.clone(),
            args: worker_args(model, source, capacity, cfg),
            env: worker_env(rt),
            port: rt.port,
            resources: &model.spec.resources,
            pool: pool(&model.spec.capacity, capacity),
            drain_timeout_seconds: model.spec.drain_timeout_seconds,
            init,
            volumes,
            mounts,
        },
        replicas,
    )
}

/// What tells one fleet's worker pods from another's: a Model's, or a `ModelPool`'s.
pub(crate) struct WorkerPods<'a> {
    /// Deployment name.
    pub name: String,
    pub namespace: Option<String>,
    /// The owning resource (the Deployment goes with it).
    pub owner: Option<OwnerReference>,
    /// Labels of the Deployment and its pods.
    pub labels: BTreeMap<String, String>,
    /// The Deployment's selector.
    pub selector: BTreeMap<String, String>,
    pub image: String,
    /// Arguments after `tidal`.
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    /// Port of `/health`, `/drain` and `/metrics`.
    pub port: u16,
    pub resources: &'a Resources,
    /// Scheduling of the capacity type.
    pub pool: &'a CapacityPool,
    pub drain_timeout_seconds: u32,
    /// Init containers, in order.
    pub init: Vec<Container>,
    /// Volumes besides `/tmp`.
    pub volumes: Vec<Volume>,
    /// The worker's mounts besides `/tmp`.
    pub mounts: Vec<VolumeMount>,
}

/// The Deployment of worker pods with `replicas` replicas: the worker container with its
/// probes, drain hook and resources, the locked-down pod, scheduling and grace period that
/// every fleet's workers share.
pub(crate) fn assemble(w: WorkerPods<'_>, replicas: u32) -> Deployment {
    let WorkerPods {
        mut mounts,
        mut volumes,
        ..
    } = w;
    let port = i32::from(w.port);
    let port_ref = IntOrString::String("http".into());
    mounts.push(VolumeMount {
        name: "tmp".into(),
        mount_path: TMP_DIR.into(),
        ..VolumeMount::default()
    });
    volumes.push(Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(TMP_SIZE_LIMIT.into())),
            medium: None,
        }),
        ..Volume::default()
    });
    let worker = Container {
        name: "worker".into(),
        image: Some(w.image),
        command: Some(vec!["tidal".into()]),
        args: Some(w.args),
        env: Some(w.env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        // Ready once the model is loaded and the worker claims work.
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".into()),
                port: port_ref.clone(),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        // Alive while it listens: loading a large model must not count as a failure.
        liveness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: port_ref.clone(),
                host: None,
            }),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..Probe::default()
        }),
        // Start draining before SIGTERM: the worker stops claiming and answers once its
        // sequences are finished or re-enqueued.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                http_get: Some(HTTPGetAction {
                    path: Some("/drain".into()),
                    port: port_ref,
                    ..HTTPGetAction::default()
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        resources: Some(resources(w.resources)),
        volume_mounts: Some(mounts),
        security_context: Some(container_security_context()),
        ..Container::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(w.name),
            namespace: w.namespace,
            labels: Some(w.labels.clone()),
            owner_references: w.owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(i32::try_from(replicas).unwrap_or(i32::MAX)),
            selector: LabelSelector {
                match_labels: Some(w.selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(w.labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![worker],
                    init_containers: (!w.init.is_empty()).then_some(w.init),
                    volumes: Some(volumes),
                    security_context: Some(pod_security_context()),
                    // Workers talk to the queue, never to the Kubernetes API.
                    automount_service_account_token: Some(false),
                    node_selector: node_selector(w.pool, w.resources),
                    tolerations: (!w.pool.tolerations.is_empty())
                        .then(|| w.pool.tolerations.clone()),
                    termination_grace_period_seconds: Some(
                        i64::from(w.drain_timeout_seconds) + GRACE_MARGIN_SECONDS,
                    ),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
#[path = "deployment_tests.rs"]
mod tests;
