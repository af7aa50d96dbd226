//! Scaling on a real API server, from the user's side (`scripts/cluster.sh`; skipped with a
//! message when `KUBECONFIG` is unset): a Model applied, `tidal controller`, `tidal gateway`
//! and `tidal billing` running, the node simulator of `tests/cluster` binding pods and making
//! them Ready, and a `tidal runtime --queue` process for each Ready pod, started with the
//! pod's own arguments and stopped with SIGTERM when the pod is deleted.
//!
//! - From zero and back: a streamed request through the gateway scales the on-demand
//!   Deployment up, the pod's worker answers, and the idle Model goes back to zero after its
//!   `scaleToZeroAfterSeconds`. Prints the time from enqueue to the scale-up patch.
//! - Spot: with no spot node, on-demand stands in after `fallbackAfterSeconds`; a spot node
//!   added, replicas move back to spot; the spot node interrupted in the middle of a long
//!   stream, on-demand stands in, the spot worker drains (SIGTERM) and re-enqueues, and the
//!   client's stream completes identical to the uninterrupted answer; spot back, replicas
//!   move back. What `tidal billing` charges is what the client received.
//!
//! With `$TIDAL_KUBECTL` set (`bash scripts/kubectl-venv.sh`), `kubectl get models` and
//! `kubectl describe model` are printed along the way.

mod chart_common;
mod chart_rbac;
mod cluster;
mod crd_setup;
mod k8s_common;
mod process;
mod skip;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster::{Capacity, Cloud, NodeSim, Pool, SimConfig, SimEvent};
use k8s_common::{
    client_or_skip, first_enqueued, secs, show_kubectl, stream_chat, PodWorkers, Segment, Stack,
    Streamed, Timeline,
};
use process::{default_model, eventually};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// Interruption notice of the simulated spot nodes (GKE gives 30 s).
const NOTICE: Duration = Duration::from_secs(1);
/// Bound to Ready of a simulated pod, before its worker process starts.
const COLD_START: Duration = Duration::from_millis(500);
/// The spot scenario's `fallbackAfterSeconds`.
const FALLBACK_AFTER_SECONDS: u64 = 3;
/// The scale-to-zero scenario's `scaleToZeroAfterSeconds`.
const SCALE_TO_ZERO_AFTER_SECONDS: u64 = 4;
/// Tokens of the spot scenario's long stream: long enough to outlast the notice and the
/// drain timeout after its first token on this machine's default model (about 20-40 tokens
/// per second).
const LONG_STREAM_TOKENS: u64 = 256;
/// Generous limits for a noisy two-core machine.
const SCALE_LIMIT: Duration = Duration::from_secs(60);

/// A Model of the default model with short time constants; `capacity` is its `capacity`.
fn model(name: &str, capacity: Value, scale_to_zero_after: u64) -> Value {
    let file = default_model()
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    json!({
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "source": {"uri": format!("file:///models/{file}")},
            "runtime": {
                "image": "ghcr.io/tidal/tidal:0.1.0",
                "kvCacheMemory": "256MiB",
                "maxSequences": 4,
                "extraArgs": ["--threads", "1"],
            },
            "resources": {"cpu": "1", "memory": "1Gi"},
            "scaling": {
                "maxReplicas": 1,
                "targetInFlightPerReplica": 1,
                "scaleToZeroAfterSeconds": scale_to_zero_after,
                "stableWindowSeconds": 6,
                "panicWindowSeconds": 2,
                "scaleDownDelaySeconds": 0,
                "maxQueueWaitSeconds": 120,
            },
            "capacity": capacity,
            "pricing": {
                "currency": "USD",
                "inputPerMillionMicros": 100000,
                "cachedInputPerMillionMicros": 50000,
                "outputPerMillionMicros": 400000,
            },
            "drainTimeoutSeconds": 1,
        }
    })
}

/// The on-demand pool's scheduling in a Model.
fn on_demand_pool() -> Value {
    json!({
        "nodeSelector": {"cloud.google.com/gke-nodepool": "ondemand"},
        "costPerReplicaHourMicros": 980000,
    })
}

