use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Token usage of one request, as OpenAI reports it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct Usage {
    /// Tokens of the prompt (the chat template applied).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Of the prompt tokens, those served from cache.
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    /// Builds the usage object; `total_tokens` is derived.
    pub fn new(prompt_tokens: usize, cached_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}
