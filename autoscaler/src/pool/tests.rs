//! The placement's rules, table-driven, and its invariants on seeded random pools.

use super::*;
use crate::spec::{CapacityMode, ScalingSpec};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

fn s(x: u64) -> Duration {
    Duration::from_secs(x)
}

/// Workers of 100 bytes, 4 jobs each, unload after 60 s idle, zero after 120 s.
fn spec() -> PoolSpec {
    PoolSpec {
        worker_memory_bytes: 100,
        idle_unload_after: s(60),
        workers: ScalingSpec {
            max_replicas: 20,
            target_in_flight_per_replica: 4.0,
            scale_to_zero_after: s(120),
            capacity_mode: CapacityMode::OnDemand,
            ..ScalingSpec::default()
        },
    }
}

fn model(id: &str, queued: u64, in_flight: u64, memory_bytes: u64) -> ModelDemand {
    ModelDemand {
        model: id.into(),
        queued,
        in_flight,
        last_request_at: (queued + in_flight > 0).then_some(s(1000)),
        memory_bytes,
    }
}

/// A worker with `loaded` as (model, last used s, jobs) and `cached` models on its node.
fn worker(id: &str, free: u64, loaded: &[(&str, u64, u64)], cached: &[&str]) -> WorkerState {
    WorkerState {
        worker: id.into(),
        node: format!("node-{id}"),
        free_memory_bytes: free,
        loaded: loaded
            .iter()
            .map(|(m, t, j)| LoadedModel {
                model: (*m).into(),
                last_used: s(*t),
                in_flight: *j,
            })
            .collect(),
        loading: Vec::new(),
        cached: cached.iter().map(|c| (*c).into()).collect(),
        refused: Vec::new(),
    }
}

fn pool(models: Vec<ModelDemand>, workers: Vec<WorkerState>) -> PoolObserved {
    let ready = workers.len() as u32;
    PoolObserved {
        models,
        workers,
        on_demand: crate::observed::CapacityObserved {
            ready,
            ..Default::default()
        },
        ..PoolObserved::default()
    }
}

fn plan_once(obs: &PoolObserved) -> PoolPlan {
    let spec = spec();
    plan(obs, &spec, &mut PoolState::new(&spec), s(1000))
}

fn load(m: &str, w: &str) -> Action {
    Action::Load {
        model: m.into(),
        worker: w.into(),
    }
}

fn evict(m: &str, w: &str, for_model: &str) -> Action {
    Action::Unload {
        model: m.into(),
        worker: w.into(),
        why: Unload::Evicted {
            for_model: for_model.into(),
        },
    }
}

fn idle(m: &str, w: &str) -> Action {
    Action::Unload {
        model: m.into(),
        worker: w.into(),
        why: Unload::Idle,
    }
}

