//! `tidal controller` on a real cluster: runs only when `KUBECONFIG` is set (skipped with a
//! message otherwise). Applies the CRD and a Model in a fresh namespace, runs the controller
//! binary against local Redis and a SQLite ledger, sees both Deployments created, fills the
//! model's queue and sees the on-demand replicas follow it, then deletes the Model and sees
//! the finaliser fail the queued jobs.

mod crd_setup;
mod process;
mod skip;

use std::process::{Command, Stdio};
use std::time::Duration;

use process::{eventually, KillOnDrop as Killed};
use serde_json::json;
use tidal_controller::k8s_openapi::api::apps::v1::Deployment;
use tidal_controller::k8s_openapi::api::core::v1::Namespace;
use tidal_controller::kube::api::{Api, DeleteParams, PostParams};
use tidal_controller::kube::Client;
use tidal_crds::Model;
use tidal_queue::{Broker, BrokerConfig, Job, RedisBroker, ResponseEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_queue_on_a_real_cluster() {
    if std::env::var_os("KUBECONFIG").is_none() {
        skip::skip("set KUBECONFIG to a disposable cluster to run the controller end-to-end test");
        return;
    }
    let redis = tidal_queue::testing::ensure_redis().await.expect("redis");
    let client = Client::try_default().await.expect("kubernetes client");
    let ns = format!("tidal-e2e-{}", std::process::id());
    let prefix = format!("tidal-e2e-{}:", std::process::id());

    crd_setup::apply_crds(&client, "tidal-e2e").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");

    let ledger = tempfile::NamedTempFile::new().unwrap();
    let _controller = Killed(
        Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args([
                "controller",
                "--redis",
                &redis,
                "--ledger",
                &format!("sqlite:{}", ledger.path().display()),
                "--key-prefix",
                &prefix,
                "--namespace",
                &ns,
                "--metrics-listen",
                "127.0.0.1:0",
                "--tick-secs",
                "1",
            ])
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tidal controller"),
    );

    let image =
        std::env::var("TIDAL_E2E_IMAGE").unwrap_or_else(|_| "ghcr.io/tidal/tidal:0.1.0".into());
    let model: Model = serde_json::from_value(json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": "e2e", "namespace": ns},
        "spec": {
            "source": {"uri": "file:///models/m.gguf"},
            "runtime": {"image": image},
            "scaling": {"maxReplicas": 3, "targetInFlightPerReplica": 1, "scaleToZeroAfterSeconds": 30},
            "capacity": {"mode": "OnDemand"},
            "pricing": {"inputPerMillionMicros": 1, "cachedInputPerMillionMicros": 1, "outputPerMillionMicros": 2}
        }
    }))
    .unwrap();
    let models: Api<Model> = Api::namespaced(client.clone(), &ns);
    models
        .create(&PostParams::default(), &model)
        .await
        .expect("create the Model");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let replicas = |name: &'static str| {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.spec?.replicas)
        }
    };
    eventually("both Deployments", Duration::from_secs(60), || async {
        (replicas("e2e-spot").await == Some(0) && replicas("e2e-ondemand").await == Some(0))
            .then_some(())
    })
    .await;
    // the time constants the spec leaves out are sized on a cold start: the assumed one,
    // or the one measured once a replica has been Ready; the one it gives stands
    eventually(
        "the time constants in the status",
        Duration::from_secs(60),
        || async {
            let status = models.get("e2e").await.ok()?.status?;
            let constants = status.time_constants?;
            assert_eq!(constants.scale_to_zero_after_seconds, 30);
            assert_ne!(
                constants.cold_start_source,
                tidal_crds::ColdStartSource::Spec,
                "{constants:?}"
            );
            Some(())
        },
    )
    .await;

    let broker = RedisBroker::connect(
        &redis,
        BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        },
    )
    .await
    .unwrap();
    let id = format!("{ns}/e2e");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let job = Job {
            id: uuid::Uuid::now_v7(),
            tenant: "e2e".into(),
            model: id.clone(),
            body: json!({"prompt": "hi", "max_tokens": 1}),
            enqueued_at_ms: now_ms,
            deadline_ms: now_ms + 600_000,
            resume: None,
        };
        broker.enqueue(&job).await.unwrap();
        jobs.push(job);
    }
    eventually(
        "on-demand replicas to follow the queue",
        Duration::from_secs(60),
        || async { (replicas("e2e-ondemand").await == Some(3)).then_some(()) },
    )
    .await;
    assert_eq!(replicas("e2e-spot").await, Some(0));

    models
        .delete("e2e", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the finaliser to finish",
        Duration::from_secs(120),
        || async { models.get_opt("e2e").await.ok()?.is_none().then_some(()) },
    )
    .await;
    for job in &jobs {
        let events = broker
            .read_responses(job.id, 0, 10, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            matches!(events.as_slice(), [ResponseEvent::Error { code, .. }] if code == "model_not_found"),
            "{events:?}"
        );
    }
    assert_eq!(broker.model(&id).await.unwrap(), None);

    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    tidal_queue::testing::delete_prefix(&redis, &prefix);
}
