//! `helm install` of the chart on a real cluster, with the example Model: runs only when
//! `helm` is on PATH and `KUBECONFIG` is set (skipped with a message otherwise).
//!
//! In a fresh namespace it starts a throwaway Redis and PostgreSQL, installs the chart with
//! `--wait` (so every pod passed its probes: the roles reached the ledger and Redis), checks
//! that one controller replica holds the leader Lease and that the controller reconciled the
//! example Model into its worker Deployment, deletes the Model and sees the finaliser let it
//! go, then uninstalls. The cluster needs the image: `TIDAL_E2E_IMAGE` (default
//! `tidal:<version>`, e.g. `docker build -t tidal:0.1.0 . && kind load docker-image
//! tidal:0.1.0`); `TIDAL_E2E_REDIS_IMAGE` and `TIDAL_E2E_POSTGRES_IMAGE` override the
//! database images.

mod process;
mod skip;

mod chart_common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use chart_common::*;
use process::eventually;
use serde_json::{json, Value};
use tidal_controller::k8s_openapi::api::apps::v1::Deployment;
use tidal_controller::k8s_openapi::api::coordination::v1::Lease;
use tidal_controller::k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use tidal_controller::kube::api::{Api, DeleteParams, ListParams, PostParams};
use tidal_controller::kube::Client;
use tidal_crds::Model;

fn helm_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("helm"))
        .find(|p| p.is_file())
}

fn helm(bin: &PathBuf, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Uninstalls the release and deletes the namespace, also when the test fails.
struct Cleanup {
    helm: PathBuf,
    release: String,
    namespace: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new(&self.helm)
            .args([
                "uninstall",
                &self.release,
                "--namespace",
                &self.namespace,
                "--wait",
            ])
            .output();
        let _ = Command::new("kubectl")
            .args(["delete", "namespace", &self.namespace, "--wait=false"])
            .output();
    }
}

fn single(name: &str, image: &str, port: i32, env: Value, args: Value) -> (Deployment, Service) {
    let labels = json!({"app": name});
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": name, "image": image, "env": env, "args": args,
                    "ports": [{"containerPort": port}],
                    "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
                }]},
            },
        },
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": labels, "ports": [{"port": port, "targetPort": port}]},
    });
    (
        serde_json::from_value(deployment).expect("deployment"),
        serde_json::from_value(service).expect("service"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_platform_and_the_example_model() {
    let Some(helm_bin) = helm_on_path() else {
        skip::skip("`helm` is not on PATH (the chart end-to-end test installs the chart)");
        return;
    };
    if std::env::var_os("KUBECONFIG").is_none() {
        skip::skip("set KUBECONFIG to a disposable cluster to run the chart end-to-end test");
        return;
    }
    let version = env!("CARGO_PKG_VERSION");
    let image = std::env::var("TIDAL_E2E_IMAGE").unwrap_or_else(|_| format!("tidal:{version}"));
    // `host:port/repo` has a colon but no tag.
    let (repo, tag) = match image.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (image.as_str(), version),
    };
    let redis_image =
        std::env::var("TIDAL_E2E_REDIS_IMAGE").unwrap_or_else(|_| "redis:7-alpine".into());
    let pg_image =
        std::env::var("TIDAL_E2E_POSTGRES_IMAGE").unwrap_or_else(|_| "postgres:16-alpine".into());

    let client = Client::try_default().await.expect("kubernetes client");
    let ns = format!("tidal-chart-e2e-{}", std::process::id());
    let release = "tidal-e2e".to_string();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
        )
        .await
        .expect("creating the namespace");
    let _cleanup = Cleanup {
        helm: helm_bin.clone(),
        release: release.clone(),
        namespace: ns.clone(),
    };

    // Throwaway databases in the namespace.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    for (d, s) in [
        single(
            "redis",
            &redis_image,
            6379,
            json!([]),
            json!(["--save", "", "--appendonly", "no"]),
        ),
        single(
            "postgres",
            &pg_image,
            5432,
            json!([{"name": "POSTGRES_PASSWORD", "value": "tidal"}]),
            json!([]),
        ),
    ] {
        deployments
            .create(&PostParams::default(), &d)
            .await
            .expect("database deployment");
        services
            .create(&PostParams::default(), &s)
            .await
            .expect("database service");
    }

    // Install: --wait returns once every Deployment of the chart is available, i.e. each
    // role started, reached PostgreSQL and Redis and answers its probes.
    let chart = chart_dir();
    let set = format!(
        "image.repository={repo},image.tag={tag},\
         postgresql.url=postgres://postgres:tidal@postgres.{ns}.svc:5432/postgres,\
         redis.url=redis://redis.{ns}.svc:6379/0,exampleModel.enabled=true"
    );
    let install = helm(
        &helm_bin,
        &[
            "install",
            &release,
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            &ns,
            "--set",
            &set,
            "--wait",
            "--timeout",
            "6m",
        ],
    );
    if let Err(e) = &install {
        let pods = Command::new("kubectl")
            .args(["get", "pods", "-o", "wide", "-n", &ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!("{e}\npods:\n{pods}");
    }

    // One controller replica leads.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let holder = eventually("the leader Lease", Duration::from_secs(60), || async {
        leases
            .get_opt(&format!("{release}-controller"))
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    })
    .await;
    let controllers = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("controller pods");
    assert!(
        controllers
            .items
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(holder.as_str())),
        "the Lease holder {holder} is a controller pod"
    );

    // The example Model is reconciled: its worker Deployment exists, scaled to zero.
    let models: Api<Model> = Api::namespaced(client.clone(), &ns);
    let model_name = merged_values(&ci_values("minimal-values.yaml"))["exampleModel"]["name"]
        .as_str()
        .expect("example name")
        .to_string();
    let worker = format!("{model_name}-ondemand");
    let d = eventually(
        "the example Model's Deployment",
        Duration::from_secs(90),
        || async { deployments.get_opt(&worker).await.ok().flatten() },
    )
    .await;
    let args = d
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].args.clone());
    assert!(
        args.flatten()
            .is_some_and(|a| a.first().map(String::as_str) == Some("runtime")),
        "the workers run `tidal runtime`"
    );
    let phase = eventually("the Model's status", Duration::from_secs(60), || async {
        models
            .get_opt(&model_name)
            .await
            .ok()
            .flatten()
            .and_then(|m| serde_json::to_value(m.status?).ok())
            .and_then(|s| s["phase"].as_str().map(str::to_string))
    })
    .await;
    eprintln!("example Model phase: {phase}");

    // Deleting the Model: the finaliser (run by the controller) lets it go and the worker
    // Deployments are deleted.
    models
        .delete(&model_name, &DeleteParams::default())
        .await
        .expect("deleting the Model");
    eventually("the Model to be gone", Duration::from_secs(120), || async {
        models
            .get_opt(&model_name)
            .await
            .ok()
            .and_then(|m| m.is_none().then_some(()))
    })
    .await;
    eventually(
        "the worker Deployment to be gone",
        Duration::from_secs(60),
        || async {
            deployments
                .get_opt(&worker)
                .await
                .ok()
                .and_then(|d| d.is_none().then_some(()))
        },
    )
    .await;

    helm(
        &helm_bin,
        &["uninstall", &release, "--namespace", &ns, "--wait"],
    )
    .expect("uninstall");
}
