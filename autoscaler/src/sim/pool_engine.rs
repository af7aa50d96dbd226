//! The pool replay: the trace's requests, each for one of several models, into one queue per
//! model; pool workers (pods with the profile's cold start, billed like a fleet's replicas)
//! that hold models and load one in the swap time; the pure placement ([`crate::pool::plan`])
//! deciding loads, unloads and the worker count every tick. Service reuses the fleet's
//! replicas ([`Replica::serve`]): a worker's sequences of all its models share its compute.
//! No spot interruptions or outages here (the comparison runs every strategy without them).

use super::engine::{FleetConfig, PolicyRun, Sample};
use super::fleet::{Capacity, Job, Phase, Replica, StepEvents};
use super::trace::Request;
use crate::observed::CapacityObserved;
use crate::pool::{plan, Action, LoadedModel, ModelDemand, PoolObserved, PoolSpec, PoolState};
use crate::pool::{Unload, WorkerState};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// The pool being replayed.
#[derive(Debug, Clone, Serialize)]
pub struct PoolConfig {
    /// The pool's spec (worker memory, idle unload, worker sizing).
    pub spec: PoolSpec,
    /// Model names, by model index.
    pub names: Vec<String>,
    /// Device memory of each model's weights, bytes, by model index.
    pub memory_bytes: Vec<u64>,
    /// Loading a model its worker's node has cached, ms.
    pub swap_ms: u64,
    /// Loading a model its worker's node has not cached yet, ms.
    pub swap_uncached_ms: u64,
    /// Decision interval.
    pub tick: Duration,
}

/// What the pool did besides serving.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolStats {
    /// Models loaded.
    pub loads: u64,
    /// Of them, from the node's cache.
    pub cached_loads: u64,
    /// Models unloaded to make room.
    pub evictions: u64,
    /// Models unloaded after idling.
    pub idle_unloads: u64,
    /// Billed worker-ms with nothing loaded: the pool's own overhead in the fleet-time split.
    pub overhead_ms: u64,
    /// Ticks on which a model could not be served as asked (too large, at max workers).
    pub condition_ticks: u64,
}

struct Worker {
    id: String,
    replica: Replica,
    /// (model, last used ms)
    loaded: Vec<(usize, u64)>,
    /// (model, ready at ms)
    loading: Vec<(usize, u64)>,
    cached: BTreeSet<usize>,
}

impl Worker {
    fn jobs_of(&self, m: usize, model_of: &[usize]) -> u64 {
        self.replica
            .seqs
            .iter()
            .filter(|j| model_of[j.req] == m)
            .count() as u64
    }
}

/// Replays `reqs` (sorted by arrival; request `i` is for model `model_of[i]`) on the pool.
/// With `warm_up_ms`, the same requests play once before, unmeasured, and the measured ones
/// start at that ms (at or after the last arrival), as `--warm-up` plays one fleet's trace:
/// the pool meets the trace as its own traffic leaves it, and the workers up when measuring
/// starts pay their cold start. What it returns is about `reqs` alone.
pub fn run_pool(
    reqs: &[Request],
    model_of: &[usize],
    fleet: &FleetConfig,
    pool: &PoolConfig,
    warm_up_ms: Option<u64>,
) -> (PolicyRun, PoolStats) {
    let Some(length_ms) = warm_up_ms else {
        return replay(reqs, model_of, fleet, pool, 0);
    };
    let n = reqs.len();
    let shifted = reqs.iter().map(|r| Request {
        arrival_ms: r.arrival_ms + length_ms,
        ..*r
    });
    let all: Vec<Request> = reqs.iter().copied().chain(shifted).collect();
    let models: Vec<usize> = model_of.iter().chain(model_of).copied().collect();
    let (mut run, stats) = replay(&all, &models, fleet, pool, length_ms);
    run.queue_wait_ms.drain(..n);
    run.ttft_ms.drain(..n);
    run.evicted_after_first_token.drain(..n);
    run.completions.drain(..n);
    (run, stats)
}

