//! Typed errors of the scheduler.

use super::SeqId;
use crate::kv_cache::KvCacheError;

/// Why the scheduler refused a request or a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// The configuration cannot make progress.
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(&'static str),
    /// The KV cache could not be built.
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
    /// A sequence with this id is already waiting or running.
    #[error("sequence {0} already exists")]
    DuplicateId(SeqId),
    /// The prompt has no tokens.
    #[error("prompt is empty")]
    EmptyPrompt,
    /// Nothing to generate.
    #[error("max_new_tokens must be at least 1")]
    NoNewTokens,
    /// The sequence could never fit in the whole cache, even running alone.
    #[error("{needed_tokens} tokens need {needed_blocks} KV blocks; the cache has {num_blocks}")]
    TooLong {
        /// KV positions the sequence would need at its longest.
        needed_tokens: usize,
        /// Blocks for those positions.
        needed_blocks: usize,
        /// Blocks in the whole cache.
        num_blocks: usize,
    },
}
