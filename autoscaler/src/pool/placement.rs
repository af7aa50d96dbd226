//! The placement: which model goes on which worker, which idle model leaves, and how many
//! workers the pool wants. A pure function of the observed pool, its spec, its own state and
//! an injected clock, deterministic (models and workers in id order, ties broken by id).
//!
//! - **Holders**: each model wants as many workers holding it as [`decide`] gives for its
//!   own demand under [`PoolSpec::model_scaling`] (at least one while it has work). The same
//!   windows and panic mode as a model's fleet, so a hot model spreads as a fleet would.
//! - **Load** (a model with work and fewer holders than it wants), the first class that
//!   has a worker: (1) a worker with free memory whose node cache holds the model
//!   (ServerlessLLM's locality-aware placement: a swap, not a download), (2) a worker with
//!   free memory, (3) a worker where unloading least-recently-used idle models frees enough.
//!   Within a class: not loading before loading, fewest jobs, best fit, then id; in (3) the
//!   fewest evictions and a cached node first. Never a worker that failed to load it.
//! - **Unload**: only a model with no job on that worker and none queued, when it has idled
//!   there for `idleUnloadAfter`, or to make room (least recently used first).
//! - **Workers**: [`decide`] on the pool's summed demand under `workers`, never below what
//!   the models that want a holder (with work, or idle for less than `idleUnloadAfter`)
//!   need by memory ([`workers_needed`]; the highest of the stable window while any model
//!   wants a holder), nor below the ready workers
//!   plus what the models placed nowhere need, so that a model with work is either placed or
//!   the count rises (up to `maxReplicas`; beyond it, [`Condition::AtMaxWorkers`]).

use super::observed::{ModelDemand, PoolObserved, WorkerState};
use super::packing::{workers_needed, Copies};
use super::spec::PoolSpec;
use crate::observed::{CapacityObserved, Observed};
use crate::policy::{decide, Decision, PolicyState};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// What the controller does to one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Load `model` on `worker` (from its node cache where it has it).
    Load {
        /// The model id.
        model: String,
        /// The worker id.
        worker: String,
    },
    /// Unload `model` from `worker`; it has no job there and none queued.
    Unload {
        /// The model id.
        model: String,
        /// The worker id.
        worker: String,
        /// Why.
        why: Unload,
    },
}

/// Why a model is unloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unload {
    /// Idle on that worker for `idleUnloadAfter`, or no longer served by the pool.
    Idle,
    /// Least recently used, to make room for this model.
    Evicted {
        /// The model loaded in its place.
        for_model: String,
    },
}

/// A model the pool cannot serve as asked, reported rather than dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Its weights are larger than a worker's memory: no worker can ever hold it.
    TooLarge {
        /// The model id.
        model: String,
        /// What it needs, bytes.
        memory_bytes: u64,
        /// What a worker has, bytes.
        worker_memory_bytes: u64,
    },
    /// It has work and no worker to place it on, and the pool is at `maxReplicas`.
    AtMaxWorkers {
        /// The model id.
        model: String,
    },
}

/// The placement's output for one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    /// Unloads, then loads, in the order to apply them (an eviction comes before the load it
    /// makes room for).
    pub actions: Vec<Action>,
    /// Desired workers per capacity type (`serving` is the total).
    pub workers: Decision,
    /// Workers the models that want a holder need by memory, the highest of the stable
    /// window (a floor under `workers`).
    pub memory_floor: u32,
    /// Holders each model with work wants, by model id.
    pub holders: BTreeMap<String, u32>,
    /// Models that cannot be served as asked.
    pub conditions: Vec<Condition>,
}

/// What the placement remembers between ticks: the windows of the worker count and of each
/// model's holders.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolState {
    workers: PolicyState,
    models: BTreeMap<String, PolicyState>,
    /// Recent memory floors, newest last, decreasing: the highest of the stable window holds.
    floors: VecDeque<(Duration, u32)>,
}

impl PoolState {
    /// Fresh state for a pool with this spec.
    pub fn new(spec: &PoolSpec) -> Self {
        Self {
            workers: PolicyState::new(&spec.workers),
            models: BTreeMap::new(),
            floors: VecDeque::new(),
        }
    }
}

/// A worker as the plan changes it.
struct Slot<'a> {
    w: &'a WorkerState,
    free: u64,
    /// Models it holds after the plan so far, with last use (`None`: loading, or placed now).
    held: BTreeMap<&'a str, Option<(Duration, u64)>>,
}

