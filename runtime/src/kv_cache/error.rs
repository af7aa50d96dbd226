//! Typed errors of the KV-cache manager.

use super::manager::SeqId;

/// Why a KV-cache operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheError {
    /// The configuration cannot describe a usable cache.
    #[error("invalid KV cache config: {0}")]
    InvalidConfig(&'static str),
    /// Not enough free (or evictable) blocks; nothing was allocated.
    #[error("out of KV blocks: need {needed}, {available} available")]
    OutOfBlocks {
        /// Blocks the request needed.
        needed: usize,
        /// Blocks that could be handed out.
        available: usize,
    },
    /// The sequence has no blocks in this cache.
    #[error("sequence {0} has no KV blocks")]
    UnknownSequence(SeqId),
    /// The sequence already holds blocks.
    #[error("sequence {0} already holds KV blocks")]
    AlreadyAllocated(SeqId),
    /// A prefix hit was evicted or changed between lookup and allocation.
    #[error("prefix hit is stale: block {0} no longer holds the looked-up content")]
    StalePrefix(u32),
    /// A prefix hit covers more tokens than the allocation asks for.
    #[error("prefix hit of {hit} tokens exceeds the requested {requested} tokens")]
    PrefixTooLong {
        /// Tokens covered by the hit.
        hit: usize,
        /// Tokens the caller asked to allocate for.
        requested: usize,
    },
}