/// The replay loop over `reqs`, measuring (billing, counting, sampling) from
/// `measure_from_ms` on.
fn replay(
    reqs: &[Request],
    model_of: &[usize],
    fleet: &FleetConfig,
    pool: &PoolConfig,
    measure_from_ms: u64,
) -> (PolicyRun, PoolStats) {
    let n = reqs.len();
    let models = pool.names.len();
    let p = &fleet.profile;
    let mut run = PolicyRun::empty("pool", n);
    let mut stats = PoolStats::default();
    let mut state = PoolState::new(&pool.spec);
    let mut queues: Vec<VecDeque<Job>> = vec![VecDeque::new(); models];
    let mut last_request: Vec<Option<u64>> = vec![None; models];
    let mut workers: Vec<Worker> = Vec::new();
    let mut next_id = 0u64;
    let by_name: BTreeMap<&str, usize> = pool
        .names
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let dt = fleet.dt_ms.max(1);
    let interval = (pool.tick.as_millis() as u64).max(dt);
    let cold_ms = p.cold_start_ms();
    let max_seqs = p.max_concurrent_seqs as usize;
    let budget = fleet
        .claim_prefill_budget_s
        .map(|s| s * p.prefill_tokens_per_s);
    let trace_end = reqs.last().map_or(0, |r| r.arrival_ms);
    let (mut t, mut next, mut next_tick) = (0u64, 0usize, 0u64);
    let mut next_sample = measure_from_ms;
    let (mut completed, mut arrivals) = (0usize, 0u64);
    let mut desired = 0u32;
    let mut entered = false;
    loop {
        let measuring = t >= measure_from_ms;
        if measuring && !entered {
            bill_on_entry(&workers, &mut run, t, cold_ms);
            entered = true;
        }
        // the warm-up's counts are left out of the stats (each adds 0 or 1)
        let counted = u64::from(measuring);
        while next < n && reqs[next].arrival_ms <= t {
            let r = &reqs[next];
            queues[model_of[next]].push_back(Job::new(next, r.prompt_tokens, r.generated_tokens));
            last_request[model_of[next]] = Some(r.arrival_ms);
            next += 1;
            arrivals += u64::from(r.arrival_ms >= measure_from_ms);
        }
        if t >= next_tick {
            let obs = observe(&workers, &queues, &last_request, model_of, pool);
            let planned = plan(&obs, &pool.spec, &mut state, Duration::from_millis(t));
            stats.condition_ticks += counted * u64::from(!planned.conditions.is_empty());
            for a in &planned.actions {
                match a {
                    Action::Unload { model, worker, why } => {
                        let (Some(m), Some(w)) = (
                            by_name.get(model.as_str()),
                            workers.iter_mut().find(|w| &w.id == worker),
                        ) else {
                            continue;
                        };
                        w.loaded.retain(|(x, _)| x != m);
                        match why {
                            Unload::Idle => stats.idle_unloads += counted,
                            Unload::Evicted { .. } => stats.evictions += counted,
                        }
                    }
                    Action::Load { model, worker } => {
                        let (Some(m), Some(w)) = (
                            by_name.get(model.as_str()),
                            workers.iter_mut().find(|w| &w.id == worker),
                        ) else {
                            continue;
                        };
                        let cached = w.cached.contains(m);
                        let ms = if cached {
                            pool.swap_ms
                        } else {
                            pool.swap_uncached_ms
                        };
                        w.loading.push((*m, t + ms));
                        stats.loads += counted;
                        stats.cached_loads += counted * u64::from(cached);
                    }
                }
            }
            let (spot, on_demand) = (planned.workers.spot, planned.workers.on_demand);
            desired = spot + on_demand;
            reconcile(
                &mut workers,
                &mut next_id,
                spot,
                on_demand,
                t,
                fleet.drain_ms,
            );
            next_tick += interval;
        }
        // lifecycle: every capacity is there at once (no outages in this comparison)
        for w in &mut workers {
            let r = &mut w.replica;
            if r.phase == Phase::Unscheduled {
                r.phase = Phase::Starting {
                    ready_at_ms: t + cold_ms,
                };
                run.cold_starts += counted;
            }
            if let Phase::Starting { ready_at_ms } = r.phase {
                if t >= ready_at_ms {
                    r.phase = Phase::Ready;
                }
            }
            let done: Vec<(usize, u64)> = w
                .loading
                .iter()
                .filter(|(_, at)| *at <= t)
                .copied()
                .collect();
            w.loading.retain(|(_, at)| *at > t);
            for (m, _) in done {
                w.loaded.push((m, t));
                w.cached.insert(m);
            }
        }
        let mut i = 0;
        while i < workers.len() {
            let gone = match workers[i].replica.phase {
                Phase::Draining { until_ms } => t >= until_ms || workers[i].replica.seqs.is_empty(),
                _ => false,
            };
            if !gone {
                i += 1;
                continue;
            }
            let mut w = workers.remove(i);
            for j in w.replica.seqs.iter().filter(|j| j.delivered > 0) {
                run.evicted_after_first_token[j.req] = true;
            }
            let (jobs, recompute) = w.replica.evict(|k| reqs[k].prompt_tokens);
            run.recomputed_tokens += counted * recompute;
            for job in jobs {
                queues[model_of[job.req]].push_back(job);
            }
        }
        // claim: the model whose oldest job arrived first goes first
        let mut order: Vec<(u64, usize)> = queues
            .iter()
            .enumerate()
            .filter_map(|(m, q)| q.front().map(|j| (reqs[j.req].arrival_ms, m)))
            .collect();
        order.sort_unstable();
        for (_, m) in order {
            while !queues[m].is_empty() {
                let room = |w: &Worker| {
                    let r = &w.replica;
                    let limit = |b: f64| if r.prefilled { b } else { f64::MIN_POSITIVE };
                    let queued = || r.seqs.iter().map(|j| j.prefill_left).sum::<f64>();
                    r.claims()
                        && r.seqs.len() < max_seqs
                        && w.loaded.iter().any(|(x, _)| *x == m)
                        && budget.is_none_or(|b| queued() < limit(b))
                };
                let Some(k) = (0..workers.len())
                    .filter(|k| room(&workers[*k]))
                    .min_by_key(|k| (workers[*k].replica.seqs.len(), *k))
                else {
                    break;
                };
                let Some(job) = queues[m].pop_front() else {
                    break;
                };
                let wait = &mut run.queue_wait_ms[job.req];
                if wait.is_none() {
                    *wait = Some(t.saturating_sub(reqs[job.req].arrival_ms));
                }
                workers[k].replica.seqs.push(job);
            }
        }
        let mut ev = StepEvents::default();
        for w in &mut workers {
            for (m, used) in &mut w.loaded {
                if w.replica.seqs.iter().any(|j| model_of[j.req] == *m) {
                    *used = t;
                }
            }
            w.replica.serve(p, t, dt, &mut ev);
            if !measuring || !w.replica.billed() {
                continue;
            }
            match w.replica.capacity {
                Capacity::Spot => run.spot_ms += dt,
                Capacity::OnDemand => run.on_demand_ms += dt,
            }
            if w.loaded.is_empty() && w.loading.is_empty() {
                stats.overhead_ms += dt;
            }
        }
        for (req, at) in ev.first_tokens {
            let slot = &mut run.ttft_ms[req];
            if slot.is_none() {
                *slot = Some(at.saturating_sub(reqs[req].arrival_ms));
            }
        }
        for (req, _) in ev.completions {
            run.completions[req] += 1;
            completed += 1;
        }
        if t >= next_sample {
            let ready = |cap: Capacity| {
                workers
                    .iter()
                    .filter(|w| w.replica.capacity == cap && w.replica.phase == Phase::Ready)
                    .count() as u32
            };
            run.series.push(Sample {
                t_s: (t - measure_from_ms) as f64 / 1000.0,
                arrivals_per_s: arrivals as f64 * 1000.0 / fleet.sample_ms.max(1) as f64,
                ready_spot: ready(Capacity::Spot),
                ready_on_demand: ready(Capacity::OnDemand),
                billed: workers.iter().filter(|w| w.replica.billed()).count() as u32,
                backlog: queues.iter().map(|q| q.len() as u64).sum(),
                desired,
                reason: None,
            });
            arrivals = 0;
            next_sample += fleet.sample_ms.max(dt);
        }
        t += dt;
        let finished = next == n && completed >= n && t > trace_end;
        if finished || t > trace_end + fleet.max_overrun_ms {
            break;
        }
    }
    run.end_ms = t.saturating_sub(measure_from_ms);
    (run, stats)
}

