//! Per-sequence block tables over the shared pool (vLLM v1 `kv_cache_manager.KVCacheManager`).
//!
//! A sequence's block table maps logical block `i` (positions `i*bs .. (i+1)*bs`) to a
//! physical block id; growing a sequence appends ids and never moves data. The first blocks
//! of a new sequence may be prefix-cache hits shared with other sequences; they are always
//! full and already computed, and the sequence only writes positions after them, into blocks
//! it owns alone (vLLM's argument for needing no copy-on-write).

use std::collections::HashMap;

use super::block_pool::BlockPool;
use super::hash::{BlockHash, CacheScope};
use super::KvCacheError;

/// Identifier of a sequence (one generation request).
pub type SeqId = u64;

/// Shape of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Number of physical blocks.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Whether full blocks are shared between sequences with equal prefixes.
    pub enable_prefix_caching: bool,
}

/// The longest cached full-block prefix of a token sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Physical blocks holding the prefix, in order.
    pub blocks: Vec<u32>,
    /// Their cache identities, checked again when the hit is allocated.
    pub hashes: Vec<BlockHash>,
    /// Tokens covered: `blocks.len() * block_size`.
    pub num_tokens: usize,
}

/// Counters the engine exports as metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvCacheStats {
    /// Total blocks.
    pub num_blocks: usize,
    /// Blocks referenced by no sequence (empty, or cached and evictable).
    pub num_free_blocks: usize,
    /// Blocks findable in the prefix cache.
    pub num_cached_blocks: usize,
    /// Blocks in use / total, in `0.0..=1.0`.
    pub usage: f64,
    /// Prompt tokens looked up in the prefix cache (counted once per admission).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
}

#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    table: Vec<u32>,
    /// Leading blocks already offered to the prefix cache.
    num_committed_blocks: usize,
}

/// Allocates and frees KV blocks for sequences, with prefix caching.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    block_size: usize,
    prefix_caching: bool,
    pool: BlockPool,
    seqs: HashMap<SeqId, SeqBlocks>,
    queries: u64,
    hits: u64,
}

