//! The Deployment of one capacity type of a `ModelPool` (pure): `{pool}-spot` and
//! `{pool}-ondemand`, built like a Model's ([`deployment::assemble`]) with the pool's worker
//! command and its node cache.
//!
//! The cache is mounted at [`CACHE_DIR`]: a `hostPath` directory (type `DirectoryOrCreate`)
//! or a claim. Each pool Model whose source is a download gets an init container (the
//! Model workers' fetch script) that puts the file at
//! `{CACHE_DIR}/{namespace}/{model}/{file}` and checks its SHA-256; a file already there
//! with the right checksum is kept, so the first pool pod on a node fills the node's cache
//! and later pods only verify it. The worker mounts the cache read-only; it loads a model
//! from that path when the controller assigns it. A `hostPath` directory is created by the
//! kubelet as root, and `fsGroup` does not apply to it, so a first init container gives it
//! to the workers' user (with `CAP_CHOWN` only).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, PersistentVolumeClaimVolumeSource,
    SecurityContext, Volume, VolumeMount,
};
use kube::{Resource, ResourceExt};
use tidal_crds::{CacheVolume, Model, ModelPool, Source};
use tidal_queue::CapacityType;

use crate::deployment::{
    assemble, container_security_context, fetch_container, field_env, Fetch, WorkerConfig,
    WorkerPods, WORKER_UID,
};
use crate::names::{deployment_name, model_id, pool_labels, pool_selector_labels};

/// Where the pool's node cache is mounted in its pods (the worker's `--model-dir`).
pub const CACHE_DIR: &str = "/cache";
/// Name of the cache volume.
const CACHE_VOLUME: &str = "model-cache";

/// A Model the pool serves, with its parsed source (the reconciler has validated both).
#[derive(Debug, Clone)]
pub struct PoolModel<'a> {
    /// The Model.
    pub model: &'a Model,
    /// Its `spec.source`, parsed.
    pub source: Source,
}

/// Where a pool Model's weights are in the pool's pods.
pub fn cached_path(model: &Model, source: &Source) -> String {
    match source {
        Source::File { path } => path.clone(),
        other => format!(
            "{CACHE_DIR}/{}/{}/{}",
            model.namespace().unwrap_or_default(),
            model.name_any(),
            other.file_name()
        ),
    }
}

/// The pool worker's arguments after `tidal`: besides the pool's settings, one
/// `--pool-model ID=PATH` per Model (and its `--pool-model-sha256 ID=HEX` when the source
/// gives one), so that the worker finds each model's file where the init containers put it
/// and checks it before the first load.
pub fn pool_worker_args(
    pool: &ModelPool,
    models: &[PoolModel<'_>],
    capacity: CapacityType,
    cfg: &WorkerConfig,
) -> Vec<String> {
    let ns = pool.namespace().unwrap_or_default();
    let spec = &pool.spec;
    let mut args: Vec<String> = vec![
        "runtime".into(),
        "--pool".into(),
        model_id(&ns, &pool.name_any()),
        "--model-dir".into(),
        CACHE_DIR.into(),
        "--queue".into(),
        cfg.queue_url.clone(),
        "--capacity-type".into(),
        crate::names::capacity_value(capacity).into(),
        "--drain-timeout".into(),
        format!("{}s", spec.drain_timeout_seconds),
        "--listen".into(),
        format!("0.0.0.0:{}", spec.runtime.port),
        // the worker refuses what the placement would not pack: the same memory
        "--worker-memory".into(),
        spec.worker_memory_bytes.to_string(),
    ];
    if let Some(p) = &cfg.key_prefix {
        args.extend(["--queue-prefix".into(), p.clone()]);
    }
    if spec.resources.gpus > 0 {
        args.extend(["--device".into(), "cuda".into()]);
    }
    for m in models {
        let id = model_id(&ns, &m.model.name_any());
        args.extend([
            "--pool-model".into(),
            format!("{id}={}", cached_path(m.model, &m.source)),
        ]);
        if let Some(sha) = m.source.sha256() {
            args.extend(["--pool-model-sha256".into(), format!("{id}={sha}")]);
        }
    }
    args.extend(spec.runtime.extra_args.iter().cloned());
    args
}

/// The volume of the cache.
fn cache_volume(cache: &CacheVolume) -> Volume {
    match cache {
        CacheVolume::HostPath(path) => Volume {
            name: CACHE_VOLUME.into(),
            host_path: Some(HostPathVolumeSource {
                path: path.clone(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Volume::default()
        },
        CacheVolume::Claim(claim) => Volume {
            name: CACHE_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: None,
            }),
            ..Volume::default()
        },
    }
}

/// The init container that hands a new `hostPath` directory to the workers' user.
fn cache_owner_container(image: &str) -> Container {
    Container {
        name: "cache-owner".into(),
        image: Some(image.to_string()),
        command: Some(vec![
            "chown".into(),
            format!("{WORKER_UID}:{WORKER_UID}"),
            CACHE_DIR.into(),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: CACHE_VOLUME.into(),
            mount_path: CACHE_DIR.into(),
            ..VolumeMount::default()
        }]),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["CHOWN".into()]),
            }),
            ..container_security_context()
        }),
        ..Container::default()
    }
}

