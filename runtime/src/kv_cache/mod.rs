//! Paged KV-cache block manager with automatic prefix caching.
//!
//! Follows vLLM v1's design (`vllm/v1/core/`):
//! - [`hash`] is `kv_cache_utils.hash_block_tokens`: every *full* block is named by a hash
//!   chain (parent block's hash + this block's token ids), so equal prefixes get equal names.
//! - `free_queue` is `kv_cache_utils.FreeKVCacheBlockQueue`: a doubly linked list of free
//!   block ids with O(1) removal from the middle, giving LRU eviction of cached blocks.
//! - [`BlockPool`] is `block_pool.BlockPool`: reference counts, the hash → block map, and
//!   eviction of a cached block when a free block is taken.
//! - [`KvCacheManager`] is `kv_cache_manager.KVCacheManager`: per-sequence block tables,
//!   prefix lookup (`get_computed_blocks`), slot allocation (`allocate_slots`) and freeing.
//! - [`CacheScope`] is vLLM's `cache_salt`: sequences of different salts (tenants) never
//!   share a block, except those wholly inside a public shared prefix.
//!
//! Differences from vLLM, on purpose: a cached block also keeps its parent hash and token
//! ids, and a lookup compares them, so a 64-bit hash collision can never hand a sequence
//! someone else's KV; freed blocks that hold no cached content go to the *front* of the free
//! queue, so they are reused before any cached block is evicted; and a block is entered in
//! the prefix cache only after the step that computes it has run ([`KvCacheManager::commit`]),
//! so the engine may run the sequences of one batch in any order.
//!
//! Pure logic: no I/O, no threads, no clock.

mod block_pool;
mod error;
mod free_queue;
pub mod hash;
mod manager;

pub use block_pool::BlockPool;
pub use error::KvCacheError;
pub use hash::{BlockHash, CacheScope};
pub use manager::{KvCacheConfig, KvCacheManager, KvCacheStats, PrefixHit, SeqId};

/// Tokens per KV block unless configured otherwise (vLLM's default).
pub const DEFAULT_BLOCK_SIZE: usize = 16;
