//! What callers hand the engine and what they get back.

use crate::kv_cache::CacheScope;
use crate::sampling::SamplingParams;

/// What the engine is asked to generate: already tokenised and validated.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Upper bound of generated tokens.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first occurrence, which is not returned.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (returned as `stop`).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Continue a generation another worker started (preemption-safe generation): its
    /// delivered tokens are prefilled after the prompt and count as generated tokens.
    pub resume: Option<ResumeFrom>,
    /// Which prefix-cache blocks the request may reuse and leave for others: the queue
    /// worker salts with the tenant so no tenant can probe another's prompts through
    /// `cached_tokens`; the direct server (no tenants) uses the unsalted scope.
    pub cache_scope: CacheScope,
    /// At most this many speculative tokens per step for this request, under the engine's
    /// own limit; `None`: the engine's. 0 turns speculation off for it.
    pub num_speculative_tokens: Option<usize>,
}

/// What an earlier run of the same request already delivered to the client.
///
/// The engine re-prefills `prompt + token_ids`, counts `token_ids` towards `max_tokens`,
/// penalties, stop tokens and the context limit as if it had generated them, and replays
/// them through its detokeniser and stop-string matcher. The first event it sends then
/// continues the text exactly after the `text_len` bytes already delivered: text held back
/// by the earlier run (an incomplete UTF-8 character, a possible stop-string start) comes
/// out once, nothing is repeated. With greedy sampling the result is token for token the
/// uninterrupted run. (A seeded random sampler restarts its RNG, so a resumed sampled
/// generation is a valid continuation but not the one the uninterrupted run would draw.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeFrom {
    /// Completion token ids already delivered, in order.
    pub token_ids: Vec<u32>,
    /// Bytes of completion text already delivered.
    pub text_len: usize,
}

/// Why a sequence ended, in OpenAI's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token, stop token id or stop string.
    Stop,
    /// `max_tokens` or the context window reached.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens generated over the whole request: a resumed request counts the tokens it was
    /// resumed from too (the end-of-generation token that stopped it is counted, not shown).
    pub completion_tokens: usize,
}

/// Log-probability of one generated token and its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What a request's receiver gets, in order: deltas, then exactly one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// Newly generated tokens and the text they complete (may be empty while a multi-byte
    /// character or a possible stop string is held back). A resumed request's deltas hold
    /// only what follows the resume point.
    Delta {
        text: String,
        token_ids: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
    },
    Error {
        message: String,
    },
}
