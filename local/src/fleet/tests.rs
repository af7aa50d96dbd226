use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use tidal_queue::{Job, MemoryBroker, Prices};
use uuid::Uuid;

use super::*;

/// A worker that "loads" for `load`, then waits for its stop switch.
struct FakeLauncher {
    load: Duration,
    started: AtomicU32,
    stopped: AtomicU32,
    fail_first: AtomicU32,
}

impl FakeLauncher {
    fn new(load: Duration) -> Arc<Self> {
        Arc::new(Self {
            load,
            started: AtomicU32::new(0),
            stopped: AtomicU32::new(0),
            fail_first: AtomicU32::new(0),
        })
    }
}

#[async_trait]
impl Launcher for FakeLauncher {
    async fn run(
        &self,
        _model: &str,
        _name: &str,
        ready: oneshot::Sender<Duration>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), LaunchError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.load).await;
        if self
            .fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(LaunchError("model file is corrupt".into()));
        }
        let _ = ready.send(self.load);
        let _ = stop.wait_for(|s| *s).await;
        self.stopped.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn record(id: &str) -> ModelRecord {
    ModelRecord {
        id: id.into(),
        state: ModelState::ScaledToZero,
        prices: Prices {
            currency: "USD".into(),
            input_per_mtok_micros: 1,
            cached_input_per_mtok_micros: 1,
            output_per_mtok_micros: 1,
        },
        max_queue_wait_ms: 60_000,
        backlog_cap: 100,
        context_length: 2048,
    }
}

fn spec(idle: Duration) -> ScalingSpec {
    ScalingSpec {
        max_replicas: 2,
        target_in_flight_per_replica: 4.0,
        scale_to_zero_after: idle,
        stable_window: Duration::from_secs(10),
        panic_window: Duration::from_secs(1),
        ..ScalingSpec::default()
    }
}

fn job(model: &str) -> Job {
    Job {
        id: Uuid::now_v7(),
        tenant: "t".into(),
        model: model.into(),
        body: serde_json::json!({}),
        enqueued_at_ms: 0,
        deadline_ms: 0,
        resume: None,
    }
}

fn fleet(broker: &Arc<MemoryBroker>, launcher: &Arc<FakeLauncher>, idle: Duration) -> Fleet {
    fleet_of(broker, launcher, spec(idle), FleetConfig::default())
}

/// A fleet serving model "m" under `spec`.
fn fleet_of(
    broker: &Arc<MemoryBroker>,
    launcher: &Arc<FakeLauncher>,
    spec: ScalingSpec,
    config: FleetConfig,
) -> Fleet {
    Fleet::new(
        broker.clone(),
        launcher.clone(),
        vec![FleetModel {
            record: record("m"),
            spec,
        }],
        config,
    )
}

