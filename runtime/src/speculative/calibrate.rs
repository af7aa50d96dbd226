//! Timing at engine start, on the device and threads every later step runs on: what a
//! step that verifies k proposed tokens costs against a one-token step ([`StepCost`]), and
//! a draft model's one-token step against the target's. Both run in the engine's own KV
//! cache before it holds any sequence; the positions they write are overwritten by the first
//! request.

use std::time::Instant;

use super::StepCost;
use crate::bench::median;
use crate::engine::Executor;
use crate::model::{ForwardBatch, ForwardSeq};

/// Rounds of timed steps: each round times every step size once, so load from elsewhere
/// falls on all sizes alike; the medians are compared.
const ROUNDS: usize = 5;
/// Context before the timed steps of a verification: a short chat prompt.
const VERIFY_CONTEXT: usize = 64;
/// Context before the timed one-token steps of a draft and its target.
const DRAFT_CONTEXT: usize = 8;

/// Measures the relative time of steps of one sequence that verify `1..=max` proposed
/// tokens (every position gets its logits, as a verification's do). `None` when the cache
/// of `num_blocks` blocks is too small or a pass fails.
pub(crate) fn measure_step_cost(
    executor: &mut Executor,
    num_blocks: usize,
    block_size: usize,
    max: usize,
) -> Option<StepCost> {
    let ks: Vec<usize> = (1..=max).collect();
    let cache = (num_blocks, block_size);
    let (_, points) = relative_step_times(executor, cache, VERIFY_CONTEXT, &ks, ROUNDS)?;
    StepCost::from_measured(&points, max)
}

/// Seconds of a one-token step after `context` tokens, and for each k in `ks` the time of a
/// step of 1 + k tokens (every position with its logits) relative to it: `rounds` rounds
/// that each time every size once, median per size. `cache` is the executor's (blocks,
/// block size); `None` when it is too small or a pass fails.
pub(crate) fn relative_step_times(
    executor: &mut Executor,
    (num_blocks, block_size): (usize, usize),
    context: usize,
    ks: &[usize],
    rounds: usize,
) -> Option<(f64, Vec<(usize, f64)>)> {
    let max = ks.iter().copied().max().unwrap_or(0);
    let mut s = Stepper::new(executor, num_blocks, block_size, context, max + 1)?;
    let sizes: Vec<usize> = std::iter::once(0).chain(ks.iter().copied()).collect();
    let mut times = vec![Vec::with_capacity(rounds); sizes.len()];
    for _ in 0..rounds.max(1) {
        for (&k, t) in sizes.iter().zip(&mut times) {
            t.push(s.run(context, 1 + k, 1 + k)?);
        }
    }
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    let one = medians[0];
    if one <= 0.0 {
        return None;
    }
    let relative = ks
        .iter()
        .zip(&medians[1..])
        .map(|(&k, t)| (k, t / one))
        .collect();
    Some((one, relative))
}

/// Median one-token step of `draft` over that of `target`, both at a short context, timed
/// alternately so that load from elsewhere falls on both alike. Each comes with the blocks
/// of its cache; `None` when either is too small or a pass fails.
pub(crate) fn measure_draft_cost(
    target: (&mut Executor, usize),
    draft: (&mut Executor, usize),
    block_size: usize,
) -> Option<f64> {
    let mut t = Stepper::new(target.0, target.1, block_size, DRAFT_CONTEXT, ROUNDS)?;
    let mut d = Stepper::new(draft.0, draft.1, block_size, DRAFT_CONTEXT, ROUNDS)?;
    let (mut tt, mut dt) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        tt.push(t.run(DRAFT_CONTEXT + i, 1, 1)?);
        dt.push(d.run(DRAFT_CONTEXT + i, 1, 1)?);
    }
    let (t, d) = (median(tt), median(dt));
    (t > 0.0).then(|| d / t)
}

/// Runs timed steps of one sequence on an executor whose KV cache holds no sequence.
struct Stepper<'a> {
    executor: &'a mut Executor,
    table: Vec<u32>,
    tokens: Vec<u32>,
}

impl<'a> Stepper<'a> {
    /// Prefills `context` tokens (the first pass also pages in mapped weights) and leaves
    /// room for `extra` positions after them.
    fn new(
        executor: &'a mut Executor,
        num_blocks: usize,
        block_size: usize,
        context: usize,
        extra: usize,
    ) -> Option<Self> {
        let positions = context + extra;
        let blocks = positions.div_ceil(block_size.max(1));
        if blocks > num_blocks {
            return None;
        }
        let vocab = executor.config().vocab_size.max(1) as u32;
        let tokens = (0..positions as u32)
            .map(|i| (i * 31 + 7) % vocab)
            .collect();
        let mut s = Self {
            executor,
            table: (0..blocks as u32).collect(),
            tokens,
        };
        s.run(0, context, 1)?;
        Some(s)
    }

    /// Seconds of one pass over `len` tokens from position `start`, asking `logits` rows.
    fn run(&mut self, start: usize, len: usize, logits: usize) -> Option<f64> {
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                tokens: &self.tokens[start..start + len],
                start_pos: start,
                block_table: &self.table,
                num_logits: logits,
            }],
        };
        let started = Instant::now();
        self.executor.forward(&batch).ok()?;
        Some(started.elapsed().as_secs_f64())
    }
}
