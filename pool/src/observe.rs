//! What the placement reads, from the broker's records (pure): each model's queue and
//! memory, and each live worker's memory, models and node cache.

use std::collections::BTreeMap;
use std::time::Duration;

use tidal_autoscaler::pool::{LoadedModel, ModelDemand, PoolObserved, WorkerState};
use tidal_autoscaler::CapacityObserved;
use tidal_queue::{PoolHeartbeat, QueueDepth};

/// One model the pool serves, with its queue as read on this tick.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelQueue {
    /// The model id.
    pub model: String,
    /// Its queue.
    pub depth: QueueDepth,
    /// When it last had work (queued or running), on the tick's clock.
    pub last_request_at: Option<Duration>,
}

/// Device memory `model` takes on a worker: the most any worker reports for it loaded
/// (weights, KV cache and activations), else the largest file in a node cache, else 0 (no
/// worker has seen it: the worker that is assigned it refuses a load that does not fit,
/// and reports it, and the placement then tries another).
pub fn memory_of(model: &str, beats: &[PoolHeartbeat]) -> u64 {
    let loaded = beats
        .iter()
        .flat_map(|b| &b.loaded)
        .filter(|l| l.model == model)
        .map(|l| l.bytes)
        .max();
    loaded.unwrap_or_else(|| {
        beats
            .iter()
            .flat_map(|b| &b.cached)
            .filter(|c| c.model == model)
            .map(|c| c.bytes)
            .max()
            .unwrap_or(0)
    })
}

/// A worker as the placement reads it, or `None` for one that is shutting down (it claims
/// nothing and is about to go). Models in its written `assignment` that it neither holds,
/// nor is unloading, nor failed to load, are still to be loaded when it next reads it:
/// they count as loading, with their memory taken, so that no second worker is given them.
pub fn worker_state(
    beat: &PoolHeartbeat,
    assignment: Option<&[String]>,
    memory: &BTreeMap<String, u64>,
) -> Option<WorkerState> {
    if beat.draining {
        return None;
    }
    let mut loading = beat.loading.clone();
    let mut free = beat.memory_free_bytes;
    for m in assignment.unwrap_or_default() {
        let pending = !beat.holds(m)
            && !beat.unloading.contains(m)
            && !beat.failed.iter().any(|f| &f.model == m);
        if pending {
            loading.push(m.clone());
            free = free.saturating_sub(memory.get(m).copied().unwrap_or(0));
        }
    }
    Some(WorkerState {
        worker: beat.worker.clone(),
        node: beat.node.clone(),
        free_memory_bytes: free,
        loaded: beat
            .loaded
            .iter()
            .map(|l| LoadedModel {
                model: l.model.clone(),
                last_used: Duration::from_millis(l.last_used_ms),
                in_flight: u64::from(l.running) + u64::from(l.waiting),
            })
            .collect(),
        loading,
        cached: beat.cached.iter().map(|c| c.model.clone()).collect(),
        refused: beat.failed.iter().map(|f| f.model.clone()).collect(),
    })
}

