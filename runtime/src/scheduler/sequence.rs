//! Scheduler-side state of one sequence (vLLM v1 `Request`).

use crate::kv_cache::hash::extend_block_hashes;
use crate::kv_cache::{BlockHash, CacheScope};

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Waiting,
    Running,
    /// Reached `max_new_tokens`; blocks released, kept until `finish` for its output.
    Done,
}

/// Prompt + generated tokens and how far the KV is computed.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    /// Prompt followed by every generated token, in order.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    pub(crate) max_new_tokens: usize,
    /// Positions scheduled so far (KV written once the step ran); 0 while waiting.
    pub(crate) num_computed: usize,
    /// Hash chain of the full blocks of `tokens` in `cache_scope` (empty without prefix
    /// caching).
    pub(crate) block_hashes: Vec<BlockHash>,
    /// Which cached blocks the sequence may share.
    pub(crate) cache_scope: CacheScope,
    /// Prefix-cache reuse at first admission.
    pub(crate) cached_tokens: Option<usize>,
    pub(crate) status: Status,
    pub(crate) num_preemptions: u32,
    /// Proposed next tokens for the coming step (speculative decoding); cleared when
    /// scheduled or preempted.
    pub(crate) proposal: Vec<u32>,
    /// The proposals in flight: scheduled after the last known token, KV being written,
    /// awaiting verification.
    pub(crate) verifying: Vec<u32>,
}

impl Sequence {
    pub(crate) fn new(prompt: Vec<u32>, max_new_tokens: usize, cache_scope: CacheScope) -> Self {
        Self {
            prompt_len: prompt.len(),
            tokens: prompt,
            max_new_tokens,
            num_computed: 0,
            block_hashes: Vec::new(),
            cache_scope,
            cached_tokens: None,
            status: Status::Waiting,
            num_preemptions: 0,
            proposal: Vec::new(),
            verifying: Vec::new(),
        }
    }

    pub(crate) fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// All allowed tokens are generated; nothing more to run.
    pub(crate) fn is_complete(&self) -> bool {
        self.num_generated() >= self.max_new_tokens
    }

    /// Known tokens whose KV is not yet scheduled.
    pub(crate) fn num_pending(&self) -> usize {
        self.tokens.len().saturating_sub(self.num_computed)
    }

    /// Decoding: only the last sampled token is still to run.
    pub(crate) fn is_decoding(&self) -> bool {
        self.status == Status::Running && self.num_pending() == 1 && self.verifying.is_empty()
    }

    pub(crate) fn update_hashes(&mut self, block_size: usize) {
        extend_block_hashes(
            &mut self.block_hashes,
            &self.tokens,
            block_size,
            &self.cache_scope,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_tokens() {
        let mut s = Sequence::new(vec![1, 2, 3], 2, CacheScope::unsalted());
        assert_eq!(
            (s.num_generated(), s.num_pending(), s.is_complete()),
            (0, 3, false)
        );
        s.num_computed = 3;
        s.tokens.push(9);
        assert_eq!(
            (s.num_generated(), s.num_pending(), s.is_complete()),
            (1, 1, false)
        );
        s.tokens.push(8);
        assert!(s.is_complete());
        s.update_hashes(2);
        assert_eq!(s.block_hashes.len(), 2);
    }
}
