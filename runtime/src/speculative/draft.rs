//! The draft-model proposer: a smaller model of the same vocabulary proposes its greedy
//! continuation of each sequence (Leviathan et al., 2023; vLLM's draft-model speculation).
//!
//! The draft runs on the engine's device with its own paged KV cache ([`DraftCache`]). Each
//! step, for the sequences the engine asks proposals for, it
//! 1. cuts each sequence's draft KV to the longest common prefix with the sequence's actual
//!    tokens (rejected draft tokens go),
//! 2. catches up on what it has not seen, every sequence in one forward pass under one
//!    token budget (the prompt on first use, later the tokens accepted since), shortest
//!    catch-up first; a sequence whose catch-up does not fit finishes it next step and
//!    proposes nothing now,
//! 3. runs the remaining k − 1 greedy decode steps, one forward pass per step for all
//!    sequences together.
//!
//! Proposals are argmax tokens, a point mass per position, so the engine's verification
//! stays exact. A full draft cache or a failed draft pass means no proposal, never a failed
//! request.

use super::calibrate::measure_draft_cost;
use super::draft_cache::DraftCache;
use super::proposer::ProposalRequest;
use crate::engine::Executor;
use crate::kv_cache::SeqId;
use crate::model::{ForwardBatch, ForwardSeq};
use crate::sampling::argmax;

/// A draft model with its KV cache; see the module docs.
pub(crate) struct DraftProposer {
    executor: Executor,
    cache: DraftCache,
    /// Catch-up tokens of all sequences in one call (one forward pass).
    chunk: usize,
    context_length: usize,
    vocab: usize,
    /// One draft pass relative to a one-token target step; `None` until measured.
    cost: Option<f64>,
    /// What is assumed until then: the ratio of the weights each step reads.
    assumed_cost: f64,
}

/// One sequence's share of a proposal call.
struct Plan<'a> {
    /// Index into the request list.
    index: usize,
    id: SeqId,
    tokens: &'a [u32],
    /// First position fed this call.
    start: usize,
    /// Catch-up tokens fed this call.
    len: usize,
    /// Whether they reach the sequence's last token (so it proposes).
    done: bool,
    k: usize,
}

impl DraftProposer {
    /// A proposer running `executor` (the draft model and its KV memory of `num_blocks`
    /// blocks of `block_size` tokens), catching up at most `chunk` tokens per call.
    /// `cost`: see [`Self::cost`]; `None` to measure it ([`Self::calibrate`]), assuming
    /// `assumed_cost` until then.
    pub fn new(
        executor: Executor,
        cache: DraftCache,
        chunk: usize,
        cost: Option<f64>,
        assumed_cost: f64,
    ) -> Self {
        let config = executor.config();
        Self {
            context_length: config.context_length,
            vocab: config.vocab_size,
            executor,
            cache,
            chunk: chunk.max(1),
            cost,
            assumed_cost,
        }
    }

    /// Time of one draft forward pass relative to a one-token target step: what proposing
    /// one more token adds to a step besides verifying it.
    pub fn cost(&self) -> f64 {
        self.cost.unwrap_or(self.assumed_cost)
    }

    /// Measures [`Self::cost`] unless it was given: one-token steps of the draft and of
    /// `target` (whose KV cache of `target_blocks` blocks holds no sequence yet; both
    /// caches have blocks of `block_size` tokens), timed alternately, median over median.
    /// Keeps the assumed cost when a cache is too small to measure in or a pass fails.
    pub fn calibrate(&mut self, target: &mut Executor, target_blocks: usize, block_size: usize) {
        if self.cost.is_some() {
            return;
        }
        let draft = (&mut self.executor, self.cache.num_blocks());
        let measured = measure_draft_cost((target, target_blocks), draft, block_size);
        match measured {
            Some(cost) => {
                tracing::info!(
                    draft_cost = format!("{cost:.3}"),
                    assumed = format!("{:.3}", self.assumed_cost),
                    "draft step time measured against the target's"
                );
                self.cost = Some(cost);
            }
            None => tracing::warn!(
                draft_cost = self.assumed_cost,
                "draft step time not measured; assuming the ratio of the weights"
            ),
        }
    }

