//! Speculative decoding inside continuous batching.
//!
//! A proposer guesses the next few tokens of a decoding sequence; the scheduler runs them
//! through the model together with the sequence's regular decode token, in the same step as
//! every other sequence's decodes and prefill chunks and under the same token budget
//! (vLLM v1's `spec_token_ids` on a request). The model returns logits for each of those
//! positions, and the engine keeps the longest run of proposals that the target model itself
//! produces, plus one token of the target's own: 1 to k+1 tokens from one pass that reads the
//! weights once. The KV blocks of rejected positions go back to the pool at once and never
//! reach the prefix cache.
//!
//! Acceptance keeps the output exactly the target's. Each proposal is one token per
//! position, a point mass q = δ(d). The rejection rule of Leviathan et al. (2023) and Chen
//! et al. (2023) accepts d with probability min(1, p(d)/q(d)) = p(d) and, on rejection, draws
//! from the normalised residual max(0, p − q), which is p with d taken out. Drawing x from p
//! with the request's own sampler and accepting d if and only if x = d does exactly that:
//! P(accept) = p(d), and a rejected draw is x ~ p given x ≠ d ([`verify`]). The sampler's draw
//! for the token at position n depends only on the request's seed and n, so a request gives
//! the same tokens with and without speculation, greedy or sampled.
//!
//! - [`ngram`]: prompt lookup, the continuation of the latest earlier occurrence of the
//!   sequence's last few tokens (no extra model).
//! - `draft`: a smaller model of the same vocabulary (`--draft-model`) proposes its greedy
//!   continuation, batched over the sequences, from a paged KV cache of its own
//!   (`draft_cache`) that keeps only tokens the sequence really has.
//! - [`adaptive`]: how many tokens to propose for a sequence, from its recent acceptance of
//!   that kind of proposal (a lookup's by the length of its match) and what a longer step
//!   costs ([`StepCost`], measured when the engine starts; for a draft model, its own forward
//!   passes too).
//! - [`replay`]: recorded greedy answers run offline through the lookup policy and a step
//!   cost curve, against an oracle: what the proposer could give, without timing noise.

pub mod adaptive;
mod calibrate;
mod config;
mod draft;
mod draft_cache;
mod draft_load;
pub mod ngram;
mod proposer;
pub mod replay;
mod stats;
mod step_cost;
pub mod verify;

pub use adaptive::{best_num_tokens, lookup_proposal, Acceptance, ProposalKind};
pub(crate) use calibrate::{measure_step_cost, relative_step_times};
pub use config::{SpeculativeConfig, SpeculativeMethod, ASSUMED_VERIFY_COST};
pub use draft_load::{check_vocabulary, DraftError};
pub use ngram::{Lookup, NgramProposer};
pub(crate) use proposer::{ProposalSlot, Proposer};
pub use stats::SpeculationStats;
pub use step_cost::StepCost;
pub use verify::verify;
