//! The discrete-time replay loop: arrivals into a FIFO queue (the jobs stream), an autoscaler
//! deciding on its own interval, a fleet reconciling to its decisions (two Deployments, one
//! per capacity type), workers claiming from the queue, and billing of every replica that
//! holds a node. An optional warm-up replays traffic before the measured trace, so that the
//! fleet meets the trace in the state such traffic leaves it instead of empty.

use super::fleet::{Capacity, Job, Phase, Replica, StepEvents};
use super::profile::ServiceProfile;
use super::scalers::{Desired, Scaler};
use super::trace::Request;
use crate::observed::{CapacityObserved, Observed};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::VecDeque;
use std::time::Duration;

/// Everything about the simulated fleet except the autoscaler.
#[derive(Debug, Clone, Serialize)]
pub struct FleetConfig {
    /// Per-replica service model and prices.
    pub profile: ServiceProfile,
    /// Simulation step, ms.
    pub dt_ms: u64,
    /// Drain budget of a replica removed by scale-down, ms.
    pub drain_ms: u64,
    /// Interruption notice length, ms.
    pub notice_ms: u64,
    /// Interruptions per spot replica-hour.
    pub interruptions_per_hour: f64,
    /// `[start, end)` ms intervals in which no spot capacity can be acquired.
    pub spot_outages: Vec<(u64, u64)>,
    /// Time-series sampling interval, ms.
    pub sample_ms: u64,
    /// RNG seed (interruption times).
    pub seed: u64,
    /// Give up this long after the last arrival; whatever is unfinished then is lost.
    pub max_overrun_ms: u64,
    /// A worker claims a job only while its unstarted prefill work is below this many
    /// seconds (`None`: claims whenever it has a free sequence slot).
    pub claim_prefill_budget_s: Option<f64>,
    /// Traffic replayed, unmeasured, before the trace (none: the fleet starts empty).
    pub warm_up: WarmUp,
}

/// Requests replayed before the measured trace. Nothing is measured during the warm-up: no
/// billing, no latency, no cold start. When measuring starts, each replica that is up has its
/// cold start billed (the part of it before the start for one still starting), as a fleet
/// that is ready at the start of a run pays it, so the oracle bounds warmed runs as well.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WarmUp {
    /// The warm-up's requests, sorted by arrival, ms from its start.
    #[serde(rename = "requests", serialize_with = "count")]
    pub requests: Vec<Request>,
    /// Where the measured trace starts on the warm-up's clock, ms: at or after its last
    /// arrival, so that the two play in order.
    pub length_ms: u64,
}

impl WarmUp {
    /// The trace played once before itself, as `repeat` would place it, ending on a whole
    /// second (so that wall clocks shift by whole seconds).
    pub fn once_before(reqs: &[Request]) -> Self {
        Self {
            requests: reqs.to_vec(),
            length_ms: super::trace::period_ms(reqs).div_ceil(1000) * 1000,
        }
    }
}

fn count<S: serde::Serializer>(reqs: &[Request], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(reqs.len() as u64)
}

/// One point of the time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Time, seconds.
    pub t_s: f64,
    /// Arrivals per second over the last interval.
    pub arrivals_per_s: f64,
    /// Ready spot replicas.
    pub ready_spot: u32,
    /// Ready on-demand replicas.
    pub ready_on_demand: u32,
    /// Replicas holding a node (billed).
    pub billed: u32,
    /// Queued jobs.
    pub backlog: u64,
    /// Replicas the autoscaler last asked for (spot and on-demand).
    pub desired: u32,
    /// Why, where the autoscaler says (our policy and the KPA baseline).
    pub reason: Option<&'static str>,
}

