//! A warm model pool on a real API server (`scripts/cluster.sh`; skipped with a message when
//! `KUBECONFIG` is unset): a `ModelPool` with one worker and three Models in it, `tidal
//! controller`, `tidal gateway` and `tidal billing` running, the node simulator of
//! `tests/cluster` binding pods and making them Ready, and a `tidal runtime --pool` process
//! for the Ready pod, started with the pod's own arguments.
//!
//! Traffic goes to each Model in turn. The one pool worker serves all three: the controller
//! assigns each model to it when its request is queued and takes the previous one away
//! once it has idled for `idleUnloadAfterSeconds`, and the worker loads and unloads them
//! without restarting. No pod starts or stops during the turns; the pool's status lists the worker and the
//! model it holds; what `tidal billing` charges for each Model is what its client received.

mod chart_common;
mod chart_rbac;
mod cluster;
mod crd_setup;
mod k8s_common;
mod process;
mod skip;

use std::time::{Duration, Instant};

use cluster::{Capacity, Cloud, NodeSim, Pool, SimConfig, SimEvent};
use k8s_common::{client_or_skip, show_kubectl, stream_chat, PodWorkers, Stack};
use process::{default_model, eventually};
use serde_json::{json, Value};

/// Bound to Ready of a simulated pod, before its worker process starts.
const COLD_START: Duration = Duration::from_millis(500);
/// Seconds an idle model stays on the worker.
const IDLE_UNLOAD_AFTER_SECONDS: u64 = 5;
/// Generous limits for a noisy two-core machine.
const LIMIT: Duration = Duration::from_secs(90);
const MODELS: [&str; 3] = ["alpha", "beta", "gamma"];

/// The pool: one on-demand CPU worker, always up, that may hold every model at once.
fn pool() -> Value {
    json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "cpu-pool"},
        "spec": {
            "runtime": {
                "image": "ghcr.io/tidal/tidal:0.1.0",
                "extraArgs": ["--threads", "1", "--kv-cache-memory", "64MiB", "--max-num-seqs", "4"],
            },
            "resources": {"cpu": "1", "memory": "2Gi"},
            "workerMemoryBytes": 4u64 << 30,
            "idleUnloadAfterSeconds": IDLE_UNLOAD_AFTER_SECONDS,
            "scaling": {
                "minWorkers": 1,
                "maxWorkers": 1,
                "targetInFlightPerWorker": 4,
                "coldStartSeconds": 5,
            },
            "capacity": {
                "mode": "OnDemand",
                "onDemand": {
                    "nodeSelector": {"cloud.google.com/gke-nodepool": "ondemand"},
                    "costPerReplicaHourMicros": 980000,
                },
            },
            "cache": {"hostPath": "/var/lib/tidal/model-cache"},
            "drainTimeoutSeconds": 1,
        }
    })
}

/// A Model of the default model served by `cpu-pool`.
fn model(name: &str) -> Value {
    let file = default_model()
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "pool": "cpu-pool",
            "source": {"uri": format!("file:///models/{file}")},
            "runtime": {"image": "ghcr.io/tidal/tidal:0.1.0"},
            "scaling": {"maxQueueWaitSeconds": 120},
            "pricing": {
                "currency": "USD",
                "inputPerMillionMicros": 100000,
                "cachedInputPerMillionMicros": 50000,
                "outputPerMillionMicros": 400000,
            },
        }
    })
}

/// A greedy streamed chat request of exactly `tokens` tokens, with usage in the last chunk.
fn chat(model: &str, tokens: u64) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name one sea."}],
        "max_tokens": tokens,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// The models the pool's worker holds now, as its heartbeat says.