async fn settle() {
    // Let spawned fake workers run up to their next await point.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

async fn tick(fleet: &mut Fleet) {
    fleet.tick().await;
    settle().await;
}

async fn state(broker: &MemoryBroker) -> ModelState {
    broker.model("m").await.unwrap().unwrap().state
}

#[tokio::test(start_paused = true)]
async fn first_tick_publishes_scaled_to_zero_and_starts_nothing() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_secs(2));
    let mut fleet = fleet(&broker, &launcher, Duration::from_secs(30));
    tick(&mut fleet).await;
    settle().await;
    assert_eq!(state(&broker).await, ModelState::ScaledToZero);
    assert_eq!(launcher.started.load(Ordering::SeqCst), 0);
    let status = fleet.status().snapshot();
    assert_eq!(status[0].desired, 0);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_starts_a_worker_within_one_tick_then_it_becomes_ready() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_secs(2));
    let mut fleet = fleet(&broker, &launcher, Duration::from_secs(30));
    tick(&mut fleet).await;
    broker.enqueue(&job("m")).await.unwrap();
    tick(&mut fleet).await;
    settle().await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
    assert_eq!(state(&broker).await, ModelState::Starting);
    assert_eq!(fleet.status().snapshot()[0].starting, 1);

    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    tick(&mut fleet).await;
    assert_eq!(state(&broker).await, ModelState::Ready);
    let s = &fleet.status().snapshot()[0];
    assert_eq!((s.ready, s.starting, s.cold_starts), (1, 0, 1));
    assert_eq!(s.last_cold_start_ms, Some(2000));
    // Still one worker: one queued request is below the per-replica target.
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_model_scales_to_zero_after_the_idle_time_and_back_up_on_demand() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_millis(500));
    let idle = Duration::from_secs(30);
    let mut fleet = fleet(&broker, &launcher, idle);
    broker.enqueue(&job("m")).await.unwrap();
    tick(&mut fleet).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    tick(&mut fleet).await;
    assert_eq!(state(&broker).await, ModelState::Ready);

    // The job is served: claim and ack it.
    let claimed = broker.claim("m", "w", 1, Duration::ZERO).await.unwrap();
    broker.ack(&claimed[0]).await.unwrap();

    // Short of the idle time the worker stays.
    for _ in 0..25 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tick(&mut fleet).await;
    }
    settle().await;
    assert_eq!(launcher.stopped.load(Ordering::SeqCst), 0);
    assert_eq!(state(&broker).await, ModelState::Ready);

    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tick(&mut fleet).await;
        settle().await;
    }
    tick(&mut fleet).await;
    assert_eq!(launcher.stopped.load(Ordering::SeqCst), 1);
    assert_eq!(state(&broker).await, ModelState::ScaledToZero);
    assert_eq!(
        fleet.status().snapshot()[0].stopping,
        0,
        "stopped worker reaped"
    );

    // The next request brings it back.
    broker.enqueue(&job("m")).await.unwrap();
    tick(&mut fleet).await;
    settle().await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_floor_loads_its_workers_before_any_request_and_keeps_them_when_idle() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_secs(2));
    let idle = Duration::from_secs(30);
    let floor = ScalingSpec {
        min_replicas: 1,
        ..spec(idle)
    };
    let mut fleet = fleet_of(&broker, &launcher, floor, FleetConfig::default());
    tick(&mut fleet).await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
    assert_eq!(state(&broker).await, ModelState::Starting);
    assert_eq!(fleet.status().snapshot()[0].reason, "min-replicas");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    tick(&mut fleet).await;
    assert_eq!(state(&broker).await, ModelState::Ready);
    // Long past the idle time with no request, the floor stays loaded.
    for _ in 0..60 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tick(&mut fleet).await;
    }
    assert_eq!(state(&broker).await, ModelState::Ready);
    assert_eq!(
        (
            launcher.started.load(Ordering::SeqCst),
            launcher.stopped.load(Ordering::SeqCst)
        ),
        (1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_floor_loads_a_worker_while_its_window_holds() {
    // 09:00-10:00 in Berlin (08:00-09:00 UTC on Monday 2026-11-30); the fleet starts at
    // 07:59:30 UTC with no request, so nothing loads until the window opens
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_secs(2));
    let monday = 1_795_996_800;
    let scheduled = ScalingSpec {
        floor_schedule: vec!["daily 09:00-10:00 1 Europe/Berlin".parse().unwrap()],
        ..spec(Duration::from_secs(30))
    };
    let config = FleetConfig {
        wall_clock_at_start: Some(monday + 8 * 3600 - 30),
        ..FleetConfig::default()
    };
    let mut fleet = fleet_of(&broker, &launcher, scheduled, config);
    tick(&mut fleet).await;
    tokio::time::advance(Duration::from_secs(29)).await;
    tick(&mut fleet).await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 0);
    assert_eq!(state(&broker).await, ModelState::ScaledToZero);
    tokio::time::advance(Duration::from_secs(1)).await;
    tick(&mut fleet).await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
    assert_eq!(fleet.status().snapshot()[0].reason, "scheduled-floor");
    // the window closes at 09:00 UTC; idle since the start, the model scales to zero
    tokio::time::advance(Duration::from_secs(3600)).await;
    settle().await;
    tick(&mut fleet).await;
    assert_eq!(fleet.status().snapshot()[0].desired, 0);
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_fails_to_load_is_replaced_while_demand_lasts() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_millis(100));
    launcher.fail_first.store(1, Ordering::SeqCst);
    let mut fleet = fleet(&broker, &launcher, Duration::from_secs(30));
    broker.enqueue(&job("m")).await.unwrap();
    tick(&mut fleet).await;
    tokio::time::advance(Duration::from_millis(200)).await;
    settle().await;
    tick(&mut fleet).await;
    settle().await;
    assert_eq!(
        launcher.started.load(Ordering::SeqCst),
        2,
        "replacement started"
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    settle().await;
    tick(&mut fleet).await;
    assert_eq!(state(&broker).await, ModelState::Ready);
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_every_worker_and_publishes_scaled_to_zero() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_millis(100));
    let fleet = fleet(&broker, &launcher, Duration::from_secs(30));
    let status = fleet.status();
    broker.enqueue(&job("m")).await.unwrap();
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(fleet.run(stop_rx));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status.snapshot()[0].ready, 1);
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert_eq!(launcher.stopped.load(Ordering::SeqCst), 1);
    assert_eq!(state(&broker).await, ModelState::ScaledToZero);
}

#[test]
fn worker_names_are_safe_for_any_model_id() {
    assert_eq!(sanitize("team/smol_lm.2"), "team-smol-lm-2");
}