/// Raw outcome of replaying a trace under one autoscaler.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// Autoscaler name.
    pub name: String,
    /// Billed replica-ms on spot.
    pub spot_ms: u64,
    /// Billed replica-ms on demand.
    pub on_demand_ms: u64,
    /// Replicas that started (acquired a node).
    pub cold_starts: u64,
    /// Interruption notices received.
    pub interruptions: u64,
    /// Tokens prefilled again after evictions.
    pub recomputed_tokens: u64,
    /// Per request: first claim minus arrival, ms.
    pub queue_wait_ms: Vec<Option<u64>>,
    /// Per request: first token minus arrival, ms.
    pub ttft_ms: Vec<Option<u64>>,
    /// Per request: whether it was evicted (drain or interruption) after its first token.
    pub evicted_after_first_token: Vec<bool>,
    /// Per request: how many times it completed (must be exactly 1).
    pub completions: Vec<u32>,
    /// Time series for plots.
    pub series: Vec<Sample>,
    /// When the run ended, ms.
    pub end_ms: u64,
}

impl PolicyRun {
    /// A run named `name` over `n` requests before anything happened.
    pub fn empty(name: impl Into<String>, n: usize) -> Self {
        Self {
            name: name.into(),
            spot_ms: 0,
            on_demand_ms: 0,
            cold_starts: 0,
            interruptions: 0,
            recomputed_tokens: 0,
            queue_wait_ms: vec![None; n],
            ttft_ms: vec![None; n],
            evicted_after_first_token: vec![false; n],
            completions: vec![0; n],
            series: Vec::new(),
            end_ms: 0,
        }
    }

    fn bill(&mut self, capacity: Capacity, ms: u64) {
        match capacity {
            Capacity::Spot => self.spot_ms += ms,
            Capacity::OnDemand => self.on_demand_ms += ms,
        }
    }
}

/// Whether spot capacity is out at `t` ms (no new spot replica can start).
pub(super) fn in_outage(outages: &[(u64, u64)], t: u64) -> bool {
    outages.iter().any(|(a, b)| t >= *a && t < *b)
}

struct Sim<'a> {
    reqs: &'a [Request],
    cfg: &'a FleetConfig,
    rng: ChaCha8Rng,
    replicas: Vec<Replica>,
    queue: VecDeque<Job>,
    /// Prompt tokens that entered the queue, arrivals and re-enqueued jobs alike, as the
    /// broker counts them (`arrived_prompt_tokens`).
    enqueued_prompt_tokens: u64,
    /// The autoscaler's last decision and its reason, for the time series.
    last_want: Desired,
    last_reason: Option<&'static str>,
    run: PolicyRun,
    completed: usize,
    /// Where measuring starts (the warm-up's length), ms.
    measure_from_ms: u64,
}