/// Bills, when measuring starts at `t`, the cold starts of the workers already up, as the
/// fleet replay does (whole for a ready one, the part before `t` for one still starting), so
/// that a warmed pool pays for the workers it starts with.
fn bill_on_entry(workers: &[Worker], run: &mut PolicyRun, t: u64, cold_ms: u64) {
    for w in workers {
        let before_ms = match w.replica.phase {
            Phase::Ready => cold_ms,
            Phase::Starting { ready_at_ms } if ready_at_ms < t + cold_ms => {
                (t + cold_ms - ready_at_ms).min(cold_ms)
            }
            _ => continue,
        };
        run.cold_starts += 1;
        match w.replica.capacity {
            Capacity::Spot => run.spot_ms += before_ms,
            Capacity::OnDemand => run.on_demand_ms += before_ms,
        }
    }
}

fn observe(
    workers: &[Worker],
    queues: &[VecDeque<Job>],
    last_request: &[Option<u64>],
    model_of: &[usize],
    pool: &PoolConfig,
) -> PoolObserved {
    let ms = Duration::from_millis;
    let models = (0..pool.names.len())
        .map(|m| ModelDemand {
            model: pool.names[m].clone(),
            queued: queues[m].len() as u64,
            in_flight: workers.iter().map(|w| w.jobs_of(m, model_of)).sum(),
            last_request_at: last_request[m].map(ms),
            memory_bytes: pool.memory_bytes[m],
        })
        .collect();
    let mut obs = PoolObserved {
        models,
        ..PoolObserved::default()
    };
    for w in workers {
        let c: &mut CapacityObserved = match w.replica.capacity {
            Capacity::Spot => &mut obs.spot,
            Capacity::OnDemand => &mut obs.on_demand,
        };
        match w.replica.phase {
            Phase::Unscheduled => c.pending_since.push(ms(w.replica.created_ms)),
            Phase::Starting { .. } => c.starting += 1,
            Phase::Ready => c.ready += 1,
            Phase::Draining { .. } => {}
        }
        if w.replica.phase != Phase::Ready {
            continue;
        }
        let used: u64 = w
            .loaded
            .iter()
            .map(|(m, _)| *m)
            .chain(w.loading.iter().map(|(m, _)| *m))
            .map(|m| pool.memory_bytes[m])
            .sum();
        obs.workers.push(WorkerState {
            worker: w.id.clone(),
            node: w.id.clone(),
            free_memory_bytes: pool.spec.worker_memory_bytes.saturating_sub(used),
            loaded: w
                .loaded
                .iter()
                .map(|(m, used)| LoadedModel {
                    model: pool.names[*m].clone(),
                    last_used: ms(*used),
                    in_flight: w.jobs_of(*m, model_of),
                })
                .collect(),
            loading: w
                .loading
                .iter()
                .map(|(m, _)| pool.names[*m].clone())
                .collect(),
            cached: w.cached.iter().map(|m| pool.names[*m].clone()).collect(),
            refused: Vec::new(),
        });
    }
    obs
}