#[test]
fn loads_follow_the_preference_order() {
    // (case, models, workers, actions)
    type Case = (
        &'static str,
        Vec<ModelDemand>,
        Vec<WorkerState>,
        Vec<Action>,
    );
    let cases: Vec<Case> = vec![
        (
            "already held: nothing to do",
            vec![model("m", 3, 0, 40)],
            vec![
                worker("a", 60, &[("m", 990, 0)], &[]),
                worker("b", 100, &[], &["m"]),
            ],
            vec![],
        ),
        (
            "being loaded counts as held",
            vec![model("m", 3, 0, 40)],
            vec![WorkerState {
                loading: vec!["m".into()],
                ..worker("a", 60, &[], &[])
            }],
            vec![],
        ),
        (
            "a cached node beats a freer, idler worker",
            vec![model("m", 1, 0, 40)],
            vec![
                worker("a", 100, &[], &[]),
                worker("b", 40, &[("x", 999, 3)], &["m"]),
            ],
            vec![load("m", "b")],
        ),
        (
            "free memory beats an eviction, even on a cached node",
            vec![
                model("m", 1, 0, 40),
                model("x", 0, 0, 60),
                model("y", 0, 0, 40),
            ],
            vec![
                worker("a", 40, &[("x", 990, 0)], &[]),
                worker("b", 0, &[("x", 950, 0), ("y", 950, 0)], &["m"]),
            ],
            vec![load("m", "a")],
        ),
        (
            "among free workers: fewest jobs, then best fit, then id",
            vec![model("m", 1, 0, 40)],
            vec![
                worker("a", 100, &[("x", 999, 1)], &[]),
                worker("b", 60, &[("y", 999, 0)], &[]),
                worker("c", 50, &[("z", 999, 0)], &[]),
                worker("d", 50, &[("w", 999, 0)], &[]),
            ],
            vec![load("m", "c")],
        ),
        (
            "never a worker that failed to load the model, however good it is",
            vec![model("m", 1, 0, 40)],
            vec![
                WorkerState {
                    refused: vec!["m".into()],
                    ..worker("a", 100, &[], &["m"])
                },
                worker("b", 60, &[("x", 999, 2)], &[]),
            ],
            vec![load("m", "b")],
        ),
        (
            "a worker that is loading comes after one that is not",
            vec![model("m", 1, 0, 40)],
            vec![
                WorkerState {
                    loading: vec!["y".into()],
                    ..worker("a", 60, &[], &[])
                },
                worker("b", 60, &[("x", 999, 2)], &[]),
            ],
            vec![load("m", "b")],
        ),
        (
            "evicts the least recently used idle model, only as many as needed",
            vec![
                model("m", 2, 0, 50),
                model("old", 0, 0, 30),
                model("new", 0, 0, 30),
                model("mid", 0, 0, 30),
            ],
            vec![worker(
                "a",
                10,
                &[("new", 990, 0), ("old", 945, 0), ("mid", 960, 0)],
                &[],
            )],
            vec![
                evict("old", "a", "m"),
                evict("mid", "a", "m"),
                load("m", "a"),
            ],
        ),
        (
            "never evicts a model with jobs on that worker or queued",
            vec![
                model("m", 2, 0, 50),
                model("busy", 0, 1, 40),
                model("waiting", 5, 0, 40),
                model("idle", 0, 0, 20),
            ],
            vec![worker(
                "a",
                0,
                &[("busy", 900, 1), ("waiting", 900, 0), ("idle", 999, 0)],
                &[],
            )],
            vec![],
        ),
        (
            "the eviction with the fewest victims wins, then a cached node",
            vec![
                model("m", 1, 0, 50),
                model("p", 0, 0, 25),
                model("q", 0, 0, 25),
                model("r", 0, 0, 50),
            ],
            vec![
                worker("a", 0, &[("p", 950, 0), ("q", 951, 0), ("x", 1, 1)], &["m"]),
                worker("b", 0, &[("r", 999, 0), ("y", 1, 1)], &[]),
                worker("c", 0, &[("r", 999, 0), ("z", 1, 1)], &["m"]),
            ],
            vec![evict("r", "c", "m"), load("m", "c")],
        ),
        (
            "idle past the unload timeout: unloaded, and its memory reused",
            vec![model("m", 1, 0, 100), model("x", 0, 0, 100)],
            vec![worker("a", 0, &[("x", 940, 0)], &[])],
            vec![idle("x", "a"), load("m", "a")],
        ),
        (
            "idle but queued, or with a job there: kept",
            vec![model("x", 3, 0, 50), model("y", 0, 1, 50)],
            vec![worker("a", 0, &[("x", 1, 0), ("y", 1, 1)], &[])],
            vec![],
        ),
        (
            "a model the pool no longer serves is unloaded once idle",
            vec![],
            vec![worker(
                "a",
                0,
                &[("gone", 999, 0), ("draining", 999, 1)],
                &[],
            )],
            vec![idle("gone", "a")],
        ),
        (
            "first holders before a hot model's second",
            vec![model("a-hot", 40, 0, 50), model("z-cold", 1, 0, 50)],
            vec![
                worker("a", 0, &[("a-hot", 999, 0), ("q", 999, 1)], &[]),
                worker("b", 50, &[("z", 999, 2)], &[]),
            ],
            vec![load("z-cold", "b")],
        ),
    ];
    for (name, mut models, workers, want) in cases {
        // the models the workers hold are served by the pool, unless the case says otherwise
        if !name.contains("no longer") {
            for l in workers.iter().flat_map(|w| &w.loaded) {
                if !models.iter().any(|m| m.model == l.model) {
                    models.push(model(&l.model, 0, l.in_flight, 10));
                }
            }
        }
        let got = plan_once(&pool(models, workers));
        assert_eq!(got.actions, want, "{name}");
    }
}

#[test]
fn a_model_with_no_room_raises_the_worker_count() {
    let obs = pool(
        vec![model("m", 1, 0, 60), model("x", 0, 1, 60)],
        vec![worker("a", 40, &[("x", 999, 1)], &[])],
    );
    let p = plan_once(&obs);
    assert!(p.actions.is_empty());
    assert_eq!(p.memory_floor, 2);
    assert_eq!(p.workers.serving, 2);
    assert!(p.conditions.is_empty());
}

#[test]
fn a_model_larger_than_a_worker_is_a_condition_not_a_silent_drop() {
    let obs = pool(vec![model("huge", 5, 0, 101), model("m", 1, 0, 10)], vec![]);
    let p = plan_once(&obs);
    assert_eq!(
        p.conditions,
        vec![Condition::TooLarge {
            model: "huge".into(),
            memory_bytes: 101,
            worker_memory_bytes: 100,
        }]
    );
    assert!(!p.holders.contains_key("huge"));
    // the other model activates one worker (from zero, sized on the instantaneous demand)
    assert_eq!(p.workers.serving, 2);
    assert_eq!(p.memory_floor, 1);
}

