//! Continuous-batching scheduler with chunked prefill and recompute preemption.
//!
//! Follows vLLM v1's `vllm/v1/core/sched/scheduler.py`: one token budget per step
//! (`max_num_batched_tokens`) shared by decodes and prefill chunks, no separate prefill and
//! decode phases. Each step serves the running sequences first, oldest first (a decode is one
//! token, an unfinished prefill gets its next chunk), then admits waiting sequences in FCFS
//! order while budget, `max_num_seqs` and blocks allow. When a running sequence cannot get a
//! block, the newest running sequence is preempted: its blocks are freed, it goes back to the
//! front of the waiting queue, and on readmission its prompt plus the tokens generated so far
//! are recomputed (using whatever the prefix cache still holds); generated tokens are kept,
//! so no output is repeated. No sequence is admitted in a step that preempted.
//!
//! Protocol with the engine, per step: `schedule()` → run the model on the batch →
//! `append_sampled()` (always, even with no samples) → `finish()` the sequences that stopped.
//! `append_sampled` is also what tells the scheduler the batch's KV is now written, so blocks
//! become shareable through the prefix cache only once computed.
//!
//! Speculative decoding: a decoding sequence may carry a proposal ([`Scheduler::propose`]),
//! scheduled after its decode token and verified from the same step's logits;
//! [`Scheduler::append_tokens`] takes the tokens kept and rolls back the rejected positions
//! (their blocks freed, never cached), as vLLM v1 does with `spec_token_ids`.
//!
//! Pure logic: no I/O, no threads, no clock.

mod batch;
mod config;
mod error;
#[allow(clippy::module_inception)]
mod scheduler;
mod sequence;
pub mod sim;
#[cfg(test)]
mod speculation_tests;

pub use batch::{ScheduledBatch, ScheduledSeq};
pub use config::SchedulerConfig;
pub use error::SchedulerError;
pub use scheduler::{Scheduler, SchedulerStats};

pub use crate::kv_cache::SeqId;