/// Brings each capacity type to its desired count: new workers wait for capacity; surplus
/// ones go in the engine's order (waiting, starting newest first, then the least loaded),
/// ready ones by draining.
fn reconcile(
    workers: &mut Vec<Worker>,
    next_id: &mut u64,
    spot: u32,
    on_demand: u32,
    t: u64,
    drain_ms: u64,
) {
    for (cap, want) in [(Capacity::Spot, spot), (Capacity::OnDemand, on_demand)] {
        let live: Vec<usize> = (0..workers.len())
            .filter(|i| workers[*i].replica.capacity == cap && workers[*i].replica.live())
            .collect();
        let have = live.len() as u32;
        for _ in have..want {
            workers.push(Worker {
                id: format!("worker-{next_id}"),
                replica: Replica::new(cap, t),
                loaded: Vec::new(),
                loading: Vec::new(),
                cached: BTreeSet::new(),
            });
            *next_id += 1;
        }
        if have <= want {
            continue;
        }
        let mut order = live;
        order.sort_by_key(|i| {
            let w = &workers[*i];
            let rank = match w.replica.phase {
                Phase::Unscheduled => 0,
                Phase::Starting { .. } => 1,
                _ => 2,
            };
            (
                rank,
                w.replica.seqs.len(),
                w.loaded.len() + w.loading.len(),
                std::cmp::Reverse(w.replica.created_ms),
                std::cmp::Reverse(*i),
            )
        });
        let mut gone = Vec::new();
        for i in order.into_iter().take((have - want) as usize) {
            let r = &mut workers[i].replica;
            match r.phase {
                Phase::Unscheduled | Phase::Starting { .. } => gone.push(i),
                _ => {
                    r.phase = Phase::Draining {
                        until_ms: t + drain_ms,
                    }
                }
            }
        }
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for i in gone {
            workers.remove(i);
        }
    }
}