async fn held(stack: &Stack, pool_id: &str) -> Vec<(String, Vec<String>)> {
    stack
        .broker
        .pool_workers(pool_id)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|b| {
            let mut models: Vec<String> = b.loaded.iter().map(|l| l.model.clone()).collect();
            models.sort();
            (b.worker, models)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pool_worker_serves_three_models_in_turn_without_a_pod_start() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let stack = Stack::start(client, "pool").await;
    let ns = stack.ns.clone();
    let pool_id = format!("{ns}/cpu-pool");
    let workers = PodWorkers::new(&default_model(), stack.broker.clone(), stack.dir.path());
    let mut config = SimConfig::new(
        &format!("k8s{}-pool", std::process::id()),
        &[stack.ns.as_str()],
    );
    config.pools = vec![Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1).size("4", "16Gi")];
    config.cold_start = COLD_START;
    config.on_start = Some(workers.on_start());
    config.on_stop = Some(workers.on_stop());
    let sim = NodeSim::start(stack.client.clone(), config)
        .await
        .expect("start the node simulator");
    let mut events = sim.events();

    for name in MODELS {
        stack.create_model(model(name)).await;
    }
    stack.create_pool(pool()).await;
    // the pool's floor of one worker starts with every Model's file (a Model the pool's
    // cache saw late rolls the pods once more); its worker heartbeats before the pod is Ready
    let worker = eventually(
        "the pool's worker Ready with the three models",
        LIMIT,
        || async {
            let running = workers.running();
            let beats = stack.broker.pool_workers(&pool_id).await.ok()?;
            let beat = beats.iter().find(|b| running == vec![b.worker.clone()])?;
            (beat.cached.len() == MODELS.len()).then(|| beat.worker.clone())
        },
    )
    .await;
    for name in MODELS {
        stack.wait_published(name).await;
    }
    // from here on, no pod starts or stops
    while events.try_recv().is_ok() {}
    let stopped_before = workers.stopped().len();
    show_kubectl(&["get", "modelpools,models", "-n", &ns]);

    for (turn, name) in MODELS.iter().enumerate() {
        let id = stack.model_id(name);
        let sent = Instant::now();
        let streamed = stream_chat(&stack.gateway, &stack.key, chat(&id, 8), None).await;
        assert_eq!(streamed.finish.as_deref(), Some("length"), "{streamed:?}");
        assert_eq!(streamed.completion_tokens, 8, "{streamed:?}");
        eprintln!(
            "k8s-pool-e2e: turn {turn}: {id} answered in {:.2} s (queued, assigned, loaded, generated)",
            sent.elapsed().as_secs_f64()
        );
        // its heartbeat (every second) shows the model loaded until it idles out
        eventually(
            &format!("{id} loaded on {worker}"),
            Duration::from_secs(4),
            || async {
                let now_held = held(&stack, &pool_id).await;
                now_held
                    .iter()
                    .any(|(w, models)| w == &worker && models.contains(&id))
                    .then_some(())
            },
        )
        .await;
        // the pool's status shows the worker and what it holds
        let status = eventually(
            "the pool status lists the worker's model",
            LIMIT,
            || async {
                let status = stack.pool("cpu-pool").await?.status?;
                status
                    .workers
                    .iter()
                    .any(|w| w.name == worker && w.models.contains(&id))
                    .then_some(status)
            },
        )
        .await;
        assert_eq!(status.ready_workers, 1, "{status:?}");
        // the model idles out before the next turn: the worker holds nothing again
        eventually(&format!("{id} unloaded once idle"), LIMIT, || async {
            let now_held = held(&stack, &pool_id).await;
            now_held
                .iter()
                .all(|(_, models)| models.is_empty())
                .then_some(())
        })
        .await;
    }
    show_kubectl(&["get", "modelpools", "-n", &ns, "-o", "wide"]);

    // one pod for all three: the simulator started no other, the worker never stopped
    assert_eq!(workers.running(), vec![worker.clone()]);
    assert_eq!(workers.stopped().len(), stopped_before, "a worker stopped");
    let mut bound = 0;
    while let Ok(e) = events.try_recv() {
        if matches!(e, SimEvent::Bound(_)) {
            bound += 1;
        }
    }
    assert_eq!(bound, 0, "pods bound during the turns: {bound}");

    // each Model's tokens are billed to it, as for a Model with its own fleet
    for name in MODELS {
        stack.wait_billed(name).await;
    }
    let segments = stack.billed_segments();
    for name in MODELS {
        let id = stack.model_id(name);
        let of: Vec<_> = segments.iter().filter(|s| s.model == id).collect();
        assert_eq!(of.len(), 1, "{segments:?}");
        assert_eq!(of[0].completion_tokens, 8, "{segments:?}");
        assert_eq!(of[0].worker, worker, "{segments:?}");
    }
    sim.shutdown().await.expect("stop the simulator");
    stack.teardown().await;
}