#[tokio::test(start_paused = true)]
async fn models_scale_independently() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_millis(100));
    let models = ["m", "n"]
        .into_iter()
        .map(|id| FleetModel {
            record: record(id),
            spec: spec(Duration::from_secs(30)),
        })
        .collect();
    let mut fleet = Fleet::new(
        broker.clone(),
        launcher.clone(),
        models,
        FleetConfig::default(),
    );
    broker.enqueue(&job("n")).await.unwrap();
    tick(&mut fleet).await;
    tokio::time::advance(Duration::from_millis(200)).await;
    settle().await;
    tick(&mut fleet).await;
    let status = fleet.status().snapshot();
    assert_eq!((status[0].id.as_str(), status[0].ready), ("m", 0));
    assert_eq!((status[1].id.as_str(), status[1].ready), ("n", 1));
    assert_eq!(state(&broker).await, ModelState::ScaledToZero, "model m");
    assert_eq!(
        broker.model("n").await.unwrap().unwrap().state,
        ModelState::Ready
    );
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
}

/// Jobs whose first token is out weigh `decodingWeight`: eight that only decode ask for two
/// workers at weight 1 and for one at 0.25, and the status shows them.
#[tokio::test(start_paused = true)]
async fn decoding_jobs_weigh_the_decoding_weight() {
    for (weight, workers) in [(1.0, 2), (0.25, 1)] {
        let broker = Arc::new(MemoryBroker::default());
        let launcher = FakeLauncher::new(Duration::from_millis(500));
        let spec = ScalingSpec {
            decoding_weight: weight,
            ..spec(Duration::from_secs(30))
        };
        let mut fleet = fleet_of(&broker, &launcher, spec, FleetConfig::default());
        tick(&mut fleet).await;
        for _ in 0..8 {
            broker.enqueue(&job("m")).await.unwrap();
        }
        for claimed in broker.claim("m", "w", 8, Duration::ZERO).await.unwrap() {
            broker.mark_decoding(&claimed).await.unwrap();
        }
        tick(&mut fleet).await;
        let s = &fleet.status().snapshot()[0];
        assert_eq!(
            (s.in_flight, s.decoding, s.desired),
            (8, 8, workers),
            "weight {weight}"
        );
    }
}

/// A pool of two models: a queued request starts one pool worker (both models publish its
/// state), and once the worker reports, the model with work is assigned to it.
#[tokio::test(start_paused = true)]
async fn a_pool_starts_a_worker_for_queued_work_and_assigns_the_model_to_it() {
    let broker = Arc::new(MemoryBroker::default());
    let launcher = FakeLauncher::new(Duration::from_millis(100));
    let models = vec![
        FleetModel {
            record: record("a"),
            spec: spec(Duration::from_secs(30)),
        },
        FleetModel {
            record: record("b"),
            spec: spec(Duration::from_secs(30)),
        },
    ];
    let pool_spec = tidal_autoscaler::pool::PoolSpec {
        worker_memory_bytes: 1 << 30,
        idle_unload_after: Duration::from_secs(60),
        workers: spec(Duration::from_secs(30)),
    };
    let mut fleet = Fleet::new(
        broker.clone(),
        launcher.clone(),
        Vec::new(),
        FleetConfig::default(),
    )
    .with_pool(PoolFleet::new(models, pool_spec, launcher.clone()));
    tick(&mut fleet).await;
    assert_eq!(
        launcher.started.load(Ordering::SeqCst),
        0,
        "idle: no worker"
    );
    assert_eq!(
        broker.model("a").await.unwrap().unwrap().state,
        ModelState::ScaledToZero
    );

    broker.enqueue(&job("a")).await.unwrap();
    tick(&mut fleet).await;
    assert_eq!(launcher.started.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    tick(&mut fleet).await;
    for m in ["a", "b"] {
        assert_eq!(
            broker.model(m).await.unwrap().unwrap().state,
            ModelState::Ready,
            "model {m}"
        );
    }

    // the worker's heartbeat: nothing loaded, both files in its cache
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let beat = tidal_queue::PoolHeartbeat {
        worker: "local-local-1".into(),
        pool: LOCAL_POOL.into(),
        node: "local".into(),
        capacity_type: tidal_queue::CapacityType::OnDemand,
        memory_total_bytes: 1 << 30,
        memory_free_bytes: 1 << 30,
        loaded: Vec::new(),
        loading: Vec::new(),
        unloading: Vec::new(),
        cached: ["a", "b"]
            .iter()
            .map(|m| tidal_queue::CachedModel {
                model: (*m).into(),
                bytes: 100 << 20,
                sha256: None,
                warm: true,
            })
            .collect(),
        failed: Vec::new(),
        draining: false,
        last_seen_ms: now_ms,
    };
    broker.pool_heartbeat(&beat).await.unwrap();
    tick(&mut fleet).await;
    assert_eq!(
        broker
            .pool_assignment(LOCAL_POOL, "local-local-1")
            .await
            .unwrap(),
        Some(vec!["a".to_string()])
    );
    let status = fleet.status().snapshot();
    assert_eq!(status.len(), 2);
    assert_eq!((status[0].id.as_str(), status[0].backlog), ("a", 1));
    assert_eq!(status[0].desired, 1);
    assert_eq!(status[1].desired, 0);
}