/// Plans one tick at `now`. `spec` should have passed [`PoolSpec::validate`].
pub fn plan(obs: &PoolObserved, spec: &PoolSpec, state: &mut PoolState, now: Duration) -> PoolPlan {
    let mut models: Vec<&ModelDemand> = obs.models.iter().collect();
    models.sort_by(|a, b| a.model.cmp(&b.model));
    models.dedup_by(|a, b| a.model == b.model);
    let by_id: BTreeMap<&str, &ModelDemand> =
        models.iter().map(|m| (m.model.as_str(), *m)).collect();
    let mut slots: Vec<Slot<'_>> = obs.workers.iter().map(slot).collect();
    slots.sort_by(|a, b| a.w.worker.cmp(&b.w.worker));

    let mut conditions = Vec::new();
    let cap = spec.worker_memory_bytes;
    let model_spec = spec.model_scaling();
    state.models.retain(|id, _| by_id.contains_key(id.as_str()));
    let mut holders: BTreeMap<String, u32> = BTreeMap::new();
    let mut reserve: Vec<Copies<'_>> = Vec::new();
    for m in &models {
        let held = slots
            .iter()
            .filter(|s| s.held.contains_key(m.model.as_str()));
        let (ready, starting) =
            held.fold((0u32, 0u32), |(r, s), x| match x.held[m.model.as_str()] {
                Some(_) => (r + 1, s),
                None => (r, s + 1),
            });
        let observed = Observed {
            backlog: m.queued,
            in_flight: m.in_flight,
            last_request_at: m.last_request_at,
            on_demand: CapacityObserved {
                ready,
                starting,
                ..CapacityObserved::default()
            },
            ..Observed::default()
        };
        let st = state
            .models
            .entry(m.model.clone())
            .or_insert_with(|| PolicyState::new(&model_spec));
        let want = decide(&observed, &model_spec, st, now).serving;
        if m.memory_bytes > cap {
            conditions.push(Condition::TooLarge {
                model: m.model.clone(),
                memory_bytes: m.memory_bytes,
                worker_memory_bytes: cap,
            });
        } else {
            let want = if m.busy() { want.max(1) } else { want };
            if m.busy() {
                holders.insert(m.model.clone(), want);
            }
            reserve.push(Copies {
                model: &m.model,
                memory_bytes: m.memory_bytes,
                copies: want,
            });
        }
    }

    let mut actions = Vec::new();
    // idle unloads first: they free memory for this tick's loads
    for s in &mut slots {
        let w = s.w;
        for l in &w.loaded {
            let known = by_id.get(l.model.as_str());
            let idle = l.in_flight == 0
                && known.is_none_or(|m| {
                    m.queued == 0 && now.saturating_sub(l.last_used) >= spec.idle_unload_after
                });
            if idle {
                s.held.remove(l.model.as_str());
                s.free += known.map_or(0, |m| m.memory_bytes);
                actions.push(Action::Unload {
                    model: l.model.clone(),
                    worker: w.worker.clone(),
                    why: Unload::Idle,
                });
            }
        }
    }

    // first holders before extra ones; more queued first
    let mut order: Vec<(&ModelDemand, u32)> = holders
        .iter()
        .filter_map(|(id, want)| by_id.get(id.as_str()).map(|m| (*m, *want)))
        .collect();
    let count = |slots: &[Slot<'_>], id: &str| {
        slots.iter().filter(|s| s.held.contains_key(id)).count() as u32
    };
    order.sort_by(|(a, _), (b, _)| {
        let (ha, hb) = (count(&slots, &a.model) > 0, count(&slots, &b.model) > 0);
        ha.cmp(&hb)
            .then(b.queued.cmp(&a.queued))
            .then_with(|| a.model.cmp(&b.model))
    });
    let mut unplaced: Vec<Copies<'_>> = Vec::new();
    for (m, want) in order {
        let mut have = count(&slots, &m.model);
        while have < want {
            let Some(i) = place(&mut slots, m, &by_id, &mut actions) else {
                unplaced.push(Copies {
                    model: &m.model,
                    memory_bytes: m.memory_bytes,
                    copies: want - have,
                });
                break;
            };
            actions.push(Action::Load {
                model: m.model.clone(),
                worker: slots[i].w.worker.clone(),
            });
            have += 1;
        }
    }

    // room for every model that wants a holder, idle ones within `idleUnloadAfter` too, held
    // for the stable window: a model between two requests should not wait for a worker
    let mut memory_floor = held_floor(
        &mut state.floors,
        workers_needed(&reserve, cap),
        now,
        spec.workers.stable_window,
    );
    if !unplaced.is_empty() {
        let ready = u32::try_from(slots.len()).unwrap_or(u32::MAX);
        memory_floor = memory_floor.max(ready.saturating_add(workers_needed(&unplaced, cap)));
    }
    if memory_floor > spec.max_workers() {
        for c in &unplaced {
            conditions.push(Condition::AtMaxWorkers {
                model: c.model.to_string(),
            });
        }
    }
    let total = Observed {
        backlog: models.iter().map(|m| m.queued).sum(),
        in_flight: models.iter().map(|m| m.in_flight).sum(),
        last_request_at: models.iter().filter_map(|m| m.last_request_at).max(),
        spot: obs.spot.clone(),
        on_demand: obs.on_demand.clone(),
        ..Observed::default()
    };
    let mut sizing = spec.workers.clone();
    sizing.min_replicas = sizing
        .min_replicas
        .max(memory_floor)
        .min(sizing.max_replicas);
    let workers = decide(&total, &sizing, &mut state.workers, now);
    PoolPlan {
        actions,
        workers,
        memory_floor,
        holders,
        conditions,
    }
}

