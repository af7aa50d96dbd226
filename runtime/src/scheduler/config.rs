//! Scheduler configuration.

use super::SchedulerError;

/// Limits of one scheduling step and shape of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most tokens (decodes + prefill chunks) in one step.
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (and so in one step).
    pub max_num_seqs: usize,
    /// Tokens per KV block (`kv_cache::DEFAULT_BLOCK_SIZE` is 16).
    pub block_size: usize,
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// Share computed full blocks between sequences with equal prefixes.
    pub enable_prefix_caching: bool,
}

impl SchedulerConfig {
    /// Checks that the config can make progress.
    pub fn validate(&self) -> Result<(), SchedulerError> {
        if self.max_num_batched_tokens == 0 {
            return Err(SchedulerError::InvalidConfig(
                "max_num_batched_tokens must be at least 1",
            ));
        }
        if self.max_num_seqs == 0 {
            return Err(SchedulerError::InvalidConfig(
                "max_num_seqs must be at least 1",
            ));
        }
        if self.block_size == 0 {
            return Err(SchedulerError::InvalidConfig(
                "block_size must be at least 1",
            ));
        }
        if self.num_blocks == 0 {
            return Err(SchedulerError::InvalidConfig(
                "num_blocks must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_zero_limit_is_rejected() {
        let ok = SchedulerConfig {
            max_num_batched_tokens: 8,
            max_num_seqs: 2,
            block_size: 4,
            num_blocks: 4,
            enable_prefix_caching: true,
        };
        assert_eq!(ok.validate(), Ok(()));
        for bad in [
            SchedulerConfig {
                max_num_batched_tokens: 0,
                ..ok
            },
            SchedulerConfig {
                max_num_seqs: 0,
                ..ok
            },
            SchedulerConfig {
                block_size: 0,
                ..ok
            },
            SchedulerConfig {
                num_blocks: 0,
                ..ok
            },
        ] {
            assert!(matches!(
                bad.validate(),
                Err(SchedulerError::InvalidConfig(_))
            ));
        }
    }
}
