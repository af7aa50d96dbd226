//! Block pool (vLLM v1 `block_pool.BlockPool`): reference counts, the prefix-cache map
//! from block hash to block, and LRU eviction through the free queue.
//!
//! A block is in exactly one of three states: in use (`ref_cnt > 0`, not in the free
//! queue), free and cached (`ref_cnt == 0`, in the queue, still findable by hash until it
//! is handed out again), or free and empty. Only full, computed blocks are ever cached,
//! and a cached block is never written again, which is what makes sharing it safe.

use std::collections::HashMap;
use std::sync::Arc;

use super::free_queue::FreeBlockQueue;
use super::hash::BlockHash;
use super::KvCacheError;

/// What a cached block holds, kept so lookups compare contents, not just hashes.
#[derive(Debug, Clone)]
struct CachedContent {
    hash: BlockHash,
    parent: Option<BlockHash>,
    /// The salt this block brings into its chain (`CacheScope::salt_of_block`), compared too
    /// so that no hash collision can ever hand one tenant's block to another.
    salt: Option<Arc<str>>,
    tokens: Box<[u32]>,
}

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_cnt: u32,
    cached: Option<CachedContent>,
}

/// Fixed set of KV blocks with reference counts and a prefix cache.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    free: FreeBlockQueue,
    by_hash: HashMap<BlockHash, u32>,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks (ids `0..num_blocks`).
    pub fn new(num_blocks: usize) -> Result<Self, KvCacheError> {
        if num_blocks == 0 {
            return Err(KvCacheError::InvalidConfig("num_blocks must be at least 1"));
        }
        if num_blocks >= u32::MAX as usize {
            return Err(KvCacheError::InvalidConfig("num_blocks must fit in u32"));
        }
        Ok(Self {
            blocks: vec![BlockMeta::default(); num_blocks],
            free: FreeBlockQueue::new(num_blocks),
            by_hash: HashMap::new(),
        })
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks not referenced by any sequence (empty or evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks currently findable in the prefix cache (in use or evictable).
    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Reference count of `block` (0 for an unknown id).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.blocks.get(block as usize).map_or(0, |b| b.ref_cnt)
    }

    /// The cache identity of `block`, if it is cached.
    pub fn cached_hash(&self, block: u32) -> Option<BlockHash> {
        self.blocks
            .get(block as usize)
            .and_then(|b| b.cached.as_ref())
            .map(|c| c.hash)
    }

    /// The cached block named `hash` whose content is exactly (`parent`, `salt`, `tokens`).
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        salt: Option<&str>,
        tokens: &[u32],
    ) -> Option<u32> {
        let id = *self.by_hash.get(&hash)?;
        let content = self.blocks.get(id as usize)?.cached.as_ref()?;
        (content.hash == hash
            && content.parent == parent
            && content.salt.as_deref() == salt
            && *content.tokens == *tokens)
            .then_some(id)
    }

    /// Takes `n` blocks from the front of the free queue with reference count 1, evicting
    /// their cached content. All or nothing.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<u32>, KvCacheError> {
        if n > self.free.len() {
            return Err(KvCacheError::OutOfBlocks {
                needed: n,
                available: self.free.len(),
            });
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(id) = self.free.pop_front() else {
                break; // unreachable: length checked above
            };
            self.evict(id);
            if let Some(meta) = self.blocks.get_mut(id as usize) {
                meta.ref_cnt = 1;
            }
            out.push(id);
        }
        Ok(out)
    }

    /// Adds a reference to each block (a prefix hit), taking free ones off the free queue.
    pub fn touch(&mut self, blocks: &[u32]) {
        for &id in blocks {
            if let Some(meta) = self.blocks.get_mut(id as usize) {
                if meta.ref_cnt == 0 {
                    self.free.remove(id);
                }
                meta.ref_cnt += 1;
            }
        }
    }

    /// Drops one reference from each block, in the given order. A block reaching zero
    /// goes to the back of the free queue if cached (evicted last, LRU), to the front
    /// otherwise (nothing worth keeping, so it is reused first).
    pub fn release(&mut self, blocks: impl IntoIterator<Item = u32>) {
        for id in blocks {
            let Some(meta) = self.blocks.get_mut(id as usize) else {
                continue;
            };
            if meta.ref_cnt == 0 {
                tracing::error!(block = id, "KV block released more often than referenced");
                continue;
            }
            meta.ref_cnt -= 1;
            if meta.ref_cnt == 0 {
                if meta.cached.is_some() {
                    self.free.push_back(id);
                } else {
                    self.free.push_front(id);
                }
            }
        }
    }

    /// Enters the full, computed `block` into the prefix cache under `hash`. Returns false
    /// (and changes nothing) when the block is not in use, is already cached, or another
    /// block already holds that name; the first copy wins, as in vLLM.
    pub fn cache(
        &mut self,
        block: u32,
        hash: BlockHash,
        parent: Option<BlockHash>,
        salt: Option<&str>,
        tokens: &[u32],
    ) -> bool {
        if self.by_hash.contains_key(&hash) {
            return false;
        }
        let Some(meta) = self.blocks.get_mut(block as usize) else {
            return false;
        };
        if meta.ref_cnt == 0 || meta.cached.is_some() {
            return false;
        }
        meta.cached = Some(CachedContent {
            hash,
            parent,
            salt: salt.map(Arc::from),
            tokens: tokens.into(),
        });
        self.by_hash.insert(hash, block);
        true
    }

    /// Free block ids in eviction order (front first).
    pub fn free_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.free.iter()
    }

    /// Checks the pool's own bookkeeping; describes the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let queued: Vec<u32> = self.free.iter().collect();
        if queued.len() != self.free.len() {
            return Err(format!(
                "free queue length {} but {} linked",
                self.free.len(),
                queued.len()
            ));
        }
        let mut seen = vec![false; self.blocks.len()];
        for &id in &queued {
            let Some(s) = seen.get_mut(id as usize) else {
                return Err(format!("free queue holds unknown block {id}"));
            };
            if *s {
                return Err(format!("block {id} queued twice"));
            }
            *s = true;
        }
        for (id, meta) in self.blocks.iter().enumerate() {
            if (meta.ref_cnt == 0) != seen[id] {
                return Err(format!(
                    "block {id}: ref_cnt {} but queued = {}",
                    meta.ref_cnt, seen[id]
                ));
            }
            if meta.ref_cnt > 1 && meta.cached.is_none() {
                return Err(format!(
                    "block {id} is shared ({} refs) but not cached",
                    meta.ref_cnt
                ));
            }
            if let Some(c) = &meta.cached {
                if self.by_hash.get(&c.hash) != Some(&(id as u32)) {
                    return Err(format!("cached block {id} is not in the hash map"));
                }
            }
        }
        for (hash, &id) in &self.by_hash {
            if self.cached_hash(id) != Some(*hash) {
                return Err(format!(
                    "hash map entry for block {id} does not match the block"
                ));
            }
        }
        Ok(())
    }

    fn evict(&mut self, id: u32) {
        let Some(meta) = self.blocks.get_mut(id as usize) else {
            return;
        };
        if let Some(content) = meta.cached.take() {
            if self.by_hash.get(&content.hash) == Some(&id) {
                self.by_hash.remove(&content.hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::hash::hash_block;

    #[test]
    fn rejects_unusable_sizes() {
        assert!(matches!(
            BlockPool::new(0),
            Err(KvCacheError::InvalidConfig(_))
        ));
        assert!(BlockPool::new(1).is_ok());
    }

    #[test]
    fn allocate_is_all_or_nothing_and_refcounts_one() {
        let mut p = BlockPool::new(4).unwrap();
        assert_eq!(
            p.allocate(5),
            Err(KvCacheError::OutOfBlocks {
                needed: 5,
                available: 4
            })
        );
        assert_eq!(p.num_free(), 4);
        let got = p.allocate(3).unwrap();
        assert_eq!(got, vec![0, 1, 2]);
        assert!(got.iter().all(|&b| p.ref_count(b) == 1));
        assert_eq!(p.num_free(), 1);
        assert!(p.allocate(2).is_err());
        assert_eq!(p.allocate(0).unwrap(), Vec::<u32>::new());
        p.check_invariants().unwrap();
    }

    #[test]
    fn release_returns_blocks_only_at_zero_refs() {
        let mut p = BlockPool::new(3).unwrap();
        let b = p.allocate(1).unwrap()[0];
        let h = hash_block(None, &[1, 2]);
        assert!(p.cache(b, h, None, None, &[1, 2]));
        p.touch(&[b]);
        assert_eq!(p.ref_count(b), 2);
        p.release([b]);
        assert_eq!(p.ref_count(b), 1);
        assert_eq!(p.num_free(), 2);
        p.release([b]);
        assert_eq!(p.ref_count(b), 0);
        assert_eq!(p.num_free(), 3);
        p.release([b]); // over-release is logged and ignored
        assert_eq!(p.ref_count(b), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn uncached_free_blocks_are_reused_before_cached_ones() {
        let mut p = BlockPool::new(3).unwrap();
        let got = p.allocate(3).unwrap();
        let h = hash_block(None, &[9]);
        assert!(p.cache(got[0], h, None, None, &[9]));
        p.release([got[0], got[1], got[2]]);
        // got[0] is cached: back of the queue; the others jump ahead of it.
        assert_eq!(
            p.free_blocks().collect::<Vec<_>>(),
            vec![got[2], got[1], got[0]]
        );
        let again = p.allocate(2).unwrap();
        assert!(!again.contains(&got[0]));
        assert_eq!(p.lookup(h, None, None, &[9]), Some(got[0]));
        p.check_invariants().unwrap();
    }

    #[test]
    fn lru_eviction_order_follows_release_order() {
        let mut p = BlockPool::new(4).unwrap();
        let got = p.allocate(4).unwrap();
        let hashes: Vec<BlockHash> = (0..4).map(|i| hash_block(None, &[i])).collect();
        for i in 0..4 {
            assert!(p.cache(got[i], hashes[i], None, None, &[i as u32]));
        }
        // Released in the order 2, 0, 3, 1: that is the eviction order.
        for i in [2usize, 0, 3, 1] {
            p.release([got[i]]);
        }
        // A hit on block 0 takes it out of the queue; freeing it again makes it newest.
        p.touch(&[got[0]]);
        p.release([got[0]]);
        let mut evicted = Vec::new();
        for _ in 0..4 {
            let b = p.allocate(1).unwrap()[0];
            evicted.push(b);
            assert_eq!(p.cached_hash(b), None, "allocation evicts cached content");
        }
        assert_eq!(evicted, vec![got[2], got[3], got[1], got[0]]);
        for (i, h) in hashes.iter().enumerate() {
            assert_eq!(p.lookup(*h, None, None, &[i as u32]), None);
        }
        assert_eq!(p.num_cached(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn lookup_compares_contents_not_just_hashes() {
        let mut p = BlockPool::new(2).unwrap();
        let b = p.allocate(1).unwrap()[0];
        let parent = hash_block(None, &[0]);
        let h = hash_block(Some(parent), &[1, 2]);
        assert!(p.cache(b, h, Some(parent), None, &[1, 2]));
        assert_eq!(p.lookup(h, Some(parent), None, &[1, 2]), Some(b));
        // A (forced) collision: same hash, other tokens or parent, must not hit.
        assert_eq!(p.lookup(h, Some(parent), None, &[1, 3]), None);
        assert_eq!(p.lookup(h, None, None, &[1, 2]), None);
        assert_eq!(
            p.lookup(BlockHash(h.0 + 1), Some(parent), None, &[1, 2]),
            None
        );
        // A salted block hits only with its own salt, even on a (forced) hash collision.
        let b2 = p.allocate(1).unwrap()[0];
        let s = hash_block(None, &[4]);
        assert!(p.cache(b2, s, None, Some("acme"), &[4]));
        assert_eq!(p.lookup(s, None, Some("acme"), &[4]), Some(b2));
        assert_eq!(p.lookup(s, None, Some("globex"), &[4]), None);
        assert_eq!(p.lookup(s, None, None, &[4]), None);
    }

    #[test]
    fn cache_refuses_duplicates_and_free_blocks() {
        let mut p = BlockPool::new(3).unwrap();
        let got = p.allocate(2).unwrap();
        let h = hash_block(None, &[5]);
        assert!(p.cache(got[0], h, None, None, &[5]));
        assert!(!p.cache(got[1], h, None, None, &[5]), "first copy wins");
        assert!(
            !p.cache(got[0], hash_block(None, &[6]), None, None, &[6]),
            "already cached"
        );
        assert!(
            !p.cache(2, hash_block(None, &[7]), None, None, &[7]),
            "free block"
        );
        assert!(
            !p.cache(77, hash_block(None, &[8]), None, None, &[8]),
            "unknown block"
        );
        assert_eq!(p.num_cached(), 1);
        p.check_invariants().unwrap();
    }
}