#[test]
fn at_max_workers_the_unplaced_model_is_named() {
    let mut sp = spec();
    sp.workers.max_replicas = 1;
    let obs = pool(
        vec![model("m", 1, 0, 60), model("x", 0, 1, 60)],
        vec![worker("a", 40, &[("x", 999, 1)], &[])],
    );
    let p = plan(&obs, &sp, &mut PoolState::new(&sp), s(1000));
    assert_eq!(p.workers.serving, 1);
    assert_eq!(
        p.conditions,
        vec![Condition::AtMaxWorkers { model: "m".into() }]
    );
}

#[test]
fn the_worker_count_sums_demand_and_goes_to_zero_when_every_model_idles() {
    let sp = spec();
    let mut st = PoolState::new(&sp);
    // 3 models with 4 jobs each, 4 per worker: 3 workers, though memory needs one
    let busy = pool(
        vec![
            model("a", 4, 0, 10),
            model("b", 4, 0, 10),
            model("c", 4, 0, 10),
        ],
        vec![],
    );
    let p = plan(&busy, &sp, &mut st, s(1000));
    assert_eq!((p.workers.serving, p.memory_floor), (3, 1));
    // every model idle: the pool keeps what the windows hold, then goes to zero
    let idle = pool(
        vec![
            model("a", 0, 0, 10),
            model("b", 0, 0, 10),
            model("c", 0, 0, 10),
        ]
        .into_iter()
        .map(|m| ModelDemand {
            last_request_at: Some(s(1000)),
            ..m
        })
        .collect(),
        vec![],
    );
    let later = plan(&idle, &sp, &mut st, s(1010));
    assert!(later.workers.serving >= 1);
    assert!(later.holders.is_empty());
    let gone = plan(&idle, &sp, &mut st, s(1000 + 120));
    assert_eq!(gone.workers.serving, 0);
}

#[test]
fn a_hot_model_wants_as_many_holders_as_its_own_fleet_would() {
    // 12 jobs at 4 per worker: three holders, spread over the free workers
    let obs = pool(
        vec![model("hot", 12, 0, 50)],
        vec![
            worker("a", 100, &[], &[]),
            worker("b", 100, &[], &["hot"]),
            worker("c", 100, &[], &[]),
        ],
    );
    let p = plan_once(&obs);
    assert_eq!(p.holders.get("hot"), Some(&3));
    assert_eq!(
        p.actions,
        vec![load("hot", "b"), load("hot", "a"), load("hot", "c")]
    );
}

#[test]
fn the_plan_does_not_depend_on_input_order() {
    let models = vec![
        model("a", 2, 0, 30),
        model("b", 1, 1, 30),
        model("c", 0, 0, 30),
        model("d", 5, 0, 30),
    ];
    let workers = vec![
        worker("w1", 10, &[("c", 10, 0), ("b", 900, 1)], &["a"]),
        worker("w2", 40, &[("x", 10, 0)], &[]),
        worker("w3", 70, &[], &["d"]),
    ];
    let one = plan_once(&pool(models.clone(), workers.clone()));
    let mut rm = models;
    let mut rw = workers;
    rm.reverse();
    rw.reverse();
    assert_eq!(plan_once(&pool(rm, rw)), one);
}

/// A random pool: up to 8 models of 10-60 bytes, up to 5 workers with what fits loaded.
fn random_pool(rng: &mut ChaCha8Rng) -> PoolObserved {
    let ids = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"];
    let n = rng.random_range(1..=ids.len());
    let mut models: Vec<ModelDemand> = ids[..n]
        .iter()
        .map(|id| ModelDemand {
            model: (*id).into(),
            queued: if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(1..20)
            },
            in_flight: 0,
            last_request_at: Some(s(rng.random_range(0..1000))),
            memory_bytes: if rng.random_bool(0.05) {
                150
            } else {
                rng.random_range(10..=60)
            },
        })
        .collect();
    let mut workers = Vec::new();
    for k in 0..rng.random_range(0..=5) {
        let mut free = 100u64;
        let mut w = worker(&format!("w{k}"), 0, &[], &[]);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(rng);
        for i in order {
            let m = &mut models[i];
            if m.memory_bytes > free || rng.random_bool(0.4) {
                continue;
            }
            free -= m.memory_bytes;
            if rng.random_bool(0.1) {
                w.loading.push(m.model.clone());
                continue;
            }
            let jobs = if rng.random_bool(0.3) {
                rng.random_range(1..5)
            } else {
                0
            };
            m.in_flight += jobs;
            w.loaded.push(LoadedModel {
                model: m.model.clone(),
                last_used: s(rng.random_range(800..1000)),
                in_flight: jobs,
            });
        }
        w.free_memory_bytes = free;
        w.cached = ids[..n]
            .iter()
            .filter(|_| rng.random_bool(0.3))
            .map(|m| (*m).into())
            .collect();
        workers.push(w);
    }
    pool(models, workers)
}

