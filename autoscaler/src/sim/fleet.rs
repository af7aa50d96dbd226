//! Simulated replicas: capacity acquisition, cold start, continuous-batching service,
//! draining, spot interruption and resumption of unfinished sequences.
//!
//! Service within a step follows vLLM's scheduler: waiting prefills run first (in claim
//! order) at the profile's prefill rate, the rest of the step decodes every running sequence
//! at the batched rate `D(n) / n` each. The first token is emitted when prefill completes.
//! A draining replica (scale-down or interruption notice) claims nothing new; whatever is
//! unfinished when it goes is re-enqueued with the tokens delivered so far, and the resumed
//! job re-prefills prompt + delivered tokens, as the real workers do.

use super::profile::ServiceProfile;
use serde::Serialize;

/// Capacity type of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Capacity {
    /// Spot/preemptible.
    Spot,
    /// On-demand.
    OnDemand,
}

/// Lifecycle of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for capacity (no node); not billed.
    Unscheduled,
    /// Node acquired, starting (node boot, image pull, model load) until `ready_at_ms`; billed.
    Starting {
        /// when the replica becomes ready
        ready_at_ms: u64,
    },
    /// Claiming and serving.
    Ready,
    /// Finishing its sequences, claiming nothing, gone at `until_ms` at the latest.
    Draining {
        /// drain deadline
        until_ms: u64,
    },
}

/// A job: a request's remaining work, in the queue or on a replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Index of the request in the trace.
    pub req: usize,
    /// Prompt tokens still to prefill (prompt + delivered tokens for a resumed job).
    pub prefill_left: f64,
    /// Tokens still to decode after the first.
    pub decode_left: f64,
    /// Tokens delivered to the client so far.
    pub delivered: u32,
    /// Tokens this job must generate in total.
    pub generated_total: u32,
}

impl Job {
    /// A fresh job for a request.
    pub fn new(req: usize, prompt: u32, generated: u32) -> Self {
        Self {
            req,
            prefill_left: f64::from(prompt),
            decode_left: 0.0,
            delivered: 0,
            generated_total: generated.max(1),
        }
    }
}

/// One simulated replica.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Capacity type.
    pub capacity: Capacity,
    /// Creation time (ms).
    pub created_ms: u64,
    /// Lifecycle phase.
    pub phase: Phase,
    /// Sequences running on it, in claim order.
    pub seqs: Vec<Job>,
    /// When its spot node will receive an interruption notice, if ever.
    pub interrupt_at_ms: Option<u64>,
    /// Its node shows an interruption signal.
    pub noticed: bool,
    /// It has run a prefill step, so its worker knows its prefill rate (a worker under a
    /// claim budget in seconds claims one job at a time until then).
    pub prefilled: bool,
}

/// What happened to jobs during one service step.
#[derive(Debug, Default, PartialEq)]
pub struct StepEvents {
    /// (request, time ms) of first tokens.
    pub first_tokens: Vec<(usize, u64)>,
    /// (request, time ms) of completions.
    pub completions: Vec<(usize, u64)>,
}

impl Replica {
    /// A new replica, waiting for capacity.
    pub fn new(capacity: Capacity, now_ms: u64) -> Self {
        Self {
            capacity,
            created_ms: now_ms,
            phase: Phase::Unscheduled,
            seqs: Vec::new(),
            interrupt_at_ms: None,
            noticed: false,
            prefilled: false,
        }
    }

    /// Whether it may claim jobs.
    pub fn claims(&self) -> bool {
        self.phase == Phase::Ready && !self.noticed
    }

    /// Whether it is billed (holds a node).
    pub fn billed(&self) -> bool {
        self.phase != Phase::Unscheduled
    }

    /// Whether it is still counted towards its Deployment's replicas.
    pub fn live(&self) -> bool {
        !matches!(self.phase, Phase::Draining { .. })
    }

    /// Serves its sequences for `dt_ms` starting at `now_ms`.
    pub fn serve(
        &mut self,
        profile: &ServiceProfile,
        now_ms: u64,
        dt_ms: u64,
        ev: &mut StepEvents,
    ) {
        if !matches!(self.phase, Phase::Ready | Phase::Draining { .. }) || self.seqs.is_empty() {
            return;
        }
        let dt = dt_ms as f64 / 1000.0;
        let mut used = 0.0;
        for job in self.seqs.iter_mut().filter(|j| j.prefill_left > 0.0) {
            if used >= dt {
                break;
            }
            let need = job.prefill_left / profile.prefill_tokens_per_s;
            let spend = need.min(dt - used);
            used += spend;
            job.prefill_left -= spend * profile.prefill_tokens_per_s;
            if spend >= need - 1e-12 {
                job.prefill_left = 0.0;
                let at = now_ms + (used * 1000.0).ceil() as u64;
                if job.delivered == 0 {
                    ev.first_tokens.push((job.req, at));
                    job.delivered = 1;
                    job.decode_left = f64::from(job.generated_total - 1);
                }
            }
        }
        self.prefilled |= used > 0.0;
        let decoding = self.seqs.iter().filter(|j| j.prefill_left == 0.0).count() as u32;
        let left = dt - used;
        if decoding > 0 && left > 0.0 {
            let per_seq = left * profile.decode_rate(decoding) / f64::from(decoding);
            for job in self.seqs.iter_mut().filter(|j| j.prefill_left == 0.0) {
                job.decode_left = (job.decode_left - per_seq).max(0.0);
                // whole tokens only: a token is delivered once fully decoded
                let left = (job.decode_left - 1e-9).ceil().max(0.0) as u32;
                job.delivered = job.generated_total.saturating_sub(left).max(1);
            }
        }
        let end = now_ms + dt_ms;
        self.seqs.retain(|j| {
            let finished = j.prefill_left == 0.0 && j.decode_left <= 1e-9;
            if finished {
                ev.completions.push((j.req, end));
            }
            !finished
        });
    }

