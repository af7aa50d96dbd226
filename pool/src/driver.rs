//! One pool's assignment loop (I/O): heartbeats, assignments and queues read from the
//! broker, the placement run, the changed assignments written. The clock is the caller's.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tidal_autoscaler::pool::{plan, Action, PoolPlan, PoolSpec, PoolState};
use tidal_autoscaler::{CapacityObserved, Decision};
use tidal_queue::{Broker, CapacityType, PoolHeartbeat, QueueError};

use crate::assign::next_assignments;
use crate::observe::{observe, ModelQueue};
use crate::share::{FleetShare, Shares};

/// A worker whose heartbeat is older than this is gone: its heartbeat and assignment are
/// removed and its models placed elsewhere (workers beat every second).
pub const STALE_AFTER: Duration = Duration::from_secs(15);

/// What one tick saw and did.
#[derive(Debug, Clone)]
pub struct PoolTick {
    /// The live workers' heartbeats (after expiry), in worker order.
    pub beats: Vec<PoolHeartbeat>,
    /// Every model's queue as read.
    pub queues: Vec<ModelQueue>,
    /// The placement's plan. On a tick that only places (see [`PoolDriver::decide_every`]),
    /// its worker count is the last decision's.
    pub plan: PoolPlan,
    /// Whether this tick decided the worker count (else it only placed models).
    pub decided: bool,
    /// Every worker's assignment after this tick's writes.
    pub assignments: BTreeMap<String, Vec<String>>,
    /// Assignments written this tick, worker → models.
    pub written: BTreeMap<String, Vec<String>>,
    /// Workers expired this tick.
    pub expired: Vec<String>,
    /// The worker time since the previous tick, split across models.
    pub shares: Option<Shares>,
}

/// A pool's loop state: the placement's windows, when each model last had work, and the
/// workers' token counters.
#[derive(Debug)]
pub struct PoolDriver {
    pool: String,
    spec: PoolSpec,
    state: PoolState,
    last_work: BTreeMap<String, Duration>,
    share: FleetShare,
    /// The last worker-count decision and when it was made.
    decision: Option<(Decision, Duration)>,
    /// How old a heartbeat may be before its worker is expired.
    pub stale_after: Duration,
    /// How often the worker count is decided; ticks in between only place models, on a
    /// copy of the placement's state. Placement can then run often (a queued model waits
    /// for the next tick before a worker loads it) while the policy sees one sample per
    /// interval and its rate limits, which are per decision, keep their meaning. Zero:
    /// every tick decides.
    pub decide_every: Duration,
}

impl PoolDriver {
    /// The loop of `pool` (its id in the broker's keys) under `spec` (validated).
    pub fn new(pool: impl Into<String>, spec: PoolSpec) -> Self {
        PoolDriver {
            pool: pool.into(),
            state: PoolState::new(&spec),
            spec,
            last_work: BTreeMap::new(),
            share: FleetShare::default(),
            decision: None,
            stale_after: STALE_AFTER,
            decide_every: Duration::ZERO,
        }
    }

    /// The pool's id.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// Adopts an edited spec; the placement's windows start afresh when it changed.
    pub fn respec(&mut self, spec: PoolSpec) {
        if spec != self.spec {
            self.state = PoolState::new(&spec);
            self.spec = spec;
            self.decision = None;
        }
    }

    /// One tick at `now` for the pool serving `models`, with `spot` and `on_demand` its
    /// workers as the caller counts them. A broker error stops the tick before anything is
    /// written (the next tick starts over).
    pub async fn tick(
        &mut self,
        broker: &dyn Broker,
        models: &[String],
        spot: CapacityObserved,
        on_demand: CapacityObserved,
        now: SystemTime,
    ) -> Result<PoolTick, QueueError> {
        let since_epoch = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let now_ms = u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX);
        let expired = broker
            .expire_pool_workers(&self.pool, now_ms, self.stale_after)
            .await?;
        for w in &expired {
            tracing::info!(pool = %self.pool, worker = %w, "pool worker expired: no heartbeat");
        }
        let mut beats = broker.pool_workers(&self.pool).await?;
        beats.sort_by(|a, b| a.worker.cmp(&b.worker));
        let mut assignments = broker.pool_assignments(&self.pool).await?;