/// The highest of `floor` and the floors of the trailing `window`, kept in `recent`; zero
/// at once when no model wants a holder any more (there is nothing to keep room for: the
/// worker count's own windows and scale to zero take over).
fn held_floor(
    recent: &mut VecDeque<(Duration, u32)>,
    floor: u32,
    now: Duration,
    window: Duration,
) -> u32 {
    if floor == 0 {
        recent.clear();
        return 0;
    }
    while recent.front().is_some_and(|(t, _)| *t + window <= now) {
        recent.pop_front();
    }
    while recent.back().is_some_and(|(_, f)| *f <= floor) {
        recent.pop_back();
    }
    recent.push_back((now, floor));
    recent.front().map_or(floor, |(_, f)| *f)
}

fn slot(w: &WorkerState) -> Slot<'_> {
    let mut held: BTreeMap<&str, Option<(Duration, u64)>> = BTreeMap::new();
    for l in &w.loaded {
        held.insert(&l.model, Some((l.last_used, l.in_flight)));
    }
    for m in &w.loading {
        held.insert(m, None);
    }
    Slot {
        w,
        free: w.free_memory_bytes,
        held,
    }
}

/// Models on `s` that may be evicted, least recently used first: loaded (not loading, not
/// placed this tick), no job on this worker, none queued.
fn evictable<'a>(s: &Slot<'a>, by_id: &BTreeMap<&str, &ModelDemand>) -> Vec<(&'a str, u64)> {
    let mut v: Vec<(Duration, &'a str, u64)> = s
        .held
        .iter()
        .filter_map(|(id, use_)| {
            let (last, jobs) = (*use_)?;
            let m = by_id.get(id)?;
            (jobs == 0 && m.queued == 0).then_some((last, *id, m.memory_bytes))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, id, mem)| (id, mem)).collect()
}

/// How good a worker is for a load by eviction (lower is better): evictions, not cached,
/// loading, jobs, index.
type EvictionRank = (usize, bool, bool, u64, usize);

/// Places one copy of `m` on the best worker (evicting there if that is the class chosen);
/// returns the worker's index.
fn place<'a>(
    slots: &mut [Slot<'a>],
    m: &'a ModelDemand,
    by_id: &BTreeMap<&'a str, &'a ModelDemand>,
    actions: &mut Vec<Action>,
) -> Option<usize> {
    let need = m.memory_bytes;
    let id = m.model.as_str();
    let cached = |s: &Slot<'_>| s.w.cached.iter().any(|c| c == id);
    let candidates = || {
        (0..slots.len()).filter(|i| {
            !slots[*i].held.contains_key(id) && !slots[*i].w.refused.iter().any(|r| r == id)
        })
    };
    let rank = |i: &usize| {
        let s = &slots[*i];
        (s.w.is_loading(), s.w.in_flight(), s.free, *i)
    };
    let fits = |i: &usize| slots[*i].free >= need;
    let pick = candidates()
        .filter(|i| fits(i) && cached(&slots[*i]))
        .min_by_key(rank)
        .or_else(|| candidates().filter(fits).min_by_key(rank));
    let pick = match pick {
        Some(i) => i,
        None => {
            // the fewest least-recently-used evictions that make room
            let mut best: Option<(EvictionRank, Vec<(&'a str, u64)>)> = None;
            for i in candidates() {
                let s = &slots[i];
                let mut free = s.free;
                let mut out = Vec::new();
                for (victim, mem) in evictable(s, by_id) {
                    if free >= need {
                        break;
                    }
                    free += mem;
                    out.push((victim, mem));
                }
                if free < need {
                    continue;
                }
                let key = (out.len(), !cached(s), s.w.is_loading(), s.w.in_flight(), i);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, out));
                }
            }
            let ((.., i), out) = best?;
            let s = &mut slots[i];
            for (victim, mem) in out {
                s.held.remove(victim);
                s.free += mem;
                actions.push(Action::Unload {
                    model: victim.to_string(),
                    worker: s.w.worker.clone(),
                    why: Unload::Evicted {
                        for_model: id.to_string(),
                    },
                });
            }
            i
        }
    };
    let s = &mut slots[pick];
    s.free -= need;
    s.held.insert(&m.model, None);
    Some(pick)
}