impl KvCacheManager {
    /// An empty cache of the given shape.
    pub fn new(cfg: KvCacheConfig) -> Result<Self, KvCacheError> {
        if cfg.block_size == 0 {
            return Err(KvCacheError::InvalidConfig("block_size must be at least 1"));
        }
        Ok(Self {
            block_size: cfg.block_size,
            prefix_caching: cfg.enable_prefix_caching,
            pool: BlockPool::new(cfg.num_blocks)?,
            seqs: HashMap::new(),
            queries: 0,
            hits: 0,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks that an allocation could use now (free or evictable).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Blocks needed to hold `num_tokens` positions.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// The longest cached full-block prefix of `tokens` in `scope`, given the hash chain of
    /// its full blocks in that scope (`hash::scoped_block_hashes`). Never covers the last
    /// token: a fully cached prompt still computes its last block so the model produces
    /// logits (vLLM does the same). Does not count towards the stats; see
    /// [`Self::record_prefix_query`].
    pub fn lookup_prefix(
        &self,
        tokens: &[u32],
        hashes: &[BlockHash],
        scope: &CacheScope,
    ) -> PrefixHit {
        let mut hit = PrefixHit::default();
        if !self.prefix_caching || tokens.is_empty() {
            return hit;
        }
        let max_blocks = ((tokens.len() - 1) / self.block_size).min(hashes.len());
        for (i, (&hash, chunk)) in hashes
            .iter()
            .zip(tokens.chunks_exact(self.block_size))
            .take(max_blocks)
            .enumerate()
        {
            let parent = i.checked_sub(1).and_then(|j| hashes.get(j).copied());
            let salt = scope.salt_of_block(i, self.block_size);
            match self.pool.lookup(hash, parent, salt, chunk) {
                Some(block) => {
                    hit.blocks.push(block);
                    hit.hashes.push(hash);
                }
                None => break,
            }
        }
        hit.num_tokens = hit.blocks.len() * self.block_size;
        hit
    }

    /// Counts one admitted prompt of `query_tokens` of which `hit_tokens` were cached.
    pub fn record_prefix_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        if self.prefix_caching {
            self.queries += query_tokens as u64;
            self.hits += hit_tokens as u64;
        }
    }

    /// Gives a new sequence the blocks of `hit` plus fresh blocks so its table covers
    /// `num_tokens` positions. All or nothing.
    pub fn allocate_new(
        &mut self,
        seq: SeqId,
        hit: &PrefixHit,
        num_tokens: usize,
    ) -> Result<(), KvCacheError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvCacheError::AlreadyAllocated(seq));
        }
        if hit.num_tokens > num_tokens {
            return Err(KvCacheError::PrefixTooLong {
                hit: hit.num_tokens,
                requested: num_tokens,
            });
        }
        for (&block, &hash) in hit.blocks.iter().zip(&hit.hashes) {
            if self.pool.cached_hash(block) != Some(hash) {
                return Err(KvCacheError::StalePrefix(block));
            }
        }
        // Hit blocks sitting in the free queue stop being available once referenced.
        let evictable_hits = hit
            .blocks
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        let needed = self.blocks_for(num_tokens).saturating_sub(hit.blocks.len());
        let available = self.pool.num_free() - evictable_hits;
        if needed > available {
            return Err(KvCacheError::OutOfBlocks { needed, available });
        }
        self.pool.touch(&hit.blocks);
        let fresh = self.pool.allocate(needed)?;
        let mut table = hit.blocks.clone();
        table.extend(fresh);
        self.seqs.insert(
            seq,
            SeqBlocks {
                table,
                num_committed_blocks: hit.blocks.len(),
            },
        );
        Ok(())
    }

    /// Grows `seq`'s table to cover `num_tokens` positions. All or nothing.
    pub fn allocate_slots(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), KvCacheError> {
        let have = self
            .seqs
            .get(&seq)
            .ok_or(KvCacheError::UnknownSequence(seq))?
            .table
            .len();
        let needed = self.blocks_for(num_tokens).saturating_sub(have);
        if needed == 0 {
            return Ok(());
        }
        let fresh = self.pool.allocate(needed)?;
        match self.seqs.get_mut(&seq) {
            Some(s) => s.table.extend(fresh),
            None => self.pool.release(fresh), // unreachable: checked above
        }
        Ok(())
    }

    /// Shrinks `seq`'s table to the blocks covering `num_tokens` positions, releasing the
    /// rest (the blocks of rejected speculative tokens). Blocks already offered to the prefix
    /// cache are never released this way: they hold computed positions below `num_tokens`.
    pub fn truncate(&mut self, seq: SeqId, num_tokens: usize) {
        let keep = self.blocks_for(num_tokens);
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let keep = keep.max(s.num_committed_blocks);
        if s.table.len() > keep {
            let tail: Vec<u32> = s.table.drain(keep..).rev().collect();
            self.pool.release(tail);
        }
    }

    /// Records that `seq`'s first `num_computed` positions now hold computed KV, and enters
    /// every newly completed full block into the prefix cache. `tokens` and `hashes` are the
    /// sequence's known tokens and the hash chain of their full blocks in `scope`.
    pub fn commit(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        hashes: &[BlockHash],
        num_computed: usize,
        scope: &CacheScope,
    ) {
        if !self.prefix_caching {
            return;
        }
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let full = (num_computed.min(tokens.len()) / self.block_size)
            .min(s.table.len())
            .min(hashes.len());
        for i in s.num_committed_blocks..full {
            let parent = i.checked_sub(1).and_then(|j| hashes.get(j).copied());
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let salt = scope.salt_of_block(i, self.block_size);
            // A refusal means another block already holds this content: nothing to do.
            self.pool.cache(s.table[i], hashes[i], parent, salt, chunk);
        }
        s.num_committed_blocks = s.num_committed_blocks.max(full);
    }

    /// Releases all of `seq`'s blocks; returns whether it had any. Cached blocks stay
    /// findable until evicted. Released last block first, so a sequence's tail is evicted
    /// before its (more shareable) head, as in vLLM.
    pub fn free(&mut self, seq: SeqId) -> bool {
        match self.seqs.remove(&seq) {
            Some(s) => {
                self.pool.release(s.table.into_iter().rev());
                true
            }
            None => false,
        }
    }

    /// `seq`'s block table, if it holds blocks.
    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    /// Blocks in use / total.
    pub fn usage(&self) -> f64 {
        let total = self.pool.num_blocks();
        (total - self.pool.num_free()) as f64 / total as f64
    }

    /// Current counters.
    pub fn stats(&self) -> KvCacheStats {
        KvCacheStats {
            num_blocks: self.pool.num_blocks(),
            num_free_blocks: self.pool.num_free(),
            num_cached_blocks: self.pool.num_cached(),
            usage: self.usage(),
            prefix_cache_queries: self.queries,
            prefix_cache_hits: self.hits,
        }
    }

    /// The underlying pool (read-only), for inspection.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Full consistency check, O(blocks + table entries): every reference count equals the
    /// number of tables holding the block, no block appears twice in one table, blocks
    /// shared by several sequences are cached, and used + free = total.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (seq, s) in &self.seqs {
            let mut in_table = std::collections::HashSet::new();
            for &b in &s.table {
                let Some(r) = refs.get_mut(b as usize) else {
                    return Err(format!("sequence {seq} holds unknown block {b}"));
                };
                if !in_table.insert(b) {
                    return Err(format!("sequence {seq} holds block {b} twice"));
                }
                *r += 1;
            }
            if s.num_committed_blocks > s.table.len() {
                return Err(format!("sequence {seq} committed past its table"));
            }
        }
        let mut used = 0;
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_count(b as u32) != r {
                return Err(format!(
                    "block {b}: ref_cnt {} but held by {r} sequences",
                    self.pool.ref_count(b as u32)
                ));
            }
            used += usize::from(r > 0);
        }
        if used + self.pool.num_free() != self.pool.num_blocks() {
            return Err(format!(
                "used {used} + free {} != total {}",
                self.pool.num_free(),
                self.pool.num_blocks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::hash::{block_hashes, scoped_block_hashes};

    const BS: usize = 4;
    const U: CacheScope = CacheScope::unsalted();

    fn mgr(num_blocks: usize) -> KvCacheManager {
        KvCacheManager::new(KvCacheConfig {
            num_blocks,
            block_size: BS,
            enable_prefix_caching: true,
        })
        .unwrap()
    }

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + salt).collect()
    }

    /// Admits `tokens` fully computed and committed, as the scheduler does.
    fn admit_and_compute(m: &mut KvCacheManager, seq: SeqId, tokens: &[u32]) -> PrefixHit {
        admit_in_scope(m, seq, tokens, &U)
    }

    /// [`admit_and_compute`] in `scope`.
    fn admit_in_scope(
        m: &mut KvCacheManager,
        seq: SeqId,
        tokens: &[u32],
        scope: &CacheScope,
    ) -> PrefixHit {
        let hashes = scoped_block_hashes(tokens, BS, scope);
        let hit = m.lookup_prefix(tokens, &hashes, scope);
        m.allocate_new(seq, &hit, tokens.len()).unwrap();
        m.commit(seq, tokens, &hashes, tokens.len(), scope);
        m.check_invariants().unwrap();
        hit
    }

    #[test]
    fn rejects_invalid_config() {
        let bad = |num_blocks, block_size| {
            KvCacheManager::new(KvCacheConfig {
                num_blocks,
                block_size,
                enable_prefix_caching: true,
            })
        };
        assert!(matches!(bad(0, 16), Err(KvCacheError::InvalidConfig(_))));
        assert!(matches!(bad(8, 0), Err(KvCacheError::InvalidConfig(_))));
        assert!(bad(1, 1).is_ok());
    }

    #[test]
    fn tables_cover_exactly_the_requested_positions_and_grow_by_appending() {
        let mut m = mgr(10);
        m.allocate_new(1, &PrefixHit::default(), 5).unwrap();
        assert_eq!(m.block_table(1).unwrap().len(), 2);
        let before = m.block_table(1).unwrap().to_vec();
        for n in 5..=12 {
            m.allocate_slots(1, n).unwrap();
            assert_eq!(m.block_table(1).unwrap().len(), n.div_ceil(BS));
            assert_eq!(
                &m.block_table(1).unwrap()[..2],
                &before[..],
                "growing never moves blocks"
            );
            m.check_invariants().unwrap();
        }
        m.allocate_slots(1, 3).unwrap(); // shrinking requests are no-ops
        assert_eq!(m.block_table(1).unwrap().len(), 3);
        assert_eq!(
            m.allocate_slots(2, 4),
            Err(KvCacheError::UnknownSequence(2))
        );
        assert_eq!(
            m.allocate_new(1, &PrefixHit::default(), 1),
            Err(KvCacheError::AlreadyAllocated(1))
        );
        assert_eq!(m.stats().num_free_blocks, 7);
        assert!((m.usage() - 0.3).abs() < 1e-12);
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut m = mgr(3);
        m.allocate_new(1, &PrefixHit::default(), 8).unwrap();
        assert_eq!(
            m.allocate_slots(1, 13),
            Err(KvCacheError::OutOfBlocks {
                needed: 2,
                available: 1
            })
        );
        assert_eq!(m.block_table(1).unwrap().len(), 2);
        assert!(m.allocate_new(2, &PrefixHit::default(), 5).is_err());
        assert!(m.block_table(2).is_none());
        m.check_invariants().unwrap();
        assert!(m.free(1));
        assert!(!m.free(1));
        assert_eq!(m.num_free_blocks(), 3);
        m.check_invariants().unwrap();
    }

    #[test]
    fn prefix_hit_lengths() {
        let mut m = mgr(32);
        let base = toks(14, 0); // 3 full blocks + 2 tokens
        assert_eq!(
            admit_and_compute(&mut m, 1, &base).num_tokens,
            0,
            "cold cache"
        );

        // Same first 9 tokens: the 2 full blocks inside them hit.
        let mut other = base[..9].to_vec();
        other.extend([999, 998, 997]);
        let hit = admit_and_compute(&mut m, 2, &other);
        assert_eq!(hit.num_tokens, 8);
        assert_eq!(hit.blocks, m.block_table(1).unwrap()[..2].to_vec());

        // A difference inside the first block: nothing hits.
        let mut first_differs = base.clone();
        first_differs[3] = 12345;
        assert_eq!(admit_and_compute(&mut m, 3, &first_differs).num_tokens, 0);

        // A difference in block 1 only: block 0 hits.
        let mut second_differs = base.clone();
        second_differs[5] = 12345;
        assert_eq!(admit_and_compute(&mut m, 4, &second_differs).num_tokens, 4);

        // The same prompt again: all 3 full blocks hit; the partial one never does.
        assert_eq!(admit_and_compute(&mut m, 5, &base).num_tokens, 12);
    }

    #[test]
    fn scopes_with_different_salts_share_no_block() {
        let mut m = mgr(64);
        let prompt = toks(26, 4); // 6 full blocks + 2 tokens
        let a = CacheScope::salted("tenant-a");
        let b = CacheScope::salted("tenant-b");
        assert_eq!(admit_in_scope(&mut m, 1, &prompt, &a).num_tokens, 0);
        // Same tokens, another salt (or none): nothing is shared, not even the first block.
        assert_eq!(admit_in_scope(&mut m, 2, &prompt, &b).num_tokens, 0);
        assert_eq!(admit_in_scope(&mut m, 3, &prompt, &U).num_tokens, 0);
        let (t1, t2) = (m.block_table(1).unwrap(), m.block_table(2).unwrap());
        assert!(t1.iter().all(|blk| !t2.contains(blk)));
        // The same salt shares every full block.
        assert_eq!(admit_in_scope(&mut m, 4, &prompt, &a).num_tokens, 24);
        assert_eq!(admit_in_scope(&mut m, 5, &prompt, &b).num_tokens, 24);
        assert_eq!(admit_in_scope(&mut m, 6, &prompt, &U).num_tokens, 24);
        // Each scope also finds only its own blocks when the others were evicted or freed.
        for seq in 1..=6 {
            m.free(seq);
        }
        let hashes_a = scoped_block_hashes(&prompt, BS, &a);
        assert_eq!(m.lookup_prefix(&prompt, &hashes_a, &b).num_tokens, 0);
        assert_eq!(m.lookup_prefix(&prompt, &hashes_a, &a).num_tokens, 24);
        m.check_invariants().unwrap();
    }

    #[test]
    fn a_shared_prefix_is_shared_across_salts_and_nothing_after_it() {
        let mut m = mgr(64);
        // 10 public tokens: blocks 0 and 1 lie wholly inside them.
        let prompt = toks(26, 8);
        let a = CacheScope::salted("tenant-a").with_shared_prefix(10);
        let b = CacheScope::salted("tenant-b").with_shared_prefix(10);
        assert_eq!(admit_in_scope(&mut m, 1, &prompt, &a).num_tokens, 0);
        assert_eq!(admit_in_scope(&mut m, 2, &prompt, &b).num_tokens, 8);
        assert_eq!(
            m.block_table(1).unwrap()[..2],
            m.block_table(2).unwrap()[..2]
        );
        assert_eq!(admit_in_scope(&mut m, 3, &prompt, &a).num_tokens, 24);
        // A salted scope without the shared prefix configured shares nothing.
        let plain_a = CacheScope::salted("tenant-a");
        assert_eq!(admit_in_scope(&mut m, 4, &prompt, &plain_a).num_tokens, 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn fully_cached_prompt_still_computes_its_last_token() {
        let mut m = mgr(32);
        let exact = toks(12, 7); // exactly 3 blocks
        admit_and_compute(&mut m, 1, &exact);
        // All 3 blocks are cached, but the last block is recomputed so logits exist.
        let hit = admit_and_compute(&mut m, 2, &exact);
        assert_eq!(hit.num_tokens, 8);
        // One more token than the cached blocks: every full block can be reused.
        let mut longer = exact.clone();
        longer.push(5);
        assert_eq!(admit_and_compute(&mut m, 3, &longer).num_tokens, 12);
        // A 1-token prompt never hits.
        let one = vec![exact[0]];
        assert_eq!(
            m.lookup_prefix(&one, &block_hashes(&one, BS), &U)
                .num_tokens,
            0
        );
        assert_eq!(m.lookup_prefix(&[], &[], &U).num_tokens, 0);
    }

    #[test]
    fn shared_blocks_are_refcounted_and_never_written_by_the_sharer() {
        let mut m = mgr(16);
        let prompt = toks(10, 3);
        admit_and_compute(&mut m, 1, &prompt);
        let hashes = block_hashes(&prompt, BS);
        let hit = m.lookup_prefix(&prompt, &hashes, &U);
        assert_eq!(hit.num_tokens, 8);
        m.allocate_new(2, &hit, prompt.len()).unwrap();
        let (t1, t2) = (
            m.block_table(1).unwrap().to_vec(),
            m.block_table(2).unwrap().to_vec(),
        );
        assert_eq!(t1[..2], t2[..2]);
        assert_ne!(
            t1[2], t2[2],
            "the partial block each sequence writes is its own"
        );
        assert_eq!(m.pool().ref_count(t1[0]), 2);
        assert_eq!(m.pool().ref_count(t1[2]), 1);
        m.check_invariants().unwrap();
        // Sequence 2 writes positions 8.. only: all inside blocks it owns alone.
        for p in hit.num_tokens..prompt.len() {
            assert_eq!(m.pool().ref_count(t2[p / BS]), 1);
        }
        m.free(1);
        assert_eq!(m.pool().ref_count(t1[0]), 1);
        m.free(2);
        assert_eq!(m.num_free_blocks(), 16);
        m.check_invariants().unwrap();
    }

    #[test]
    fn uncommitted_blocks_are_not_hit() {
        let mut m = mgr(16);
        let prompt = toks(9, 1);
        let hashes = block_hashes(&prompt, BS);
        m.allocate_new(1, &PrefixHit::default(), prompt.len())
            .unwrap();
        assert_eq!(
            m.lookup_prefix(&prompt, &hashes, &U).num_tokens,
            0,
            "scheduled but not run"
        );
        m.commit(1, &prompt, &hashes, 4, &U);
        assert_eq!(
            m.lookup_prefix(&prompt, &hashes, &U).num_tokens,
            4,
            "only computed blocks"
        );
        m.commit(1, &prompt, &hashes, 9, &U);
        assert_eq!(m.lookup_prefix(&prompt, &hashes, &U).num_tokens, 8);
    }

    #[test]
    fn freed_cached_prefix_is_reused_until_evicted_lru_first() {
        let mut m = mgr(6);
        let a = toks(9, 100); // 2 full blocks + 1
        let b = toks(9, 200);
        admit_and_compute(&mut m, 1, &a);
        admit_and_compute(&mut m, 2, &b);
        m.free(1); // a's blocks: freed first, so evicted first
        m.free(2);
        assert_eq!(m.num_free_blocks(), 6);
        assert_eq!(m.stats().num_cached_blocks, 4);
        // A 2-block allocation uses the 2 uncached partial blocks first: both prefixes survive.
        m.allocate_new(3, &PrefixHit::default(), 8).unwrap();
        assert_eq!(m.lookup_prefix(&a, &block_hashes(&a, BS), &U).num_tokens, 8);
        assert_eq!(m.lookup_prefix(&b, &block_hashes(&b, BS), &U).num_tokens, 8);
        // Two more blocks evict a's blocks (least recently used), last block first.
        m.allocate_new(4, &PrefixHit::default(), 4).unwrap();
        assert_eq!(
            m.lookup_prefix(&a, &block_hashes(&a, BS), &U).num_tokens,
            4,
            "tail evicted first"
        );
        m.allocate_new(5, &PrefixHit::default(), 4).unwrap();
        assert_eq!(m.lookup_prefix(&a, &block_hashes(&a, BS), &U).num_tokens, 0);
        assert_eq!(m.lookup_prefix(&b, &block_hashes(&b, BS), &U).num_tokens, 8);
        m.check_invariants().unwrap();
    }

    #[test]
    fn hit_on_free_cached_blocks_counts_against_availability() {
        let mut m = mgr(4);
        let a = toks(9, 5);
        admit_and_compute(&mut m, 1, &a);
        m.free(1);
        let hashes = block_hashes(&a, BS);
        let hit = m.lookup_prefix(&a, &hashes, &U);
        assert_eq!(hit.blocks.len(), 2);
        // 4 free blocks, 2 of them are the hit: 2 fresh blocks at most.
        assert_eq!(
            m.allocate_new(2, &hit, 17),
            Err(KvCacheError::OutOfBlocks {
                needed: 3,
                available: 2
            })
        );
        m.allocate_new(2, &hit, 16).unwrap();
        assert_eq!(m.num_free_blocks(), 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn stale_or_oversized_hits_are_refused() {
        let mut m = mgr(3);
        let a = toks(9, 9);
        admit_and_compute(&mut m, 1, &a);
        m.free(1);
        let hashes = block_hashes(&a, BS);
        let hit = m.lookup_prefix(&a, &hashes, &U);
        assert_eq!(
            m.allocate_new(2, &hit, 4),
            Err(KvCacheError::PrefixTooLong {
                hit: 8,
                requested: 4
            })
        );
        m.allocate_new(3, &PrefixHit::default(), 12).unwrap(); // evicts everything
        m.free(3);
        assert!(matches!(
            m.allocate_new(2, &hit, 9),
            Err(KvCacheError::StalePrefix(_))
        ));
        m.check_invariants().unwrap();
    }

    #[test]
    fn prefix_caching_disabled_never_hits_or_counts() {
        let mut m = KvCacheManager::new(KvCacheConfig {
            num_blocks: 8,
            block_size: BS,
            enable_prefix_caching: false,
        })
        .unwrap();
        let a = toks(9, 1);
        let hashes = block_hashes(&a, BS);
        m.allocate_new(1, &PrefixHit::default(), 9).unwrap();
        m.commit(1, &a, &hashes, 9, &U);
        m.free(1);
        assert_eq!(m.lookup_prefix(&a, &hashes, &U).num_tokens, 0);
        m.record_prefix_query(9, 0);
        assert_eq!(m.stats().prefix_cache_queries, 0);
        assert_eq!(m.stats().num_cached_blocks, 0);
    }

    #[test]
    fn stats_count_queries_and_hits_in_tokens() {
        let mut m = mgr(8);
        m.record_prefix_query(10, 0);
        m.record_prefix_query(10, 8);
        let s = m.stats();
        assert_eq!((s.prefix_cache_queries, s.prefix_cache_hits), (20, 8));
        assert_eq!(s.num_blocks, 8);
        assert_eq!(s.usage, 0.0);
    }
}