    /// Up to `k` greedy draft tokens for each request, in request order (empty where
    /// nothing could be proposed this step).
    pub fn propose(&mut self, requests: &[ProposalRequest<'_>]) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); requests.len()];
        let plans = self.plan(requests);
        if plans.is_empty() {
            return out;
        }
        let ok = self.catch_up(&plans, &mut out) && self.decode(&plans, &mut out);
        for p in &plans {
            if ok {
                self.cache.trim(p.id);
            } else {
                // The draft KV of a failed pass is unknown: start these sequences over.
                self.cache.free(p.id);
                out[p.index].clear();
            }
        }
        out
    }

    /// Rewinds each requested sequence's draft KV, then hands the catch-up budget out,
    /// shortest catch-up first, reserving blocks for what each will feed.
    fn plan<'a>(&mut self, requests: &[ProposalRequest<'a>]) -> Vec<Plan<'a>> {
        let mut plans = Vec::with_capacity(requests.len());
        for (index, r) in requests.iter().enumerate() {
            // The last draft token fed sits at position len + k - 2.
            let k =
                r.k.min((self.context_length + 1).saturating_sub(r.tokens.len()));
            if k == 0 || r.tokens.is_empty() {
                continue;
            }
            let start = self.cache.rewind(r.id, r.tokens);
            plans.push(Plan {
                index,
                id: r.id,
                tokens: r.tokens,
                start,
                len: r.tokens.len() - start,
                done: false,
                k,
            });
        }
        plans.sort_by_key(|p| p.len);
        let mut budget = self.chunk;
        plans.retain_mut(|p| {
            p.len = p.len.min(budget);
            p.done = p.start + p.len == p.tokens.len();
            let extra = if p.done { p.k - 1 } else { 0 };
            if p.len == 0 || !self.cache.reserve(p.id, p.start + p.len + extra) {
                return false;
            }
            budget -= p.len;
            true
        });
        plans
    }

    /// One forward pass over every plan's catch-up tokens; the sequences that reach their
    /// last token get their first draft token.
    fn catch_up(&mut self, plans: &[Plan<'_>], out: &mut [Vec<u32>]) -> bool {
        let batch = ForwardBatch {
            seqs: plans
                .iter()
                .map(|p| ForwardSeq {
                    tokens: &p.tokens[p.start..p.start + p.len],
                    start_pos: p.start,
                    block_table: self.cache.block_table(p.id),
                    num_logits: usize::from(p.done),
                })
                .collect(),
        };
        let proposing = plans.iter().filter(|p| p.done).count();
        let Some(logits) = pass(
            &mut self.executor,
            self.vocab,
            &batch,
            proposing,
            "catch-up",
        ) else {
            return false;
        };
        let mut rows = logits.chunks_exact(self.vocab);
        for p in plans {
            self.cache.fed(p.id, &p.tokens[p.start..p.start + p.len]);
            if let (true, Some(row)) = (p.done, rows.next()) {
                out[p.index].push(argmax(row));
            }
        }
        true
    }

    /// Draft steps 2..=k: each feeds every still-proposing sequence its last draft token.
    fn decode(&mut self, plans: &[Plan<'_>], out: &mut [Vec<u32>]) -> bool {
        let steps = plans.iter().filter(|p| p.done).map(|p| p.k).max();
        for step in 1..steps.unwrap_or(0) {
            let active: Vec<&Plan<'_>> = plans.iter().filter(|p| p.done && p.k > step).collect();
            let fed: Vec<u32> = active.iter().map(|p| out[p.index][step - 1]).collect();
            let batch = ForwardBatch {
                seqs: active
                    .iter()
                    .zip(&fed)
                    .map(|(p, token)| ForwardSeq {
                        tokens: std::slice::from_ref(token),
                        start_pos: p.tokens.len() + step - 1,
                        block_table: self.cache.block_table(p.id),
                        num_logits: 1,
                    })
                    .collect(),
            };
            let Some(logits) = pass(
                &mut self.executor,
                self.vocab,
                &batch,
                active.len(),
                "decode",
            ) else {
                return false;
            };
            for ((p, token), row) in active.iter().zip(&fed).zip(logits.chunks_exact(self.vocab)) {
                self.cache.fed(p.id, std::slice::from_ref(token));
                out[p.index].push(argmax(row));
            }
        }
        true
    }

    /// Frees `id`'s draft KV (finished, cancelled, failed).
    pub fn free(&mut self, id: SeqId) {
        self.cache.free(id);
    }

    /// Frees the draft KV of every sequence `keep` says no to (those preempted, which
    /// recompute from scratch anyway).
    pub fn retain(&mut self, keep: impl FnMut(SeqId) -> bool) {
        if self.cache.num_seqs() > 0 {
            self.cache.retain(keep);
        }
    }

    /// Draft KV blocks: (in total, free).
    pub fn kv_blocks(&self) -> (usize, usize) {
        (self.cache.num_blocks(), self.cache.num_free_blocks())
    }

    /// The draft cache (for tests).
    #[cfg(test)]
    pub fn cache(&self) -> &DraftCache {
        &self.cache
    }
}

/// One draft forward pass that must return `rows` rows of logits; `None` (logged) when
/// it fails or returns another number.
fn pass(
    executor: &mut Executor,
    vocab: usize,
    batch: &ForwardBatch<'_>,
    rows: usize,
    what: &str,
) -> Option<Vec<f32>> {
    match executor.forward(batch) {
        Ok(logits) if logits.len() == rows * vocab => Some(logits),
        Ok(logits) => {
            tracing::warn!(
                rows = logits.len() / vocab.max(1),
                expected = rows,
                "draft {what} pass returned the wrong logits; no proposals"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "draft {what} pass failed; no proposals");
            None
        }
    }
}

#[cfg(test)]
#[path = "draft_tests.rs"]
mod tests;
