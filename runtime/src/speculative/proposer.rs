//! The proposers behind the one interface the engine calls each step.

use tidal_tokenizer::Tokenizer;

use super::draft::DraftProposer;
use super::draft_load::{load_draft, DraftError};
use super::{NgramProposer, SpeculativeMethod};
use crate::engine::EngineConfig;
use crate::kv_cache::SeqId;

/// One sequence the engine wants a proposal for.
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

    /// Proposals for `requests`, in order (empty where there is none).
    pub fn propose(&mut self, requests: &[ProposalRequest<'_>]) -> Vec<Vec<u32>> {
        match self {
            Self::Ngram(p) => requests.iter().map(|r| p.propose(r.tokens, r.k)).collect(),
            Self::Draft(d) => d.propose(requests),
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
