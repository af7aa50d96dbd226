//! `/v1/completions` bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::number;
use crate::params::{validate_max_tokens, SamplingFields};
use crate::usage::Usage;

/// `prompt`: text, token ids, or a one-element list of either.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(#[serde(deserialize_with = "number::int_list")] Vec<u32>),
    Texts(Vec<String>),
    TokenLists(#[serde(deserialize_with = "number::int_lists")] Vec<Vec<u32>>),
}

/// A prompt after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The request body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: PromptField,
    #[serde(default, deserialize_with = "number::opt_int")]
    pub max_tokens: Option<i64>,
    #[serde(default, deserialize_with = "number::opt_int")]
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    #[serde(default, deserialize_with = "number::opt_int")]
    pub best_of: Option<i64>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// OpenAI's default `max_tokens` for legacy completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

impl CompletionRequest {
    /// The single prompt; batches of prompts are refused with a 400.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        let prompt = match &self.prompt {
            PromptField::Text(t) => Prompt::Text(t.clone()),
            PromptField::Tokens(t) => Prompt::Tokens(t.clone()),
            PromptField::Texts(v) if v.len() == 1 => Prompt::Text(v[0].clone()),
            PromptField::TokenLists(v) if v.len() == 1 => Prompt::Tokens(v[0].clone()),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "exactly one prompt per request is supported",
                ))
            }
        };
        match &prompt {
            Prompt::Text(t) if t.is_empty() => {
                Err(ApiError::invalid("prompt", "`prompt` must not be empty"))
            }
            Prompt::Tokens(t) if t.is_empty() => {
                Err(ApiError::invalid("prompt", "`prompt` must not be empty"))
            }
            _ => Ok(prompt),
        }
    }

    /// `max_tokens`, defaulting to 16 as OpenAI does.
    pub fn max_tokens(&self) -> Result<usize, ApiError> {
        Ok(validate_max_tokens("max_tokens", self.max_tokens)?
            .unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS))
    }

    /// Alternatives per token (`logprobs`, 0–5 in OpenAI's API; we allow up to 20).
    pub fn top_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            None => Ok(None),
            Some(n) if (0..=20).contains(&n) => Ok(Some(n as usize)),
            Some(n) => Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be between 0 and 20, got {n}"),
            )),
        }
    }

    /// Refuses options this server does not implement rather than ignoring them.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid(
                "best_of",
                "only best_of = 1 is supported",
            ));
        }
        Ok(())
    }
}

/// `choices[].logprobs` of a text completion.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

/// One choice of a text completion (streamed or not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<String>,
}

/// A text completion (`text_completion`), also the shape of each streamed chunk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> CompletionRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(
            req(r#"{"model":"m","prompt":"hi"}"#).prompt().unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            req(r#"{"model":"m","prompt":[1,2]}"#).prompt().unwrap(),
            Prompt::Tokens(vec![1, 2])
        );
        assert_eq!(
            req(r#"{"model":"m","prompt":["hi"]}"#).prompt().unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            req(r#"{"model":"m","prompt":[1.0,2e0]}"#).prompt().unwrap(),
            Prompt::Tokens(vec![1, 2]),
            "integral floats are token ids"
        );
        assert_eq!(
            req(r#"{"model":"m","prompt":[[3.0]]}"#).prompt().unwrap(),
            Prompt::Tokens(vec![3])
        );
        assert!(req(r#"{"model":"m","prompt":["a","b"]}"#).prompt().is_err());
        assert!(req(r#"{"model":"m","prompt":""}"#).prompt().is_err());
    }

    #[test]
    fn defaults_and_limits() {
        assert_eq!(
            req(r#"{"model":"m","prompt":"x"}"#).max_tokens().unwrap(),
            16
        );
        assert!(req(r#"{"model":"m","prompt":"x","max_tokens":0}"#)
            .max_tokens()
            .is_err());
        assert!(req(r#"{"model":"m","prompt":"x","logprobs":30}"#)
            .top_logprobs()
            .is_err());
        assert!(req(r#"{"model":"m","prompt":"x","echo":true}"#)
            .check_unsupported()
            .is_err());
    }
}
