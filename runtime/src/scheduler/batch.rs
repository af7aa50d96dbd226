//! What one step runs through the model.

use super::SeqId;

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub id: SeqId,
    /// Tokens to run through the model this step.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` in the sequence.
    pub start_pos: usize,
    /// Physical blocks covering positions `0 .. start_pos + tokens.len()`; the K/V of
    /// position `p` lives in slot `block_table[p / bs] * bs + p % bs`.
    pub block_table: Vec<u32>,
    /// This chunk ends at the last known token: sample one token from its logits.
    pub sample: bool,
    /// Proposed tokens at the end of `tokens` (after the last known token), to verify from
    /// the logits of the positions before each; 0 for a plain decode or a prefill chunk.
    pub num_spec: usize,
    /// Prompt tokens served from the prefix cache at first admission (for usage reporting;
    /// recomputation after a preemption does not change it).
    pub cached_tokens: usize,
}

/// One step's batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduledBatch {
    /// Running sequences first (oldest first), then newly admitted ones.
    pub seqs: Vec<ScheduledSeq>,
    /// Sum of `tokens.len()` over `seqs`; at most `max_num_batched_tokens`.
    pub num_tokens: usize,
}

impl ScheduledBatch {
    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}
