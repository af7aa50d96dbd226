//! `tidal bench speculative`: the same requests through an engine without and with
//! speculative decoding, side by side in alternating rounds, on a grounded workload (answers
//! that quote their prompt: repeat, edit, extract, correct; public-domain and original texts
//! shipped here) and an open-ended chat workload.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::median;
use crate::engine::{Engine, EngineError, GenerationEvent, GenerationRequest};
use crate::model::ModelError;
use crate::speculative::SpeculationStats;

/// The grounded workload's user messages.
pub fn grounded_messages() -> Vec<&'static str> {
    split(include_str!("grounded.txt"))
}

/// The open-ended chat workload's user messages.
pub fn open_messages() -> Vec<&'static str> {
    split(include_str!("open.txt"))
}

fn split(text: &'static str) -> Vec<&'static str> {
    text.split("\n---\n").map(str::trim).collect()
}

/// One workload at one concurrency: medians over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct SpeculativeReport {
    pub workload: String,
    pub concurrency: usize,
    pub rounds: usize,
    /// Generated tokens over wall time, without speculation (median of the rounds).
    pub off_tokens_per_second: f64,
    /// The same with speculation.
    pub on_tokens_per_second: f64,
    /// Median over the rounds of on / off measured in the same round.
    pub speedup: f64,
    /// Accepted over proposed tokens, over every round.
    pub acceptance_rate: f64,
    /// Tokens per verification (accepted proposals plus the target's own token).
    pub mean_accepted_length: f64,
    /// Share of decode steps that verified a proposal (the rest found none worth verifying).
    pub verified_share: f64,
    /// Generated tokens per round.
    pub generated_tokens: usize,
    /// Whether both engines gave the same tokens for every request (greedy).
    pub identical: bool,
    /// The last round's answers without speculation, request i answering prompt
    /// `i % prompts.len()` (for [`replay`]).
    #[serde(skip)]
    pub answers: Vec<Vec<u32>>,
}

/// Greedy requests, ended by the model (or `max_tokens`).
fn request(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        ignore_eos: false,
        ..super::fixed_length_request(prompt.to_vec(), max_tokens)
    }
}

/// Token ids of one request.
fn generate(engine: &Engine, request: GenerationRequest) -> Result<Vec<u32>, EngineError> {
    let mut events = engine.submit(request)?;
    let mut ids = Vec::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Delta { token_ids, .. } => ids.extend(token_ids),
            GenerationEvent::Done { .. } => return Ok(ids),
            GenerationEvent::Error { message } => return Err(EngineError::Invalid(message)),
        }
    }
    Err(EngineError::Stopped)
}

/// One pass of the workload: at concurrency 1 the prompts one after another, else
/// `concurrency` requests at once (prompts taken in turn). Returns each request's tokens
/// and the wall time.
fn pass(
    engine: &Engine,
    prompts: &[Vec<u32>],
    concurrency: usize,
    max_tokens: usize,
) -> Result<(Vec<Vec<u32>>, Duration), EngineError> {
    let started = Instant::now();
    if concurrency <= 1 {
        let ids = prompts
            .iter()
            .map(|p| generate(engine, request(p, max_tokens)))
            .collect::<Result<_, _>>()?;
        return Ok((ids, started.elapsed()));
    }
    let handles: Vec<_> = (0..concurrency)
        .map(|i| {
            let engine = engine.clone();
            let r = request(&prompts[i % prompts.len()], max_tokens);
            std::thread::spawn(move || generate(&engine, r))
        })
        .collect();
    let mut ids = Vec::with_capacity(concurrency);
    for h in handles {
        ids.push(h.join().map_err(|_| EngineError::Stopped)??);
    }
    Ok((ids, started.elapsed()))
}