/// The Deployment of `capacity` for `pool` with `replicas` workers; `cache` is its parsed
/// `spec.cache`, `models` the Models it serves in name order (the reconciler has validated
/// them all).
pub fn build_pool(
    pool: &ModelPool,
    cache: &CacheVolume,
    models: &[PoolModel<'_>],
    capacity: CapacityType,
    replicas: u32,
    cfg: &WorkerConfig,
) -> Deployment {
    let name = pool.name_any();
    let spec = &pool.spec;
    let mut init = Vec::new();
    if matches!(cache, CacheVolume::HostPath(_)) {
        init.push(cache_owner_container(&spec.runtime.fetch_image));
    }
    for m in models {
        let Some(url) = m.source.download_url() else {
            continue;
        };
        let path = cached_path(m.model, &m.source);
        let dir = path
            .rsplit_once('/')
            .map_or(CACHE_DIR.to_string(), |(dir, _)| dir.to_string());
        let fetch = Fetch {
            // Model names are at most 54 characters: this fits a container name's 63
            name: format!("fetch-{}", m.model.name_any()),
            volume: CACHE_VOLUME,
            mount: CACHE_DIR,
            dir,
            source: &m.source,
            url,
            token: m.model.spec.source.token_secret.as_ref(),
        };
        init.push(fetch_container(&spec.runtime.fetch_image, fetch));
    }
    let capacity_pool = match capacity {
        CapacityType::Spot => &spec.capacity.spot,
        CapacityType::OnDemand => &spec.capacity.on_demand,
    };
    assemble(
        WorkerPods {
            name: deployment_name(&name, capacity),
            namespace: pool.namespace(),
            owner: pool.controller_owner_ref(&()),
            labels: pool_labels(&name, capacity),
            selector: pool_selector_labels(&name, capacity),
            image: spec.runtime.image.clone(),
            args: pool_worker_args(pool, models, capacity, cfg),
            // the node name tells the controller which workers share a node cache
            env: vec![
                field_env("POD_NAME", "metadata.name"),
                field_env("NODE_NAME", "spec.nodeName"),
            ],
            port: spec.runtime.port,
            resources: &spec.resources,
            pool: capacity_pool,
            drain_timeout_seconds: spec.drain_timeout_seconds,
            init,
            volumes: vec![cache_volume(cache)],
            mounts: vec![VolumeMount {
                name: CACHE_VOLUME.into(),
                mount_path: CACHE_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            }],
        },
        replicas,
    )
}

#[cfg(test)]
#[path = "pool_deployment_tests.rs"]
mod tests;
