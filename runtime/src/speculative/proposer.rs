//! The proposers behind the one interface the engine calls each step.

use tidal_tokenizer::Tokenizer;

use super::adaptive::{lookup_proposal, Acceptance, ProposalKind};
use super::draft::DraftProposer;
use super::draft_load::{load_draft, DraftError};
use super::{NgramProposer, SpeculativeMethod};
use crate::engine::EngineConfig;
use crate::kv_cache::SeqId;

/// One decoding sequence the engine offers a proposal to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProposalSlot<'a> {
    /// The sequence.
    pub id: SeqId,
    /// Its tokens so far, prompt and output.
    pub tokens: &'a [u32],
    /// Most tokens it may be proposed (at least one).
    pub limit: usize,
    /// Its recent acceptance of proposals, by kind.
    pub acceptance: &'a Acceptance,
}

/// A proposal worth verifying, and what made it.
pub(crate) type Proposal = (Vec<u32>, ProposalKind);

/// One sequence a draft model proposes for, `k` tokens decided beforehand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProposalRequest<'a> {
    /// The sequence.
    pub id: SeqId,
    /// Its tokens so far, prompt and output.
    pub tokens: &'a [u32],
    /// Tokens to propose.
    pub k: usize,
}

/// A proposer of speculative tokens.
pub(crate) enum Proposer {
    /// Prompt lookup.
    Ngram(NgramProposer),
    /// A draft model (boxed: it holds a model and a KV cache).
    Draft(Box<DraftProposer>),
}

impl Proposer {
    /// The proposer `config.speculative` asks for, `None` when speculation is off. A draft
    /// model is loaded here; the target's tokenizer, logits width, weight bytes per step and
    /// KV blocks size it and check it.
    pub fn for_config(
        config: &EngineConfig,
        tokenizer: &Tokenizer,
        target_vocab: usize,
        target_weight_bytes: usize,
        target_blocks: usize,
    ) -> Result<Option<Self>, DraftError> {
        let spec = &config.speculative;
        Ok(match spec.method {
            _ if !spec.enabled() => None,
            SpeculativeMethod::Off => None,
            SpeculativeMethod::Ngram => Some(Self::Ngram(NgramProposer::new(
                spec.ngram_min,
                spec.ngram_max,
            ))),
            SpeculativeMethod::Draft => Some(Self::Draft(Box::new(load_draft(
                config,
                tokenizer,
                target_vocab,
                target_weight_bytes,
                target_blocks,
            )?))),
        })
    }

    /// The `proposer` label of the metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Ngram(_) => SpeculativeMethod::Ngram.name(),
            Self::Draft(_) => SpeculativeMethod::Draft.name(),
        }
    }

    /// What proposing one token adds to a step besides verifying it, relative to a
    /// one-token step: nothing for a lookup, a draft forward pass for a draft model.
    pub fn proposal_cost(&self) -> f64 {
        match self {
            Self::Ngram(_) => 0.0,
            Self::Draft(d) => d.cost(),
        }
    }

    /// For each slot, in order, the proposal that pays at its acceptance, or `None`.
    /// `verify_time(k)` is a step verifying k tokens relative to a one-token step; the
    /// proposer adds its own cost per token ([`Self::proposal_cost`]). A lookup is found
    /// first and cut to what the acceptance of matches as long as the one found pays for; a
    /// draft model's length is chosen from its acceptance before it runs.
    pub fn propose(
        &mut self,
        slots: &[ProposalSlot<'_>],
        verify_time: impl Fn(usize) -> f64,
    ) -> Vec<Option<Proposal>> {
        let per_token = self.proposal_cost();
        let time = |k: usize| verify_time(k) + per_token * k as f64;
        match self {
            Self::Ngram(p) => slots
                .iter()
                .map(|s| {
                    lookup_proposal(p, s.acceptance, s.tokens, s.limit, time)
                        .map(|(tokens, kind)| (tokens.to_vec(), kind))
                })
                .collect(),
            Self::Draft(d) => {
                let ks: Vec<usize> = slots
                    .iter()
                    .map(|s| s.acceptance.num_tokens(ProposalKind::Draft, s.limit, time))
                    .collect();
                let requests: Vec<ProposalRequest<'_>> = slots
                    .iter()
                    .zip(&ks)
                    .filter(|&(_, &k)| k > 0)
                    .map(|(s, &k)| ProposalRequest {
                        id: s.id,
                        tokens: s.tokens,
                        k,
                    })
                    .collect();
                let mut drafted = d.propose(&requests).into_iter();
                ks.iter()
                    .map(|&k| {
                        let tokens = if k > 0 { drafted.next() } else { None }?;
                        (!tokens.is_empty()).then_some((tokens, ProposalKind::Draft))
                    })
                    .collect()
            }
        }
    }

    /// Forgets a sequence that finished, was cancelled or failed.
    pub fn free(&mut self, id: SeqId) {
        if let Self::Draft(d) = self {
            d.free(id);
        }
    }

    /// Forgets every sequence `keep` says no to.
    pub fn retain(&mut self, keep: impl FnMut(SeqId) -> bool) {
        if let Self::Draft(d) = self {
            d.retain(keep);
        }
    }

    /// Blocks of the proposer's own KV cache: (in total, free); none for a lookup.
    pub fn kv_blocks(&self) -> (usize, usize) {
        match self {
            Self::Ngram(_) => (0, 0),
            Self::Draft(d) => d.kv_blocks(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_slot_gets_its_own_continuation_and_kind() {
        let mut p = Proposer::Ngram(NgramProposer::new(1, 4));
        let fresh = Acceptance::new();
        // "... 2 3 4" matched four tokens back ("0 2 3 4"); "9 8" matches nothing.
        let quoted = [0, 2, 3, 4, 5, 6, 7, 8, 9, 0, 2, 3, 4];
        let unmatched = [9, 8];
        let slots = [
            ProposalSlot {
                id: 1,
                tokens: &quoted,
                limit: 3,
                acceptance: &fresh,
            },
            ProposalSlot {
                id: 2,
                tokens: &unmatched,
                limit: 3,
                acceptance: &fresh,
            },
        ];
        let out = p.propose(&slots, |_| 1.0);
        assert_eq!(
            out,
            vec![
                Some((vec![5, 6, 7], ProposalKind::Lookup { matched: 4 })),
                None
            ]
        );
    }
}
