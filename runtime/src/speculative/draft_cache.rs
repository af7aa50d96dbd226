//! The draft model's own paged KV cache: which tokens of each sequence it holds.
//!
//! The blocks come from the runtime's block manager ([`KvCacheManager`], prefix caching
//! off: a draft block may hold rejected draft tokens and is never shared). Per sequence the
//! cache keeps the tokens whose KV it holds, in position order. Before a proposal they are
//! cut to the longest common prefix with the sequence's actual tokens, so the KV of a
//! rejected draft token never survives into a later proposal; what follows that prefix is
//! recomputed.

use std::collections::HashMap;

use crate::kv_cache::{KvCacheConfig, KvCacheError, KvCacheManager, PrefixHit, SeqId};

/// Draft KV blocks and the tokens each sequence has in them.
#[derive(Debug, Clone)]
pub(crate) struct DraftCache {
    kv: KvCacheManager,
    held: HashMap<SeqId, Vec<u32>>,
}

impl DraftCache {
    /// An empty cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvCacheError> {
        Ok(Self {
            kv: KvCacheManager::new(KvCacheConfig {
                num_blocks,
                block_size,
                enable_prefix_caching: false,
            })?,
            held: HashMap::new(),
        })
    }

    /// Drops what `id` holds past its longest common prefix with `tokens` (the sequence's
    /// actual tokens), always keeping the last token out so that feeding it yields the next
    /// token's logits. Returns how many tokens stay held: the position catch-up starts at.
    pub fn rewind(&mut self, id: SeqId, tokens: &[u32]) -> usize {
        let Some(held) = self.held.get_mut(&id) else {
            return 0;
        };
        let common = held
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        held.truncate(common);
        self.kv.truncate(id, common);
        common
    }

    /// Grows `id`'s blocks to cover `positions` positions. On a full cache the sequence
    /// lets go of everything it holds (so that the others can go on) and `false` is
    /// returned: it proposes nothing this time and starts over later.
    pub fn reserve(&mut self, id: SeqId, positions: usize) -> bool {
        let result = if self.kv.block_table(id).is_some() {
            self.kv.allocate_slots(id, positions)
        } else {
            self.kv.allocate_new(id, &PrefixHit::default(), positions)
        };
        match result {
            Ok(()) => {
                self.held.entry(id).or_default();
                true
            }
            Err(e) => {
                tracing::debug!(seq = id, error = %e, "draft KV cache full; no proposal");
                self.free(id);
                false
            }
        }
    }

    /// `id`'s block table (empty when it holds no blocks).
    pub fn block_table(&self, id: SeqId) -> &[u32] {
        self.kv.block_table(id).unwrap_or_default()
    }

    /// Records that the KV of `tokens` was written right after what `id` already holds.
    pub fn fed(&mut self, id: SeqId, tokens: &[u32]) {
        if let Some(held) = self.held.get_mut(&id) {
            held.extend_from_slice(tokens);
        }
    }

    /// Releases the blocks `id` reserved beyond the tokens it holds.
    pub fn trim(&mut self, id: SeqId) {
        if let Some(held) = self.held.get(&id) {
            self.kv.truncate(id, held.len());
        }
    }

    /// Tokens whose KV `id` holds.
    #[cfg(test)]
    pub fn held(&self, id: SeqId) -> Option<&[u32]> {
        self.held.get(&id).map(Vec::as_slice)
    }

    /// Forgets `id` and frees its blocks.
    pub fn free(&mut self, id: SeqId) {
        self.held.remove(&id);
        self.kv.free(id);
    }

    /// Frees every sequence `keep` says no to.
    pub fn retain(&mut self, mut keep: impl FnMut(SeqId) -> bool) {
        let gone: Vec<SeqId> = self.held.keys().copied().filter(|&id| !keep(id)).collect();
        for id in gone {
            self.free(id);
        }
    }

    /// Sequences with draft KV.
    pub fn num_seqs(&self) -> usize {
        self.held.len()
    }

    /// Blocks in total.
    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    /// Blocks no sequence holds.
    pub fn num_free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    /// Every sequence's table covers exactly the tokens it holds, and the block manager's
    /// own invariants hold (for tests).
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        for (&id, held) in &self.held {
            let blocks = self.kv.block_table(id).map_or(0, <[u32]>::len);
            if blocks != self.kv.blocks_for(held.len()) {
                return Err(format!(
                    "sequence {id}: {blocks} draft blocks for {} tokens",
                    held.len()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewinds_to_the_common_prefix_and_keeps_the_last_token_out() {
        let mut c = DraftCache::new(8, 4).unwrap();
        assert_eq!(c.rewind(1, &[1, 2, 3]), 0, "nothing held yet");
        assert!(c.reserve(1, 7));
        c.fed(1, &[1, 2, 3, 4, 5, 6, 7]);
        c.check_invariants().unwrap();
        // Accepted 5, rejected 6: keep 1..=5 of the sequence 1 2 3 4 5 9.
        assert_eq!(c.rewind(1, &[1, 2, 3, 4, 5, 9]), 5);
        assert_eq!(c.held(1), Some(&[1, 2, 3, 4, 5][..]));
        assert_eq!(c.block_table(1).len(), 2);
        c.check_invariants().unwrap();
        // All held tokens are the sequence's: the last one is fed again anyway.
        assert_eq!(c.rewind(1, &[1, 2, 3, 4, 5]), 4);
        assert_eq!(c.block_table(1).len(), 1);
        // A sequence that diverges at once keeps nothing.
        assert_eq!(c.rewind(1, &[7, 7]), 0);
        assert_eq!(c.held(1), Some(&[][..]));
        assert_eq!(c.block_table(1).len(), 0);
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_full_cache_frees_the_sequence_and_trim_returns_unused_blocks() {
        let mut c = DraftCache::new(4, 4).unwrap();
        assert!(c.reserve(1, 12));
        c.fed(1, &[0; 5]);
        c.trim(1);
        assert_eq!(c.num_free_blocks(), 2, "5 tokens keep 2 blocks");
        assert!(c.reserve(2, 8));
        c.fed(2, &[0; 8]);
        assert!(!c.reserve(1, 9), "a third block for 1 does not fit");
        assert_eq!(c.held(1), None, "it let go of what it held");
        assert_eq!(c.num_free_blocks(), 2);
        c.check_invariants().unwrap();
        c.retain(|id| id != 2);
        assert_eq!((c.num_seqs(), c.num_free_blocks()), (0, c.num_blocks()));
    }
}