        let mut ids: Vec<&String> = models.iter().collect();
        ids.sort();
        ids.dedup();
        let mut queues = Vec::with_capacity(ids.len());
        for id in ids {
            let depth = broker.depth(id).await?;
            if depth.backlog + depth.in_flight > 0 {
                self.last_work.insert(id.clone(), since_epoch);
            }
            queues.push(ModelQueue {
                model: id.clone(),
                depth,
                last_request_at: self.last_work.get(id).copied(),
            });
        }
        self.last_work
            .retain(|m, _| queues.iter().any(|q| &q.model == m));

        let scheduled = [
            (CapacityType::Spot, spot.ready + spot.not_ready()),
            (
                CapacityType::OnDemand,
                on_demand.ready + on_demand.not_ready(),
            ),
        ];
        let observed = observe(&beats, &assignments, &queues, spot, on_demand);
        // a tenth of the interval is slack for a tick that runs a little early
        let decided = self.decision.as_ref().is_none_or(|(_, at)| {
            since_epoch.saturating_sub(*at) >= self.decide_every.mul_f64(0.9)
        });
        let plan = if decided {
            let p = plan(&observed, &self.spec, &mut self.state, since_epoch);
            self.decision = Some((p.workers.clone(), since_epoch));
            p
        } else {
            let mut scratch = self.state.clone();
            let mut p = plan(&observed, &self.spec, &mut scratch, since_epoch);
            if let Some((last, _)) = &self.decision {
                p.workers = last.clone();
            }
            p
        };
        let busy = |m: &str| {
            queues
                .iter()
                .any(|q| q.model == m && q.depth.backlog + q.depth.in_flight > 0)
        };
        let written = next_assignments(&beats, &assignments, &plan.actions, busy);
        for (worker, models) in &written {
            broker
                .set_pool_assignment(&self.pool, worker, models)
                .await?;
            assignments.insert(worker.clone(), models.clone());
        }
        for a in &plan.actions {
            let (kind, model, worker) = match a {
                Action::Load { model, worker } => ("load", model, worker),
                Action::Unload { model, worker, .. } => ("unload", model, worker),
            };
            tracing::info!(pool = %self.pool, %model, %worker, action = kind, "pool placement");
            metrics::counter!("tidal_pool_actions_total", "pool" => self.pool.clone(), "action" => kind)
                .increment(1);
        }
        if decided {
            metrics::gauge!("tidal_pool_workers_desired", "pool" => self.pool.clone())
                .set(f64::from(plan.workers.serving));
        }
        let shares = self.share.split(&beats, &scheduled, now_ms);
        Ok(PoolTick {
            beats,
            queues,
            plan,
            decided,
            assignments,
            written,
            expired,
            shares,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::tests::beat;
    use std::sync::Arc;
    use tidal_queue::{BrokerConfig, ManualClock, MemoryBroker};

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn spec() -> PoolSpec {
        let mut spec = PoolSpec {
            worker_memory_bytes: 100,
            idle_unload_after: Duration::from_secs(60),
            ..PoolSpec::default()
        };
        spec.workers.max_replicas = 4;
        spec
    }

    fn broker() -> Arc<MemoryBroker> {
        Arc::new(MemoryBroker::new(
            BrokerConfig::default(),
            Arc::new(ManualClock::new(1_000_000)),
        ))
    }

    fn one_ready() -> CapacityObserved {
        CapacityObserved {
            ready: 1,
            ..CapacityObserved::default()
        }
    }

    async fn enqueue(broker: &MemoryBroker, model: &str) {
        let job = tidal_queue::Job {
            id: uuid::Uuid::now_v7(),
            tenant: "t".into(),
            model: model.into(),
            body: serde_json::json!({"prompt": "hi"}),
            enqueued_at_ms: 0,
            deadline_ms: 0,
            resume: None,
        };
        broker.enqueue(&job).await.expect("enqueue");
    }

    #[tokio::test]
    async fn a_queued_model_is_assigned_once_to_the_worker_that_has_it_cached() {
        let broker = broker();
        let mut b = beat("w1", &[], &[("ns/a", 30), ("ns/b", 30)]);
        b.memory_free_bytes = 40;
        b.last_seen_ms = 1_000_000;
        broker.pool_heartbeat(&b).await.expect("beat");
        let models = vec!["ns/a".to_string(), "ns/b".to_string()];
        let mut driver = PoolDriver::new("ns/p", spec());
        enqueue(&broker, "ns/a").await;
        let t = driver
            .tick(
                broker.as_ref(),
                &models,
                CapacityObserved::default(),
                one_ready(),
                at(1_000),
            )
            .await
            .expect("tick");
        assert_eq!(
            t.written,
            BTreeMap::from([("w1".into(), vec!["ns/a".to_string()])])
        );
        assert_eq!(
            broker.pool_assignment("ns/p", "w1").await.expect("read"),
            Some(vec!["ns/a".to_string()])
        );
        // the worker has not loaded it yet: nothing is written twice
        let t = driver
            .tick(
                broker.as_ref(),
                &models,
                CapacityObserved::default(),
                one_ready(),
                at(1_000),
            )
            .await
            .expect("tick");
        assert!(t.written.is_empty(), "{:?}", t.written);
    }

    #[tokio::test]
    async fn between_decisions_a_tick_places_models_and_keeps_the_worker_count() {
        let broker = broker();
        let mut b = beat("w1", &[], &[("ns/a", 30)]);
        b.last_seen_ms = 1_000_000;
        broker.pool_heartbeat(&b).await.expect("beat");
        let models = vec!["ns/a".to_string()];
        let mut driver = PoolDriver::new("ns/p", spec());
        driver.decide_every = Duration::from_secs(2);
        let mut ticks = Vec::new();
        for (at_ms, queue) in [(1_000_000, false), (1_000_250, true), (1_002_000, false)] {
            if queue {
                enqueue(&broker, "ns/a").await;
            }
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms);
            let t = driver
                .tick(
                    broker.as_ref(),
                    &models,
                    CapacityObserved::default(),
                    one_ready(),
                    at,
                )
                .await
                .expect("tick");
            ticks.push(t);
        }
        let decided: Vec<(bool, u32)> = ticks
            .iter()
            .map(|t| (t.decided, t.plan.workers.serving))
            .collect();
        // idle at first; the placement at 250 ms keeps that count; the next decision raises it
        assert_eq!(decided, vec![(true, 0), (false, 0), (true, 1)]);
        assert_eq!(
            ticks[1].written,
            BTreeMap::from([("w1".into(), vec!["ns/a".to_string()])]),
            "placed without waiting for the decision"
        );
    }

    #[tokio::test]
    async fn a_stale_worker_is_expired_with_its_assignment() {
        let broker = broker();
        let mut b = beat("w1", &["ns/a"], &[]);
        b.last_seen_ms = 1_000;
        broker.pool_heartbeat(&b).await.expect("beat");
        broker
            .set_pool_assignment("ns/p", "w1", &["ns/a".to_string()])
            .await
            .expect("assign");
        let mut driver = PoolDriver::new("ns/p", spec());
        let t = driver
            .tick(
                broker.as_ref(),
                &["ns/a".to_string()],
                CapacityObserved::default(),
                CapacityObserved::default(),
                at(100),
            )
            .await
            .expect("tick");
        assert_eq!(t.expired, vec!["w1".to_string()]);
        assert!(t.beats.is_empty());
        assert!(t.assignments.is_empty());
    }
}