/// Speculation's totals once the engine has published its last step.
fn settled(engine: &Engine) -> SpeculationStats {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = engine.stats();
        if s.num_running == 0 || Instant::now() > deadline {
            return s.speculation;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `prompts` through `off` and `on` (the same model, without and with speculation)
/// for `rounds` rounds, alternating which goes first; one warm-up pass each first fills
/// both prefix caches alike.
pub fn speculative(
    off: &Engine,
    on: &Engine,
    workload: &str,
    prompts: &[Vec<u32>],
    concurrency: usize,
    max_tokens: usize,
    rounds: usize,
) -> Result<SpeculativeReport, EngineError> {
    pass(off, prompts, concurrency, max_tokens)?;
    pass(on, prompts, concurrency, max_tokens)?;
    let before = settled(on);
    let (mut off_rates, mut on_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    let mut answers = Vec::new();
    for round in 0..rounds.max(1) {
        let run = |engine: &Engine| pass(engine, prompts, concurrency, max_tokens);
        let (a, b) = if round % 2 == 0 {
            let a = run(off)?;
            (a, run(on)?)
        } else {
            let b = run(on)?;
            (run(off)?, b)
        };
        identical &= a.0 == b.0;
        let rate = |(ids, t): &(Vec<Vec<u32>>, Duration)| {
            ids.iter().map(Vec::len).sum::<usize>() as f64 / t.as_secs_f64().max(1e-9)
        };
        let (r_off, r_on) = (rate(&a), rate(&b));
        off_rates.push(r_off);
        on_rates.push(r_on);
        ratios.push(r_on / r_off.max(1e-9));
        answers = a.0;
    }
    let after = settled(on);
    let spec = after.since(&before);
    Ok(SpeculativeReport {
        workload: workload.to_owned(),
        concurrency,
        rounds: rounds.max(1),
        off_tokens_per_second: median(off_rates),
        on_tokens_per_second: median(on_rates),
        speedup: median(ratios),
        acceptance_rate: spec.acceptance_rate(),
        mean_accepted_length: spec.mean_accepted_length(),
        verified_share: spec.verified_share(),
        generated_tokens: answers.iter().map(Vec::len).sum(),
        identical,
        answers,
    })
}

/// Recorded greedy answers replayed offline ([`crate::speculative::replay`]): what the
/// lookup policy gives, and an oracle's bound, on a step cost curve.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub workload: String,
    /// Decode tokens replayed.
    pub tokens: usize,
    /// Tokens per one-token step with the engine's lookup policy.
    pub lookup_speedup: f64,
    /// Accepted over proposed tokens with it.
    pub lookup_acceptance: f64,
    /// Tokens per verification with it (accepted proposals plus the target's own).
    pub lookup_tokens_per_verification: f64,
    /// The same for the oracle: any run of the answer's next tokens found earlier in the
    /// sequence may be proposed, the lengths chosen for the least total time.
    pub oracle_speedup: f64,
    /// The same for the oracle held to runs that continue an earlier occurrence of the
    /// sequence's last tokens (as many as the proposer's shortest match): the bound of every
    /// prompt lookup policy, whichever occurrence and length it chooses.
    pub suffix_oracle_speedup: f64,
}

/// Replays `answers` (answer i to prompt `i % prompts.len()`) through `proposer` and the
/// oracle at most `limit` proposed tokens per step and `max_tokens` per answer, with steps
/// priced by `cost`.
pub fn replay(
    workload: &str,
    prompts: &[Vec<u32>],
    answers: &[Vec<u32>],
    proposer: &crate::speculative::NgramProposer,
    limit: usize,
    max_tokens: usize,
    cost: &crate::speculative::StepCost,
) -> ReplayReport {
    use crate::speculative::replay::{replay_lookup, replay_oracle, ReplayTotals, RunAnchor};
    let mut lookup = ReplayTotals::default();
    let (mut oracle, mut suffix_oracle) = (ReplayTotals::default(), ReplayTotals::default());
    for (i, answer) in answers.iter().enumerate() {
        let prompt = &prompts[i % prompts.len().max(1)];
        lookup.add(&replay_lookup(
            proposer, prompt, answer, limit, max_tokens, cost,
        ));
        let oracle_with = |anchor| replay_oracle(prompt, answer, limit, max_tokens, cost, anchor);
        oracle.add(&oracle_with(RunAnchor::Anywhere));
        suffix_oracle.add(&oracle_with(RunAnchor::AfterSuffix(proposer.min_n())));
    }
    ReplayReport {
        workload: workload.to_owned(),
        tokens: lookup.tokens,
        lookup_speedup: lookup.speedup(),
        lookup_acceptance: lookup.accepted as f64 / lookup.proposed.max(1) as f64,
        lookup_tokens_per_verification: (lookup.accepted + lookup.verifications) as f64
            / lookup.verifications.max(1) as f64,
        oracle_speedup: oracle.speedup(),
        suffix_oracle_speedup: suffix_oracle.speedup(),
    }
}

/// What one more token adds to a decode step: the time of a step of `1 + k` tokens of one
/// sequence over a one-token step, minus one, divided by k (the `--speculative-verify-cost`
/// the choice of k weighs acceptance against). Medians of `repeats` timed forward passes at
/// a context of `context` tokens.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyCostReport {
    pub context: usize,
    pub one_token_step: Duration,
    /// (k, step time of 1 + k tokens relative to one token)
    pub relative_step_time: Vec<(usize, f64)>,
    /// The least-squares slope of those relative times over k: the cost per extra token.
    pub verify_cost: f64,
}

/// Measures [`VerifyCostReport`] on `model` directly (no scheduler, no sampling), as the
/// engine does when it starts but at a chosen context and with more rounds: `repeats`
/// rounds that time every size once, medians. The passes run in a kernel pool of `threads`
/// (`None`: one per core), as the engine's do ([`crate::engine::kernel_pool`]).
///
/// # Errors
/// If the threads cannot start or a timed pass fails.
pub fn verify_cost(
    model: crate::model::Model,
    threads: Option<usize>,
    context: usize,
    ks: &[usize],
    repeats: usize,
) -> Result<VerifyCostReport, ModelError> {
    let pool = crate::engine::kernel_pool(threads)
        .map_err(|e| ModelError::Kernel(format!("cannot start kernel threads: {e}")))?;
    let block_size = 16;
    let max_k = ks.iter().copied().max().unwrap_or(0);
    let blocks = (context + max_k + 1).div_ceil(block_size);
    let kv = crate::model::KvStorage::new(model.config(), Default::default(), blocks, block_size);
    let mut executor = crate::engine::Executor::Cpu { model, kv };
    let cache = (blocks, block_size);
    let (one, relative) = pool
        .install(|| {
            crate::speculative::relative_step_times(&mut executor, cache, context, ks, repeats)
        })
        .ok_or_else(|| ModelError::Kernel("a timed forward pass failed".into()))?;
    // Slope through (0, 1): sum k (r - 1) / sum k².
    let (num, den) = relative.iter().fold((0.0, 0.0), |(n, d), &(k, r)| {
        (n + k as f64 * (r - 1.0), d + (k * k) as f64)
    });
    Ok(VerifyCostReport {
        context,
        one_token_step: Duration::from_secs_f64(one),
        relative_step_time: relative,
        verify_cost: if den > 0.0 { num / den } else { 0.0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_shipped_and_split() {
        let grounded = grounded_messages();
        let open = open_messages();
        assert_eq!((grounded.len(), open.len()), (6, 6));
        assert!(grounded[0].contains("Four score and seven years ago"));
        assert!(grounded
            .iter()
            .chain(&open)
            .all(|m| !m.is_empty() && !m.contains("---")));
    }
}