impl Sim<'_> {
    /// Puts a job at the end of the queue and counts the tokens its next worker prefills
    /// (a new job's prompt; an evicted one's prompt and delivered tokens), as the broker does.
    fn enqueue(&mut self, job: Job) {
        self.enqueued_prompt_tokens += job.prefill_left.round() as u64;
        self.queue.push_back(job);
    }

    fn observe(&self, last_request: Option<u64>) -> Observed {
        let mut obs = Observed {
            arrived_prompt_tokens: self.enqueued_prompt_tokens,
            backlog: self.queue.len() as u64,
            last_request_at: last_request.map(Duration::from_millis),
            ..Observed::default()
        };
        for r in &self.replicas {
            obs.in_flight += r.seqs.len() as u64;
            // a job has delivered its first token once its (re-)prefill is done
            obs.decoding += r.seqs.iter().filter(|j| j.prefill_left == 0.0).count() as u64;
            let c: &mut CapacityObserved = match r.capacity {
                Capacity::Spot => &mut obs.spot,
                Capacity::OnDemand => &mut obs.on_demand,
            };
            if r.noticed {
                c.interrupted += 1;
                continue;
            }
            match r.phase {
                Phase::Unscheduled => c.pending_since.push(Duration::from_millis(r.created_ms)),
                Phase::Starting { .. } => c.starting += 1,
                Phase::Ready => c.ready += 1,
                Phase::Draining { .. } => {}
            }
        }
        obs
    }

    fn reconcile(&mut self, want: Desired, t: u64) {
        for (cap, want) in [
            (Capacity::Spot, want.spot),
            (Capacity::OnDemand, want.on_demand),
        ] {
            let live: Vec<usize> = (0..self.replicas.len())
                .filter(|i| self.replicas[*i].capacity == cap && self.replicas[*i].live())
                .collect();
            let have = live.len() as u32;
            for _ in have..want {
                self.replicas.push(Replica::new(cap, t));
            }
            if have <= want {
                continue;
            }
            // victims: waiting for capacity, then starting (newest first), then the least loaded
            let mut order = live;
            order.sort_by_key(|i| {
                let r = &self.replicas[*i];
                let rank = match r.phase {
                    Phase::Unscheduled => 0,
                    Phase::Starting { .. } => 1,
                    _ => 2,
                };
                (
                    rank,
                    r.seqs.len(),
                    std::cmp::Reverse(r.created_ms),
                    std::cmp::Reverse(*i),
                )
            });
            let mut gone: Vec<usize> = Vec::new();
            for i in order.into_iter().take((have - want) as usize) {
                let r = &mut self.replicas[i];
                match r.phase {
                    Phase::Unscheduled | Phase::Starting { .. } => gone.push(i),
                    _ => {
                        r.phase = Phase::Draining {
                            until_ms: t + self.cfg.drain_ms,
                        }
                    }
                }
            }
            gone.sort_unstable_by(|a, b| b.cmp(a));
            for i in gone {
                self.replicas.remove(i);
            }
        }
    }

    /// Whether `t` is in the measured trace (the warm-up is not).
    fn measuring(&self, t: u64) -> bool {
        t >= self.measure_from_ms
    }

    fn lifecycle(&mut self, t: u64) {
        let measuring = self.measuring(t);
        // outages are given on the measured trace's clock; the warm-up has none
        let spot_ok = !(measuring && in_outage(&self.cfg.spot_outages, t - self.measure_from_ms));
        let cold_ms = self.cfg.profile.cold_start_ms();
        let rate = self.cfg.interruptions_per_hour;
        for r in &mut self.replicas {
            if r.phase == Phase::Unscheduled && (r.capacity == Capacity::OnDemand || spot_ok) {
                r.phase = Phase::Starting {
                    ready_at_ms: t + cold_ms,
                };
                self.run.cold_starts += u64::from(measuring);
                if r.capacity == Capacity::Spot && rate > 0.0 {
                    let hours = -(1.0 - self.rng.random::<f64>()).ln() / rate;
                    r.interrupt_at_ms = Some(t + (hours * 3_600_000.0) as u64);
                }
            }
            if let Phase::Starting { ready_at_ms } = r.phase {
                if t >= ready_at_ms {
                    r.phase = Phase::Ready;
                }
            }
            if !r.noticed && r.billed() && r.interrupt_at_ms.is_some_and(|at| at <= t) {
                r.noticed = true;
                self.run.interruptions += u64::from(measuring);
                let until = t + self.cfg.notice_ms;
                r.phase = match r.phase {
                    Phase::Draining { until_ms } => Phase::Draining {
                        until_ms: until_ms.min(until),
                    },
                    _ => Phase::Draining { until_ms: until },
                };
            }
        }
        let mut i = 0;
        while i < self.replicas.len() {
            let r = &self.replicas[i];
            let done = match r.phase {
                Phase::Draining { until_ms } => t >= until_ms || r.seqs.is_empty(),
                _ => false,
            };
            if done {
                let mut r = self.replicas.remove(i);
                for j in r.seqs.iter().filter(|j| j.delivered > 0) {
                    self.run.evicted_after_first_token[j.req] = true;
                }
                let reqs = self.reqs;
                let (jobs, recompute) = r.evict(|k| reqs[k].prompt_tokens);
                if measuring {
                    self.run.recomputed_tokens += recompute;
                }
                // re-enqueued like the workers do it: XADD to the end of the stream
                for job in jobs {
                    self.enqueue(job);
                }
            } else {
                i += 1;
            }
        }
    }

    fn claim(&mut self, t: u64) {
        let max = self.cfg.profile.max_concurrent_seqs as usize;
        let budget = self
            .cfg
            .claim_prefill_budget_s
            .map(|s| s * self.cfg.profile.prefill_tokens_per_s);
        let has_room = |r: &Replica| {
            // Before its first prefill step a worker has no measured rate: its budget is the
            // least there is, one job at a time (the runtime's `capacity::budget_tokens`).
            let limit = |b: f64| if r.prefilled { b } else { f64::MIN_POSITIVE };
            let queued = || r.seqs.iter().map(|j| j.prefill_left).sum::<f64>();
            r.claims() && r.seqs.len() < max && budget.is_none_or(|b| queued() < limit(b))
        };
        while !self.queue.is_empty() {
            let pick = (0..self.replicas.len())
                .filter(|i| has_room(&self.replicas[*i]))
                .min_by_key(|i| (self.replicas[*i].seqs.len(), *i));
            let Some(i) = pick else { break };
            let Some(job) = self.queue.pop_front() else {
                break;
            };
            let wait = &mut self.run.queue_wait_ms[job.req];
            if wait.is_none() {
                *wait = Some(t.saturating_sub(self.reqs[job.req].arrival_ms));
            }
            self.replicas[i].seqs.push(job);
        }
    }

    fn serve(&mut self, t: u64) {
        let mut ev = StepEvents::default();
        for r in &mut self.replicas {
            r.serve(&self.cfg.profile, t, self.cfg.dt_ms, &mut ev);
        }
        for (req, at) in ev.first_tokens {
            let slot = &mut self.run.ttft_ms[req];
            if slot.is_none() {
                *slot = Some(at.saturating_sub(self.reqs[req].arrival_ms));
            }
        }
        for (req, _) in ev.completions {
            self.run.completions[req] += 1;
            self.completed += 1;
        }
        if !self.measuring(t) {
            return;
        }
        for r in self.replicas.iter().filter(|r| r.billed()) {
            self.run.bill(r.capacity, self.cfg.dt_ms);
        }
    }

    /// Bills, when measuring starts at `t`, the cold starts of the replicas already up: whole
    /// for a ready one, the part before `t` for one still starting. A draining one serves
    /// only jobs from before and pays only its time from `t` on.
    fn bill_fleet_on_entry(&mut self, t: u64) {
        let cold_ms = self.cfg.profile.cold_start_ms();
        for r in &self.replicas {
            let before_ms = match r.phase {
                Phase::Ready => cold_ms,
                // started before `t` (a cold start after `t` is billed as it goes)
                Phase::Starting { ready_at_ms } if ready_at_ms < t + cold_ms => {
                    (t + cold_ms - ready_at_ms).min(cold_ms)
                }
                _ => continue,
            };
            self.run.cold_starts += 1;
            self.run.bill(r.capacity, before_ms);
        }
    }

    fn sample(&mut self, t: u64, arrivals: u64) {
        let t = t - self.measure_from_ms;
        let count = |cap| {
            self.replicas
                .iter()
                .filter(|r| r.capacity == cap && r.phase == Phase::Ready && !r.noticed)
                .count() as u32
        };
        let s = Sample {
            t_s: t as f64 / 1000.0,
            arrivals_per_s: arrivals as f64 * 1000.0 / self.cfg.sample_ms as f64,
            ready_spot: count(Capacity::Spot),
            ready_on_demand: count(Capacity::OnDemand),
            billed: self.replicas.iter().filter(|r| r.billed()).count() as u32,
            backlog: self.queue.len() as u64,
            desired: self.last_want.spot.saturating_add(self.last_want.on_demand),
            reason: self.last_reason,
        };
        self.run.series.push(s);
    }
}