/// A simulator for the stack's namespace with `pools`, whose Ready pods run workers.
async fn simulator(stack: &Stack, tag: &str, pools: Vec<Pool>, workers: &PodWorkers) -> NodeSim {
    let mut config = SimConfig::new(
        &format!("k8s{}-{tag}", std::process::id()),
        &[stack.ns.as_str()],
    );
    config.pools = pools;
    config.cold_start = COLD_START;
    config.notice = Some(NOTICE);
    config.on_start = Some(workers.on_start());
    config.on_stop = Some(workers.on_stop());
    NodeSim::start(stack.client.clone(), config)
        .await
        .expect("start the node simulator")
}

/// A greedy streamed chat request of exactly `tokens` tokens, with usage in the last chunk.
fn chat(model: &str, content: &str, tokens: u64) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// The next simulator event `want` picks, within `limit`.
async fn next_event<T>(
    events: &mut broadcast::Receiver<SimEvent>,
    limit: Duration,
    what: &str,
    mut want: impl FnMut(&SimEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(limit, async {
        loop {
            match events.recv().await {
                Ok(e) => {
                    if let Some(v) = want(&e) {
                        return v;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(e) => panic!("simulator events ended: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"))
}

/// The segments `tidal billing` recorded, per request id, once everything of Model `name`
/// is billed.
async fn billed_by_request(stack: &Stack, name: &str) -> BTreeMap<String, Vec<Segment>> {
    stack.wait_billed(name).await;
    let mut by: BTreeMap<String, Vec<Segment>> = BTreeMap::new();
    for s in stack.billed_segments() {
        by.entry(s.request_id.clone()).or_default().push(s);
    }
    by
}

/// Waits until `tidal billing` has ingested `segments` usage segments of the tenant; the
/// report then.
async fn billed(stack: &Stack, segments: u64) -> Value {
    eventually(
        &format!("{segments} usage segments billed"),
        Duration::from_secs(60),
        || async {
            let report = stack.usage_report().await;
            (report["totals"]["segments"].as_u64() == Some(segments)).then_some(report)
        },
    )
    .await
}

/// Checks the stream's shape: the whole answer, every token once.
fn complete(s: &Streamed, tokens: u64) {
    assert_eq!(s.finish.as_deref(), Some("length"), "{s:?}");
    assert_eq!(s.completion_tokens, tokens, "{s:?}");
    assert!(s.prompt_tokens > 0, "{s:?}");
    assert!(!s.content.is_empty(), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_scales_a_model_from_zero_and_idle_takes_it_back() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let stack = Stack::start(client, "zero").await;
    let ns = stack.ns.clone();
    let workers = PodWorkers::new(&default_model(), stack.broker.clone(), stack.dir.path());
    let sim = simulator(
        &stack,
        "zero",
        vec![Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1).size("4", "16Gi")],
        &workers,
    )
    .await;
    let mut events = sim.events();
    let timeline = Timeline::watch(&stack.client, &ns);
    let name = "smollm2";
    let id = stack.model_id(name);
    let deployment = format!("{name}-ondemand");
    stack
        .create_model(model(
            name,
            json!({"mode": "OnDemand", "onDemand": on_demand_pool()}),
            SCALE_TO_ZERO_AFTER_SECONDS,
        ))
        .await;
    timeline.wait(&deployment, 0, SCALE_LIMIT).await;
    stack.wait_published(name).await;
    eventually("the Model ScaledToZero", SCALE_LIMIT, || async {
        let status = stack.model(name).await?.status?;
        (status.phase == tidal_crds::Phase::ScaledToZero).then_some(())
    })
    .await;
    show_kubectl(&["get", "models", "-n", &ns]);

    // a streamed request through the gateway: enqueued, the Deployment patched up, the pod
    // bound and Ready after its cold start, its worker claims the job, the answer streams
    let enqueued = tokio::spawn(first_enqueued(
        stack.broker.clone(),
        id.clone(),
        Duration::from_secs(30),
    ));
    let sent = Instant::now();
    let request = {
        let (base, key) = (stack.gateway.clone(), stack.key.clone());
        let body = chat(&id, "Write one sentence about tides.", 24);
        tokio::spawn(async move { stream_chat(&base, &key, body, None).await })
    };
    let enqueued = enqueued.await.expect("the enqueue watcher");
    let patched = timeline.wait(&deployment, 1, SCALE_LIMIT).await;
    let bound = next_event(&mut events, SCALE_LIMIT, "the pod bound", |e| match e {
        SimEvent::Bound(p) => Some((Instant::now(), p.clone())),
        _ => None,
    })
    .await;
    show_kubectl(&["get", "models", "-n", &ns]);
    let ready = next_event(
        &mut events,
        Duration::from_secs(120),
        "the pod Ready",
        |e| match e {
            SimEvent::Ready(p) => Some((Instant::now(), p.clone())),
            _ => None,
        },
    )
    .await;
    assert_eq!(ready.1.pool, "ondemand");
    assert_eq!(ready.1.command, ["tidal"]);
    let answer = tokio::time::timeout(Duration::from_secs(120), request)
        .await
        .unwrap_or_else(|_| panic!("no answer in 120 s\n{}", workers.logs()))
        .expect("the streaming client");
    complete(&answer, 24);
    show_kubectl(&["get", "models", "-n", &ns, "-o", "wide"]);

    // idle: back to zero after scaleToZeroAfterSeconds; the pod's worker gets SIGTERM
    let scaled_down = timeline.wait(&deployment, 0, SCALE_LIMIT).await;
    let idle = scaled_down.saturating_duration_since(answer.ended);
    eventually("the worker stopped", SCALE_LIMIT, || async {
        (!workers.stopped().is_empty()).then_some(())
    })
    .await;
    let stopped = workers.stopped();
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0].pod, ready.1.name);
    assert_eq!(stopped[0].code, Some(0), "{}", stopped[0].log);
    eventually("the Model ScaledToZero again", SCALE_LIMIT, || async {
        let status = stack.model(name).await?.status?;
        (status.phase == tidal_crds::Phase::ScaledToZero).then_some(status)
    })
    .await;

    println!(
        "scale from zero: enqueue -> scale-up patch {} (request sent -> patch {}); patch -> pod bound {}; \
         bound -> Ready (cold start {} + worker start) {}; request sent -> first token {}; \
         last token -> scaled to zero {} (scaleToZeroAfterSeconds {SCALE_TO_ZERO_AFTER_SECONDS})",
        secs(patched.saturating_duration_since(enqueued)),
        secs(patched.saturating_duration_since(sent)),
        secs(bound.0.saturating_duration_since(patched)),
        secs(COLD_START),
        secs(ready.0.saturating_duration_since(bound.0)),
        secs(answer.first_delta.unwrap_or(answer.ended).saturating_duration_since(sent)),
        secs(idle),
    );
    assert!(
        patched >= enqueued,
        "the Deployment was scaled before the request"
    );
    // the controller last sees the request in flight at a tick (1 s apart), up to a tick
    // before its last token reaches the client
    let window = Duration::from_secs(SCALE_TO_ZERO_AFTER_SECONDS);
    assert!(
        idle + Duration::from_millis(1500) >= window && idle <= window + Duration::from_secs(10),
        "scaled to zero {idle:?} after the last token (scaleToZeroAfterSeconds {window:?})"
    );
    let reasons: Vec<String> = stack.events(name).await.into_iter().map(|e| e.0).collect();
    for want in ["ScaledUp", "ScaledToZero"] {
        assert!(
            reasons.iter().any(|r| r == want),
            "no {want} Event: {reasons:?}"
        );
    }
    show_kubectl(&["get", "models", "-n", &ns, "-o", "wide"]);
    show_kubectl(&["describe", "model", name, "-n", &ns]);

    // billed: the prompt once and every token the client received, priced
    let usage = billed_by_request(&stack, name).await;
    let segments = &usage[&answer.id];
    assert_eq!(segments.len(), 1, "{segments:?}");
    assert_eq!(
        (segments[0].prompt_tokens, segments[0].completion_tokens),
        (answer.prompt_tokens, answer.completion_tokens),
        "{segments:?}"
    );
    assert_eq!(
        (segments[0].tenant.as_str(), segments[0].capacity.as_str()),
        (stack.tenant.as_str(), "on_demand")
    );
    let report = billed(&stack, 1).await;
    assert_eq!(
        report["totals"]["input_tokens"],
        json!(answer.prompt_tokens),
        "{report}"
    );
    assert_eq!(
        report["totals"]["output_tokens"],
        json!(answer.completion_tokens),
        "{report}"
    );
    assert_eq!(report["unpriced_tokens"], json!(0), "{report}");

    stack.delete_model(name).await;
    drop(timeline);
    sim.shutdown().await.expect("stop the simulator");
    drop(workers);
    stack.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spot_falls_back_to_on_demand_and_an_interrupted_stream_completes() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let stack = Stack::start(client, "spot").await;
    let ns = stack.ns.clone();
    let workers = PodWorkers::new(&default_model(), stack.broker.clone(), stack.dir.path());
    // no spot node yet: GKE's spot pool is scaled to zero or out of capacity
    let sim = simulator(
        &stack,
        "spot",
        vec![
            Pool::new("spot", Cloud::Gke, Capacity::Spot, 0).size("4", "16Gi"),
            Pool::new("ondemand", Cloud::Gke, Capacity::OnDemand, 1).size("4", "16Gi"),
        ],
        &workers,
    )
    .await;
    let mut events = sim.events();
    let timeline = Timeline::watch(&stack.client, &ns);
    let name = "smollm2";
    let id = stack.model_id(name);
    let (spot, ondemand) = (format!("{name}-spot"), format!("{name}-ondemand"));
    stack
        .create_model(model(
            name,
            json!({
                "mode": "SpotWithFallback",
                "fallbackAfterSeconds": FALLBACK_AFTER_SECONDS,
                "spot": {
                    "nodeSelector": {"cloud.google.com/gke-spot": "true"},
                    "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal",
                                     "value": "true", "effect": "NoSchedule"}],
                    "costPerReplicaHourMicros": 350000,
                },
                "onDemand": on_demand_pool(),
            }),
            600,
        ))
        .await;
    timeline.wait(&spot, 0, SCALE_LIMIT).await;
    timeline.wait(&ondemand, 0, SCALE_LIMIT).await;
    stack.wait_published(name).await;
    let body = chat(
        &id,
        "Tell me a long story about a lighthouse keeper.",
        LONG_STREAM_TOKENS,
    );
    let stream = |first: Option<tokio::sync::oneshot::Sender<()>>| {
        let (base, key, body) = (stack.gateway.clone(), stack.key.clone(), body.clone());
        tokio::spawn(async move { stream_chat(&base, &key, body, first).await })
    };

    // 1. the first request: the spot replica cannot be placed, on-demand stands in after
    //    fallbackAfterSeconds and answers (the uninterrupted answer)
    let reference = stream(None);
    let spot_up = timeline.wait(&spot, 1, SCALE_LIMIT).await;
    let unschedulable = next_event(
        &mut events,
        SCALE_LIMIT,
        "the spot pod Unschedulable",
        |e| match e {
            SimEvent::Unschedulable { message, .. } => Some(message.clone()),
            _ => None,
        },
    )
    .await;
    let fallback = timeline.wait(&ondemand, 1, SCALE_LIMIT).await;
    let waited = fallback.saturating_duration_since(spot_up);
    show_kubectl(&["get", "models", "-n", &ns]);
    let reference = tokio::time::timeout(Duration::from_secs(180), reference)
        .await
        .unwrap_or_else(|_| panic!("no answer in 180 s\n{}", workers.logs()))
        .expect("the streaming client");
    complete(&reference, LONG_STREAM_TOKENS);
    println!(
        "spot: no spot node ({unschedulable}); spot scaled up -> on-demand stand-in {} \
         (fallbackAfterSeconds {FALLBACK_AFTER_SECONDS}); the uninterrupted answer took {}",
        secs(waited),
        secs(reference.ended.saturating_duration_since(spot_up)),
    );
    // pending since the pod's creation, which the API server keeps to the second
    let after = Duration::from_secs(FALLBACK_AFTER_SECONDS);
    assert!(
        waited + Duration::from_secs(1) >= after && waited <= after + Duration::from_secs(10),
        "on-demand stood in {waited:?} after the spot scale-up (fallbackAfterSeconds {after:?})"
    );

    // 2. a spot node comes: the pending spot pod lands and turns Ready, the on-demand
    //    stand-in goes and its worker drains
    let added = Instant::now();
    let spot_node = sim.add_node("spot").await.expect("add a spot node");
    let back = timeline.wait(&ondemand, 0, SCALE_LIMIT).await;
    eventually("the on-demand worker stopped", SCALE_LIMIT, || async {
        workers
            .stopped()
            .iter()
            .any(|s| s.pool == "ondemand")
            .then_some(())
    })
    .await;
    assert_eq!(workers.running().len(), 1, "{:?}", workers.running());
    println!(
        "spot: spot node added -> on-demand stand-in removed {}",
        secs(back.saturating_duration_since(added))
    );

    // 3. the same request again, on the spot worker; the spot node is interrupted at its
    //    first token: on-demand stands in, the spot pod goes after the notice, its worker
    //    drains and re-enqueues, the on-demand worker continues the stream
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let interrupted_stream = stream(Some(first_tx));
    tokio::time::timeout(Duration::from_secs(120), first_rx)
        .await
        .unwrap_or_else(|_| panic!("no first token in 120 s\n{}", workers.logs()))
        .expect("the first token");
    let interrupted = Instant::now();
    sim.interrupt(&spot_node)
        .await
        .expect("interrupt the spot node");
    show_kubectl(&["get", "models", "-n", &ns]);
    let stand_in = timeline.wait(&ondemand, 1, SCALE_LIMIT).await;
    let answer = tokio::time::timeout(Duration::from_secs(180), interrupted_stream)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the interrupted stream did not finish in 180 s\n{}",
                workers.logs()
            )
        })
        .expect("the streaming client");
    complete(&answer, LONG_STREAM_TOKENS);
    assert_eq!(
        answer.content, reference.content,
        "the interrupted stream differs from the uninterrupted answer"
    );
    let spot_worker = workers
        .stopped()
        .into_iter()
        .find(|s| s.pool == "spot")
        .unwrap_or_else(|| panic!("the spot worker was not stopped: {:?}", workers.stopped()));
    assert_eq!(spot_worker.code, Some(0), "{}", spot_worker.log);
    assert!(
        spot_worker.log.contains("re-enqueued job"),
        "the request finished before the spot node went (raise LONG_STREAM_TOKENS); the spot worker's log:\n{}",
        spot_worker.log
    );
    show_kubectl(&["get", "models", "-n", &ns, "-o", "wide"]);
    println!(
        "spot: interrupted at the first token -> on-demand stand-in {}; interrupted -> stream complete {} \
         (notice {}, drainTimeoutSeconds 1)",
        secs(stand_in.saturating_duration_since(interrupted)),
        secs(answer.ended.saturating_duration_since(interrupted)),
        secs(NOTICE),
    );

    // 4. spot returns: the replacement spot pod lands, on-demand goes again
    let restored = Instant::now();
    sim.restore(&spot_node)
        .await
        .expect("restore the spot node");
    let moved = timeline.wait(&ondemand, 0, SCALE_LIMIT).await;
    assert_eq!(timeline.current(&spot).map(|c| c.replicas), Some(1));
    println!(
        "spot: spot node back -> on-demand stand-in removed {}",
        secs(moved.saturating_duration_since(restored))
    );
    let reasons: Vec<String> = stack.events(name).await.into_iter().map(|e| e.0).collect();
    for want in ["ScaledUp", "SpotFallback", "SpotRecovered"] {
        assert!(
            reasons.iter().any(|r| r == want),
            "no {want} Event: {reasons:?}"
        );
    }
    show_kubectl(&["describe", "model", name, "-n", &ns]);

    // billing: per request the prompt once and every delivered token once; the interrupted
    // request in two segments, spot then on-demand
    let usage = billed_by_request(&stack, name).await;
    assert_eq!(usage.len(), 2, "{usage:?}");
    for s in [&reference, &answer] {
        let segments = &usage[&s.id];
        let prompt: u64 = segments.iter().map(|e| e.prompt_tokens).sum();
        let completion: u64 = segments.iter().map(|e| e.completion_tokens).sum();
        assert_eq!(
            (prompt, completion),
            (s.prompt_tokens, s.completion_tokens),
            "{segments:?}"
        );
    }
    let segments = &usage[&answer.id];
    let capacities: Vec<&str> = segments.iter().map(|e| e.capacity.as_str()).collect();
    assert_eq!(capacities, ["spot", "on_demand"], "{segments:?}");
    assert!(
        usage.values().flatten().all(|e| e.tenant == stack.tenant),
        "{usage:?}"
    );
    let segments: usize = usage.values().map(Vec::len).sum();
    let report = billed(&stack, segments as u64).await;
    assert_eq!(
        report["totals"]["input_tokens"],
        json!(reference.prompt_tokens + answer.prompt_tokens),
        "{report}"
    );
    assert_eq!(
        report["totals"]["output_tokens"],
        json!(reference.completion_tokens + answer.completion_tokens),
        "{report}"
    );
    assert_eq!(report["unpriced_tokens"], json!(0), "{report}");

    stack.delete_model(name).await;
    drop(timeline);
    sim.shutdown().await.expect("stop the simulator");
    drop(workers);
    stack.teardown().await;
}
