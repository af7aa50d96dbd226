//! `/v1/completions` bodies.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::number::{self, Int};
use crate::params::{validate_max_tokens, SamplingFields};
use crate::usage::Usage;

/// `prompt`: text, token ids, or a one-element list of either; never empty.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(untagged)]
pub enum PromptField {
    Text(#[schemars(length(min = 1))] String),
    Tokens(
        #[serde(deserialize_with = "number::int_list")]
        #[schemars(with = "Vec<Int<u32>>", length(min = 1))]
        Vec<u32>,
    ),
    Texts(#[schemars(length(equal = 1), inner(length(min = 1)))] Vec<String>),
    TokenLists(
        #[serde(deserialize_with = "number::int_lists")]
        #[schemars(with = "Vec<Vec<Int<u32>>>", length(equal = 1), inner(length(min = 1)))]
        Vec<Vec<u32>>,
    ),
}

/// A prompt after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The request body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
pub struct CompletionRequest {
    /// The model's id (`/v1/models`).
    #[schemars(length(min = 1))]
    pub model: String,
    /// The one prompt.
    pub prompt: PromptField,
    /// Most tokens to generate.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 1), extend("default" = 16))]
    pub max_tokens: Option<i64>,
    /// Return log-probabilities of each token and this many alternatives.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 0, max = 20))]
    pub logprobs: Option<i64>,
    /// Not supported: only `false`.
    #[schemars(extend("enum" = [false, null]))]
    pub echo: Option<bool>,
    /// Not supported: only empty.
    #[schemars(length(max = 0))]
    pub suffix: Option<String>,
    /// Only 1.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 1, max = 1))]
    pub best_of: Option<i64>,
    /// Sampling and stopping.
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

/// `choices[].logprobs` of a text completion: present when the request set `logprobs`; in
/// a stream, each chunk carries its own tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct CompletionLogprobs {
    /// Each generated token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    #[schemars(inner(range(max = 0)))]
    pub token_logprobs: Vec<f32>,
    /// Each token's most likely alternatives, by text.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Byte offset of each token in the completion text (also across chunks and after a
    /// reattach).
    pub text_offset: Vec<usize>,
}

/// One choice of a text completion (streamed or not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct CompletionChoice {
    /// Always 0 (one choice per request).
    pub index: u32,
    /// The generated text (of this chunk, in a stream).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation stopped (`stop` or `length`); `null` in a stream's chunks before the
    /// last.
    #[schemars(extend("enum" = ["stop", "length", null]))]
    pub finish_reason: Option<String>,
}

/// A text completion (`text_completion`), also the shape of each streamed chunk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Completion {
    /// `cmpl-` and the request id without dashes.
    pub id: String,
    /// Always `text_completion`.
    #[schemars(extend("const" = "text_completion"))]
    pub object: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// The model, as the request named it.
    pub model: String,
    /// The one choice, or none in a stream's closing usage chunk.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (in a stream, only in its closing chunk, with
    /// `stream_options.include_usage`).
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