/// The pool as the placement reads it: `queues` are the models it serves, `assignments`
/// what was last written per worker, `spot`/`on_demand` its workers as the caller counts
/// them (pods on Kubernetes, in-process workers locally).
pub fn observe(
    beats: &[PoolHeartbeat],
    assignments: &BTreeMap<String, Vec<String>>,
    queues: &[ModelQueue],
    spot: CapacityObserved,
    on_demand: CapacityObserved,
) -> PoolObserved {
    let memory: BTreeMap<String, u64> = queues
        .iter()
        .map(|q| (q.model.clone(), memory_of(&q.model, beats)))
        .collect();
    PoolObserved {
        models: queues
            .iter()
            .map(|q| ModelDemand {
                model: q.model.clone(),
                queued: q.depth.backlog,
                in_flight: q.depth.in_flight,
                last_request_at: q.last_request_at,
                memory_bytes: memory.get(&q.model).copied().unwrap_or(0),
            })
            .collect(),
        workers: beats
            .iter()
            .filter_map(|b| worker_state(b, assignments.get(&b.worker).map(Vec::as_slice), &memory))
            .collect(),
        spot,
        on_demand,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tidal_queue::{CachedModel, CapacityType, FailedLoad, PoolLoadedModel};

    pub(crate) fn beat(worker: &str, loaded: &[&str], cached: &[(&str, u64)]) -> PoolHeartbeat {
        PoolHeartbeat {
            worker: worker.into(),
            pool: "ns/p".into(),
            node: format!("node-{worker}"),
            capacity_type: CapacityType::OnDemand,
            memory_total_bytes: 100,
            memory_free_bytes: 100 - 30 * loaded.len() as u64,
            loaded: loaded
                .iter()
                .map(|m| PoolLoadedModel {
                    model: (*m).into(),
                    bytes: 30,
                    running: 1,
                    waiting: 2,
                    last_used_ms: 5_000,
                    tokens_delivered: 0,
                })
                .collect(),
            loading: Vec::new(),
            unloading: Vec::new(),
            cached: cached
                .iter()
                .map(|(m, b)| CachedModel {
                    model: (*m).into(),
                    bytes: *b,
                    sha256: None,
                    warm: true,
                })
                .collect(),
            failed: Vec::new(),
            draining: false,
            last_seen_ms: 10_000,
        }
    }

    #[test]
    fn memory_prefers_a_loaded_copy_then_the_largest_cached_file() {
        let beats = [
            beat("a", &["x"], &[("x", 20), ("y", 25)]),
            beat("b", &[], &[("y", 26)]),
        ];
        assert_eq!(memory_of("x", &beats), 30);
        assert_eq!(memory_of("y", &beats), 26);
        assert_eq!(memory_of("z", &beats), 0);
    }

    #[test]
    fn a_draining_worker_is_not_placed_on() {
        let mut b = beat("a", &["x"], &[]);
        b.draining = true;
        assert_eq!(worker_state(&b, None, &BTreeMap::new()), None);
    }

    #[test]
    fn an_assigned_model_not_yet_held_counts_as_loading_with_its_memory() {
        let mut b = beat("a", &["x"], &[("y", 40)]);
        b.unloading = vec!["u".into()];
        b.failed = vec![FailedLoad {
            model: "f".into(),
            error: "broken".into(),
        }];
        let memory = BTreeMap::from([("y".to_string(), 40), ("u".to_string(), 10)]);
        let assigned: Vec<String> = ["x", "y", "u", "f"].map(String::from).to_vec();
        let w = worker_state(&b, Some(&assigned), &memory).expect("live");
        assert_eq!(w.loading, vec!["y".to_string()]);
        assert_eq!(w.free_memory_bytes, 70 - 40);
        assert_eq!(w.refused, vec!["f".to_string()]);
        assert_eq!(w.loaded[0].in_flight, 3);
        assert_eq!(w.loaded[0].last_used, Duration::from_secs(5));
        assert_eq!(w.cached, vec!["y".to_string()]);
    }

    #[test]
    fn observes_every_model_with_its_queue_and_memory() {
        let beats = [beat("a", &["x"], &[("x", 20)]), beat("b", &[], &[])];
        let queues = [
            ModelQueue {
                model: "x".into(),
                depth: QueueDepth {
                    backlog: 4,
                    in_flight: 1,
                    ..QueueDepth::default()
                },
                last_request_at: Some(Duration::from_secs(9)),
            },
            ModelQueue {
                model: "idle".into(),
                ..ModelQueue::default()
            },
        ];
        let obs = observe(
            &beats,
            &BTreeMap::new(),
            &queues,
            CapacityObserved::default(),
            CapacityObserved {
                ready: 2,
                ..CapacityObserved::default()
            },
        );
        assert_eq!(obs.models.len(), 2);
        assert_eq!(obs.models[0].queued, 4);
        assert_eq!(obs.models[0].in_flight, 1);
        assert_eq!(obs.models[0].memory_bytes, 30);
        assert_eq!(obs.models[1].memory_bytes, 0);
        assert_eq!(obs.workers.len(), 2);
        assert_eq!(obs.on_demand.ready, 2);
    }
}