    /// Takes the unfinished sequences off the replica as resumable jobs; returns them with the
    /// tokens that will be recomputed (prompt + delivered, re-prefilled by the next worker).
    pub fn evict(&mut self, prompt_of: impl Fn(usize) -> u32) -> (Vec<Job>, u64) {
        let mut recompute = 0u64;
        let jobs = self
            .seqs
            .drain(..)
            .map(|mut j| {
                if j.delivered > 0 {
                    // the new worker re-prefills the prompt and every delivered token
                    j.prefill_left = f64::from(prompt_of(j.req) + j.delivered);
                    j.decode_left = f64::from(j.generated_total - j.delivered);
                    recompute += u64::from(prompt_of(j.req) + j.delivered);
                } else {
                    // prefill progress is lost, the prompt is prefilled again
                    let prompt = f64::from(prompt_of(j.req));
                    recompute += (prompt - j.prefill_left).max(0.0).round() as u64;
                    j.prefill_left = prompt;
                }
                j
            })
            .collect();
        (jobs, recompute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> ServiceProfile {
        ServiceProfile {
            name: "t".into(),
            prefill_tokens_per_s: 1000.0,
            decode_tokens_per_s_single: 10.0,
            decode_tokens_per_s_at_max: 20.0,
            max_concurrent_seqs: 4,
            cold_start_s: 10.0,
            spot_price_micros_per_hour: 1,
            on_demand_price_micros_per_hour: 2,
            ttft_slo_s: 1.0,
            target_in_flight: 1.0,
        }
    }

    fn ready_with(jobs: Vec<Job>) -> Replica {
        let mut r = Replica::new(Capacity::OnDemand, 0);
        r.phase = Phase::Ready;
        r.seqs = jobs;
        r
    }

    #[test]
    fn prefill_then_decode_at_the_single_rate() {
        let p = profile();
        // 500-token prompt: 0.5 s prefill; 6 tokens: first at prefill end, 5 more at 10/s
        let mut r = ready_with(vec![Job::new(0, 500, 6)]);
        let mut ev = StepEvents::default();
        let mut t = 0;
        while !r.seqs.is_empty() {
            r.serve(&p, t, 100, &mut ev);
            t += 100;
        }
        assert_eq!(ev.first_tokens, vec![(0, 500)]);
        assert_eq!(ev.completions, vec![(0, 1000)]);
    }

    #[test]
    fn prefill_takes_priority_and_decode_is_batched() {
        let p = profile();
        let mut r = ready_with(vec![Job::new(0, 100, 3), Job::new(1, 100, 3)]);
        let mut ev = StepEvents::default();
        r.serve(&p, 0, 200, &mut ev);
        // both prefills (0.1 s each) fill the step; first tokens at 100 and 200 ms
        assert_eq!(ev.first_tokens, vec![(0, 100), (1, 200)]);
        // then two decoding sequences share D(2) = 10*2/(1+k) with k = (10*4/20-1)/3 = 1/3
        let rate = p.decode_rate(2) / 2.0;
        assert!((rate - 7.5).abs() < 1e-9);
        r.serve(&p, 200, 200, &mut ev);
        assert!((r.seqs[0].decode_left - (2.0 - 0.2 * 7.5)).abs() < 1e-9);
    }

    #[test]
    fn nothing_is_served_before_ready() {
        let p = profile();
        let mut r = ready_with(vec![Job::new(0, 10, 1)]);
        r.phase = Phase::Starting { ready_at_ms: 1000 };
        let mut ev = StepEvents::default();
        r.serve(&p, 0, 100, &mut ev);
        assert_eq!(ev, StepEvents::default());
    }

    #[test]
    fn eviction_resumes_with_delivered_tokens_and_counts_recompute() {
        let mut mid_decode = Job::new(0, 100, 10);
        mid_decode.prefill_left = 0.0;
        mid_decode.delivered = 4;
        mid_decode.decode_left = 6.0;
        let mut mid_prefill = Job::new(1, 100, 10);
        mid_prefill.prefill_left = 40.0;
        let mut r = ready_with(vec![mid_decode, mid_prefill]);
        let (jobs, recompute) = r.evict(|_| 100);
        assert!(r.seqs.is_empty());
        assert_eq!(recompute, 104 + 60);
        assert_eq!(
            (jobs[0].prefill_left, jobs[0].decode_left, jobs[0].delivered),
            (104.0, 6.0, 4)
        );
        assert_eq!((jobs[1].prefill_left, jobs[1].delivered), (100.0, 0));
    }
}
