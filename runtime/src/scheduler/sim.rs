//! Deterministic simulation of the scheduler driving a stand-in model: the workload behind
//! `tidal bench`'s scheduler benchmark and the randomised tests below.
//!
//! The stand-in model samples `model_token(seed, id, position)`, so every generated token
//! is predictable and a repeated, lost or misplaced token is detectable. The simulation
//! reads no clock: the caller times [`run`] to get throughput.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ScheduledBatch, Scheduler, SchedulerConfig, SchedulerError, SeqId};
use crate::kv_cache::hash::fnv1a64;
use crate::speculative::verify;

/// Shape of a simulated workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Sequences in total.
    pub num_seqs: usize,
    /// Prompt lengths, drawn uniformly.
    pub prompt_len: RangeInclusive<usize>,
    /// `max_new_tokens`, drawn uniformly.
    pub max_new_tokens: RangeInclusive<usize>,
    /// Distinct shared prompt prefixes ("system prompts"); 0 for none.
    pub num_prefixes: usize,
    /// Length of each shared prefix (capped by the prompt length).
    pub prefix_len: usize,
    /// New sequences per step; 0 adds them all before the first step.
    pub arrivals_per_step: usize,
    /// Chance, per mille, that a sequence stops (EOS) after a sampled token.
    pub stop_per_mille: u32,
    /// Chance, per mille, that a sequence is cancelled at a step.
    pub cancel_per_mille: u32,
    /// Token ids are drawn from `0..vocab`.
    pub vocab: u32,
    /// Chance, per mille, that a decoding sequence gets a proposal of 1 to 4 tokens for its
    /// next step (speculative decoding); each proposed token is the stand-in model's with
    /// chance 3/4, else random.
    pub speculate_per_mille: u32,
    /// Seed of every random choice.
    pub seed: u64,
    /// Check the scheduler's invariants after every phase of every step (slow; for tests).
    pub check_invariants: bool,
}

/// One simulated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRequest {
    /// Sequence id.
    pub id: SeqId,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Generation limit.
    pub max_new_tokens: usize,
}

/// What a simulation did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    /// Steps run.
    pub steps: u64,
    /// Tokens run through the stand-in model (prefill, recompute and decode).
    pub scheduled_tokens: u64,
    /// Tokens sampled (generated).
    pub sampled_tokens: u64,
    /// Sequences that stopped or hit their limit.
    pub completed: u64,
    /// Sequences cancelled.
    pub cancelled: u64,
    /// Largest step, in tokens.
    pub max_step_tokens: usize,
    /// Largest step, in sequences.
    pub max_step_seqs: usize,
    /// Preemptions.
    pub num_preemptions: u64,
    /// Prefix-cache tokens looked up.
    pub prefix_cache_queries: u64,
    /// Prefix-cache tokens hit.
    pub prefix_cache_hits: u64,
    /// Tokens proposed (speculative decoding).
    pub proposed_tokens: u64,
}

/// Why a simulation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scheduler refused the config or a request.
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// A check failed.
    #[error("step {step}: {message}")]
    Check {
        /// Step at which it failed.
        step: u64,
        /// What failed.
        message: String,
    },
    /// Work remained but the scheduler stopped making progress.
    #[error("no progress after {0} steps")]
    Stalled(u64),
}

/// The stand-in model's sample for sequence `id` after `position` known tokens.
pub fn model_token(seed: u64, id: SeqId, position: usize, vocab: u32) -> u32 {
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&id.to_le_bytes());
    bytes[16..].copy_from_slice(&(position as u64).to_le_bytes());
    (fnv1a64(&bytes) % u64::from(vocab.max(1))) as u32
}