/// Replays `reqs` (sorted by arrival) under `scaler`, after the fleet's warm-up if it has
/// one; what it returns is about `reqs` alone.
pub fn run_policy(reqs: &[Request], cfg: &FleetConfig, scaler: &mut dyn Scaler) -> PolicyRun {
    let warm = &cfg.warm_up;
    debug_assert!(
        warm.requests
            .last()
            .is_none_or(|r| r.arrival_ms <= warm.length_ms),
        "the warm-up must end before the trace starts"
    );
    let skipped = warm.requests.len();
    let all: Vec<Request> = warm
        .requests
        .iter()
        .copied()
        .chain(reqs.iter().map(|r| Request {
            arrival_ms: r.arrival_ms + warm.length_ms,
            ..*r
        }))
        .collect();
    let mut run = replay(&all, cfg, scaler, warm.length_ms);
    run.queue_wait_ms.drain(..skipped);
    run.ttft_ms.drain(..skipped);
    run.evicted_after_first_token.drain(..skipped);
    run.completions.drain(..skipped);
    run
}

/// The replay loop over `reqs`, measuring from `measure_from_ms` on.
fn replay(
    reqs: &[Request],
    cfg: &FleetConfig,
    scaler: &mut dyn Scaler,
    measure_from_ms: u64,
) -> PolicyRun {
    let n = reqs.len();
    let mut sim = Sim {
        reqs,
        cfg,
        rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        replicas: Vec::new(),
        queue: VecDeque::new(),
        enqueued_prompt_tokens: 0,
        last_want: Desired::default(),
        last_reason: None,
        run: PolicyRun::empty(scaler.name(), n),
        completed: 0,
        measure_from_ms,
    };
    // A fleet that is ready at the start started one cold start earlier: it pays for it when
    // measuring starts, as the warm-up's fleet does.
    let init = scaler.initial();
    for (cap, k) in [
        (Capacity::Spot, init.spot),
        (Capacity::OnDemand, init.on_demand),
    ] {
        for _ in 0..k {
            let mut r = Replica::new(cap, 0);
            r.phase = Phase::Ready;
            sim.replicas.push(r);
        }
    }
    let dt = cfg.dt_ms.max(1);
    let interval = (scaler.interval().as_millis() as u64).max(dt);
    let sample_ms = cfg.sample_ms.max(dt);
    let trace_end = reqs.last().map_or(0, |r| r.arrival_ms);
    let (mut t, mut next, mut next_tick) = (0u64, 0usize, 0u64);
    let mut next_sample = measure_from_ms;
    let mut entered = false;
    let mut last_request = None;
    let mut arrivals = 0u64;
    loop {
        if !entered && sim.measuring(t) {
            sim.bill_fleet_on_entry(t);
            entered = true;
        }
        while next < n && reqs[next].arrival_ms <= t {
            let r = &reqs[next];
            sim.enqueue(Job::new(next, r.prompt_tokens, r.generated_tokens));
            last_request = Some(r.arrival_ms);
            arrivals += u64::from(r.arrival_ms >= measure_from_ms);
            next += 1;
        }
        if t >= next_tick {
            let obs = sim.observe(last_request);
            let want = scaler.desired(&obs, Duration::from_millis(t));
            (sim.last_want, sim.last_reason) = (want, scaler.reason());
            sim.reconcile(want, t);
            next_tick += interval;
        }
        sim.lifecycle(t);
        sim.claim(t);
        sim.serve(t);
        if t >= next_sample {
            sim.sample(t, arrivals);
            arrivals = 0;
            next_sample += sample_ms;
        }
        t += dt;
        let finished = next == n && sim.completed >= n && t > trace_end;
        if finished || t > trace_end + cfg.max_overrun_ms {
            break;
        }
    }
    sim.run.end_ms = t.saturating_sub(measure_from_ms);
    sim.run
}