#[test]
fn random_pools_keep_the_invariants() {
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    for round in 0..3000 {
        let obs = random_pool(&mut rng);
        let sp = spec();
        let mut st = PoolState::new(&sp);
        // a warm state: a few earlier ticks on the same pool
        for t in [900, 950] {
            plan(&obs, &sp, &mut st, s(t));
        }
        let mut again = st.clone();
        let p = plan(&obs, &sp, &mut st, s(1000));
        // deterministic, whatever the input order
        let mut shuffled = obs.clone();
        shuffled.models.shuffle(&mut rng);
        shuffled.workers.shuffle(&mut rng);
        assert_eq!(
            plan(&shuffled, &sp, &mut again, s(1000)),
            p,
            "round {round}"
        );

        let mem = |id: &str| {
            obs.models
                .iter()
                .find(|m| m.model == id)
                .map_or(0, |m| m.memory_bytes)
        };
        let mut free: std::collections::BTreeMap<&str, i128> = obs
            .workers
            .iter()
            .map(|w| (w.worker.as_str(), i128::from(w.free_memory_bytes)))
            .collect();
        let mut held: std::collections::BTreeSet<(String, String)> = obs
            .workers
            .iter()
            .flat_map(|w| {
                w.loaded
                    .iter()
                    .map(|l| l.model.clone())
                    .chain(w.loading.iter().cloned())
                    .map(|m| (w.worker.clone(), m))
            })
            .collect();
        for a in &p.actions {
            match a {
                Action::Unload { model, worker, .. } => {
                    let w = obs.workers.iter().find(|w| &w.worker == worker).unwrap();
                    let l = w.loaded.iter().find(|l| &l.model == model);
                    assert!(
                        l.is_some_and(|l| l.in_flight == 0),
                        "round {round}: {a:?} has jobs"
                    );
                    let queued = obs
                        .models
                        .iter()
                        .find(|m| &m.model == model)
                        .map_or(0, |m| m.queued);
                    assert_eq!(queued, 0, "round {round}: {a:?} is queued");
                    assert!(
                        held.remove(&(worker.clone(), model.clone())),
                        "round {round}: {a:?}"
                    );
                    *free.get_mut(worker.as_str()).unwrap() += i128::from(mem(model));
                }
                Action::Load { model, worker } => {
                    assert!(
                        held.insert((worker.clone(), model.clone())),
                        "round {round}: {a:?} twice"
                    );
                    let f = free.get_mut(worker.as_str()).unwrap();
                    *f -= i128::from(mem(model));
                    assert!(*f >= 0, "round {round}: {a:?} oversubscribes");
                }
            }
        }
        let ready = obs.workers.len() as u32;
        for m in obs.models.iter().filter(|m| m.busy()) {
            if m.memory_bytes > sp.worker_memory_bytes {
                assert!(p.conditions.contains(&Condition::TooLarge {
                    model: m.model.clone(),
                    memory_bytes: m.memory_bytes,
                    worker_memory_bytes: sp.worker_memory_bytes,
                }));
                continue;
            }
            let placed = held.iter().any(|(_, x)| x == &m.model);
            assert!(
                placed || p.workers.serving > ready,
                "round {round}: {} neither placed nor more workers ({} of {ready})",
                m.model,
                p.workers.serving
            );
        }
        assert!(p.workers.serving >= p.memory_floor.min(sp.max_workers()));
    }
}

#[test]
fn the_memory_floor_goes_once_no_model_wants_a_holder() {
    let sp = spec();
    let mut st = PoolState::new(&sp);
    let busy = pool(vec![model("a", 1, 0, 10)], vec![]);
    assert_eq!(plan(&busy, &sp, &mut st, s(1000)).memory_floor, 1);
    let idle = pool(
        vec![ModelDemand {
            last_request_at: Some(s(1000)),
            ..model("a", 0, 0, 10)
        }],
        vec![],
    );
    // within idleUnloadAfter the model still wants room, and the window holds it
    assert_eq!(plan(&idle, &sp, &mut st, s(1030)).memory_floor, 1);
    // past it nothing wants room: no floor, though the stable window has not passed
    assert_eq!(plan(&idle, &sp, &mut st, s(1061)).memory_floor, 0);
}