impl Workload {
    /// The requests of this workload, shrunk where needed to fit a cache of
    /// `capacity_tokens` positions.
    pub fn requests(&self, capacity_tokens: usize) -> Vec<SimRequest> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let vocab = self.vocab.max(1);
        let prefixes: Vec<Vec<u32>> = (0..self.num_prefixes)
            .map(|_| {
                (0..self.prefix_len)
                    .map(|_| rng.random_range(0..vocab))
                    .collect()
            })
            .collect();
        (0..self.num_seqs as u64)
            .map(|id| {
                let len = rng
                    .random_range(self.prompt_len.clone())
                    .clamp(1, capacity_tokens.max(1));
                let mut prompt: Vec<u32> = match prefixes.len() {
                    0 => Vec::new(),
                    n => prefixes[rng.random_range(0..n)]
                        .iter()
                        .take(len)
                        .copied()
                        .collect(),
                };
                while prompt.len() < len {
                    prompt.push(rng.random_range(0..vocab));
                }
                let room = capacity_tokens + 1 - len; // KV never holds the last sampled token
                let max_new = rng
                    .random_range(self.max_new_tokens.clone())
                    .clamp(1, room.max(1));
                SimRequest {
                    id,
                    prompt,
                    max_new_tokens: max_new,
                }
            })
            .collect()
    }
}

/// Runs `w` to completion under `cfg`. `observe` sees the scheduler and each batch right
/// after `schedule()`, before the stand-in model runs it.
pub fn run(
    cfg: SchedulerConfig,
    w: &Workload,
    mut observe: impl FnMut(&Scheduler, &ScheduledBatch) -> Result<(), String>,
) -> Result<SimReport, SimError> {
    let mut sched = Scheduler::try_new(cfg)?;
    let requests = w.requests(cfg.num_blocks.saturating_mul(cfg.block_size));
    let work: usize = requests
        .iter()
        .map(|r| r.prompt.len() + r.max_new_tokens)
        .sum();
    let max_steps = (work as u64).saturating_mul(8) + 1000;
    let limits: HashMap<SeqId, usize> = requests.iter().map(|r| (r.id, r.max_new_tokens)).collect();
    let mut pending = requests.into_iter();
    let mut rng = StdRng::seed_from_u64(w.seed ^ 0x5ced_u64);
    let mut report = SimReport::default();
    let check = |sched: &Scheduler, step: u64| -> Result<(), SimError> {
        if w.check_invariants {
            sched
                .check_invariants()
                .map_err(|message| SimError::Check { step, message })?;
        }
        Ok(())
    };
    let mut exhausted = false;
    loop {
        let arrivals = if w.arrivals_per_step == 0 {
            usize::MAX
        } else {
            w.arrivals_per_step
        };
        for _ in 0..arrivals {
            match pending.next() {
                Some(r) => sched.add(r.id, r.prompt, r.max_new_tokens)?,
                None => {
                    exhausted = true;
                    break;
                }
            }
        }
        if exhausted && !sched.has_unfinished() {
            break;
        }
        let step = report.steps;
        if step >= max_steps {
            return Err(SimError::Stalled(step));
        }
        let batch = sched.schedule();
        check(&sched, step)?;
        observe(&sched, &batch).map_err(|message| SimError::Check { step, message })?;
        if batch.is_empty() && sched.has_unfinished() {
            return Err(SimError::Stalled(step));
        }
        if batch.num_tokens > cfg.max_num_batched_tokens || batch.seqs.len() > cfg.max_num_seqs {
            return Err(SimError::Check {
                step,
                message: format!(
                    "batch of {} tokens / {} seqs over limits",
                    batch.num_tokens,
                    batch.seqs.len()
                ),
            });
        }
        report.steps += 1;
        report.scheduled_tokens += batch.num_tokens as u64;
        report.max_step_tokens = report.max_step_tokens.max(batch.num_tokens);
        report.max_step_seqs = report.max_step_seqs.max(batch.seqs.len());

        // The stand-in model's tokens after the known ones, verifying any proposals.
        let sampled: Vec<(SeqId, Vec<u32>)> = batch
            .seqs
            .iter()
            .filter(|q| q.sample)
            .map(|q| {
                let known = q.start_pos + q.tokens.len() - q.num_spec;
                let drafts = &q.tokens[q.tokens.len() - q.num_spec..];
                let drawn = verify(drafts, |i| {
                    (model_token(w.seed, q.id, known + i, w.vocab), ())
                });
                (q.id, drawn.into_iter().map(|t| t.0).collect())
            })
            .collect();
        sched.append_tokens(&sampled);
        report.sampled_tokens += sampled.iter().map(|s| s.1.len() as u64).sum::<u64>();
        check(&sched, step)?;

        // The engine's stop checks: length limit, EOS, client cancellation.
        for (id, _) in &sampled {
            let id = *id;
            let done = sched.generated_tokens(id).map_or(0, <[u32]>::len);
            let limit = limits.get(&id).copied().unwrap_or(0);
            if done >= limit || rng.random_range(0..1000) < w.stop_per_mille {
                sched.finish(id);
                report.completed += 1;
            }
        }
        if w.cancel_per_mille > 0 {
            for q in &batch.seqs {
                if sched.sequence_tokens(q.id).is_some()
                    && rng.random_range(0..1000) < w.cancel_per_mille
                {
                    sched.finish(q.id);
                    report.cancelled += 1;
                }
            }
        }
        if w.speculate_per_mille > 0 {
            for q in &batch.seqs {
                if !sched.is_decoding(q.id) || rng.random_range(0..1000) >= w.speculate_per_mille {
                    continue;
                }
                let known = sched.sequence_tokens(q.id).map_or(0, <[u32]>::len);
                let proposal = (0..rng.random_range(1..=4))
                    .map(|i| match rng.random_range(0..4) {
                        0 => rng.random_range(0..w.vocab.max(1)),
                        _ => model_token(w.seed, q.id, known + i, w.vocab),
                    })
                    .collect();
                report.proposed_tokens += sched.propose(q.id, proposal) as u64;
            }
        }
        check(&sched, step)?;
    }
    let st = sched.stats();
    report.num_preemptions = st.preemptions;
    report.prefix_cache_queries = st.prefix_cache_queries;
    report.prefix_cache_hits = st.prefix_cache_hits;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn workload(seed: u64) -> Workload {
        Workload {
            num_seqs: 40,
            prompt_len: 1..=40,
            max_new_tokens: 1..=24,
            num_prefixes: 3,
            prefix_len: 20,
            arrivals_per_step: 3,
            stop_per_mille: 30,
            cancel_per_mille: 5,
            vocab: 50,
            speculate_per_mille: 0,
            seed,
            check_invariants: true,
        }
    }

    fn speculative_workload(seed: u64) -> Workload {
        Workload {
            speculate_per_mille: 600,
            ..workload(seed)
        }
    }

    /// A fake KV memory: slot → (token, position) written there. Checks that writes go only
    /// to blocks the writer owns alone, that no slot is written twice in one step, and that
    /// every position a sequence attends to holds its own token at that position.
    struct ShadowKv {
        slots: Vec<Option<(u32, usize)>>,
        prompts: HashMap<SeqId, usize>,
        /// Per sequence: where its next chunk may start (after a verification, anywhere
        /// from the first proposal to past the last), and preemptions seen so far.
        progress: HashMap<SeqId, (RangeInclusive<usize>, u32)>,
        seed: u64,
        vocab: u32,
    }

    impl ShadowKv {
        fn observe(&mut self, s: &Scheduler, b: &ScheduledBatch) -> Result<(), String> {
            let bs = s.config().block_size;
            let mut written = HashSet::new();
            for q in &b.seqs {
                let known = s
                    .sequence_tokens(q.id)
                    .ok_or("scheduled an unknown sequence")?;
                let end = q.start_pos + q.tokens.len();
                // Proposals follow the known tokens, at the end of a decode.
                let known_end = end - q.num_spec;
                let drafts = &q.tokens[q.tokens.len() - q.num_spec..];
                if q.tokens.is_empty()
                    || known_end > known.len()
                    || q.tokens[..q.tokens.len() - q.num_spec] != known[q.start_pos..known_end]
                {
                    return Err(format!("seq {}: chunk is not its known tokens", q.id));
                }
                if q.sample != (known_end == known.len()) || (q.num_spec > 0 && !q.sample) {
                    return Err(format!("seq {}: wrong sample flag", q.id));
                }
                let token_at = |p: usize| {
                    known
                        .get(p)
                        .copied()
                        .or_else(|| drafts.get(p.checked_sub(known_end)?).copied())
                };
                if s.kv_cache().block_table(q.id) != Some(&q.block_table[..])
                    || q.block_table.len() != end.div_ceil(bs)
                {
                    return Err(format!(
                        "seq {}: block table does not cover the context",
                        q.id
                    ));
                }
                // Chunks continue exactly where the last one ended, so every token is fed
                // once, in order; only a preemption restarts, at a block boundary.
                let preemptions = s.num_preemptions_of(q.id).unwrap_or(0);
                // A first chunk starts after its prefix-cache hit.
                // After a verification it continues after the last accepted proposal.
                let (next, seen) = self
                    .progress
                    .get(&q.id)
                    .cloned()
                    .unwrap_or((q.cached_tokens..=q.cached_tokens, 0));
                let restarted =
                    preemptions > seen && q.start_pos % bs == 0 && q.start_pos < known.len();
                if !next.contains(&q.start_pos) && !restarted {
                    return Err(format!(
                        "seq {}: chunk starts at {}, expected {next:?}",
                        q.id, q.start_pos
                    ));
                }
                self.progress.insert(q.id, (known_end..=end, preemptions));
                let prompt_len = self.prompts[&q.id];
                for (k, &t) in known[prompt_len..].iter().enumerate() {
                    if t != model_token(self.seed, q.id, prompt_len + k, self.vocab) {
                        return Err(format!(
                            "seq {}: generated token {k} is not the model's",
                            q.id
                        ));
                    }
                }
                for p in q.start_pos..end {
                    let token = token_at(p).ok_or("position past its tokens")?;
                    let block = q.block_table[p / bs];
                    if s.kv_cache().pool().ref_count(block) != 1 {
                        return Err(format!("seq {} writes shared block {block}", q.id));
                    }
                    let slot = block as usize * bs + p % bs;
                    if !written.insert(slot) {
                        return Err(format!("slot {slot} written twice in one step"));
                    }
                    self.slots[slot] = Some((token, p));
                }
            }
            for q in &b.seqs {
                let known = s.sequence_tokens(q.id).ok_or("unknown")?;
                let end = q.start_pos + q.tokens.len();
                let drafts = &q.tokens[q.tokens.len() - q.num_spec..];
                let all = known[..end - q.num_spec].iter().chain(drafts);
                for (p, &token) in all.enumerate() {
                    let slot = q.block_table[p / bs] as usize * bs + p % bs;
                    if self.slots[slot] != Some((token, p)) {
                        return Err(format!("seq {} attends to wrong KV at position {p}", q.id));
                    }
                }
            }
            Ok(())
        }
    }

    fn simulate(cfg: SchedulerConfig, w: &Workload) -> SimReport {
        let capacity = cfg.num_blocks * cfg.block_size;
        let mut shadow = ShadowKv {
            slots: vec![None; capacity],
            prompts: w
                .requests(capacity)
                .iter()
                .map(|r| (r.id, r.prompt.len()))
                .collect(),
            progress: HashMap::new(),
            seed: w.seed,
            vocab: w.vocab,
        };
        let report = run(cfg, w, |s, b| shadow.observe(s, b))
            .unwrap_or_else(|e| panic!("seed {} cfg {cfg:?}: {e}", w.seed));
        assert_eq!(
            report.completed + report.cancelled,
            w.num_seqs as u64,
            "every sequence ends"
        );
        report
    }

    const CONFIGS: [SchedulerConfig; 5] = [
        // Tiny cache: constant preemption.
        SchedulerConfig {
            max_num_batched_tokens: 32,
            max_num_seqs: 8,
            block_size: 4,
            num_blocks: 16,
            enable_prefix_caching: true,
        },
        SchedulerConfig {
            max_num_batched_tokens: 32,
            max_num_seqs: 8,
            block_size: 4,
            num_blocks: 16,
            enable_prefix_caching: false,
        },
        // Small budget: long chunked prefills.
        SchedulerConfig {
            max_num_batched_tokens: 5,
            max_num_seqs: 16,
            block_size: 8,
            num_blocks: 64,
            enable_prefix_caching: true,
        },
        // One sequence at a time, block size 1.
        SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 1,
            block_size: 1,
            num_blocks: 70,
            enable_prefix_caching: true,
        },
        // Roomy, default block size.
        SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs: 32,
            block_size: 16,
            num_blocks: 64,
            enable_prefix_caching: true,
        },
    ];

    #[test]
    fn randomised_workloads_finish_with_invariants_held_every_step() {
        let mut total = SimReport::default();
        for cfg in CONFIGS {
            for seed in 0..12 {
                let r = simulate(cfg, &workload(seed));
                assert!(r.max_step_tokens <= cfg.max_num_batched_tokens);
                assert!(r.max_step_seqs <= cfg.max_num_seqs);
                total.num_preemptions += r.num_preemptions;
                total.prefix_cache_hits += r.prefix_cache_hits;
            }
        }
        // The suite must actually exercise preemption and prefix reuse.
        assert!(total.num_preemptions > 0);
        assert!(total.prefix_cache_hits > 0);
    }

    /// The same with proposals at most decode steps, a quarter of their tokens wrong: every
    /// position a sequence attends to holds its own accepted token (rejected proposals are
    /// rewritten before they are read, and never reach another sequence through the prefix
    /// cache), and the invariants (rejected blocks released) hold after every phase.
    #[test]
    fn randomised_speculative_workloads_keep_every_invariant() {
        let mut total = SimReport::default();
        for cfg in CONFIGS {
            for seed in 0..12 {
                let r = simulate(cfg, &speculative_workload(seed));
                assert!(r.max_step_tokens <= cfg.max_num_batched_tokens);
                total.num_preemptions += r.num_preemptions;
                total.prefix_cache_hits += r.prefix_cache_hits;
                total.proposed_tokens += r.proposed_tokens;
            }
        }
        assert!(total.num_preemptions > 0);
        assert!(total.prefix_cache_hits > 0);
        assert!(total.proposed_tokens > 1000, "{}", total.proposed_tokens);
    }

    #[test]
    fn without_early_stops_every_sequence_generates_exactly_its_limit() {
        for (cfg, w) in CONFIGS
            .into_iter()
            .flat_map(|c| [(c, workload(99)), (c, speculative_workload(99))])
        {
            let w = Workload {
                stop_per_mille: 0,
                cancel_per_mille: 0,
                arrivals_per_step: 0,
                ..w
            };
            let capacity = cfg.num_blocks * cfg.block_size;
            let expected: u64 = w
                .requests(capacity)
                .iter()
                .map(|r| r.max_new_tokens as u64)
                .sum();
            let r = simulate(cfg, &w);
            assert_eq!(
                r.sampled_tokens, expected,
                "no token sampled twice or lost: {cfg:?}"
            );
            assert_eq!(r.completed, w.num_seqs as u64);
        }
    }

    #[test]
    fn runs_are_deterministic() {
        let a = run(CONFIGS[0], &workload(7), |_, _| Ok(())).unwrap();
        let b = run(CONFIGS[0], &workload(7), |_, _| Ok(())).unwrap();
        assert_eq!(a, b);
        assert_eq!(workload(7).requests(64), workload(7).requests(64));
    }

    #[test]
    fn requests_fit_the_cache_and_share_prefixes() {
        let w = workload(3);
        for r in w.requests(30) {
            assert!(!r.prompt.is_empty() && r.max_new_tokens >= 1);
            assert!(r.prompt.len() + r.max_new_tokens - 1 <= 30);
        }
        let reqs = w.requests(1000);
        let heads: HashSet<&[u32]> = reqs
            .iter()
            .filter(|r| r.prompt.len() >= 20)
            .map(|r| &r.prompt[..20])
            .collect();
        assert!(heads.len() <= 3);
    }

    #[test]
    fn a_failing_observer_stops_the_run() {
        let err = run(CONFIGS[0], &workload(1), |_, _| Err("boom".into())).unwrap_err();
        assert!(matches!(err, SimError::Check { step: 0, .. }));
    }
}
