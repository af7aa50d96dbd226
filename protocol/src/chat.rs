//! `/v1/chat/completions` bodies.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::number::{self, Int};
use crate::params::{validate_max_tokens, SamplingFields};
use crate::usage::Usage;

/// Message content: a string, or a list of parts of which only text is supported.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
pub struct ContentPart {
    /// The part's type; only `text` is supported (400 otherwise).
    #[serde(rename = "type")]
    #[schemars(extend("const" = "text"))]
    pub kind: String,
    /// The text of a `text` part (which needs one).
    // Required in the schema: serde reads it missing as `None`, which validation refuses.
    #[schemars(required)]
    pub text: Option<String>,
}

/// A request message.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
pub struct ChatMessage {
    /// Who speaks.
    #[schemars(extend("enum" = ROLES))]
    pub role: String,
    /// Absent or `null`: empty.
    #[serde(default)]
    pub content: Option<MessageContent>,
}

/// The request body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[schemars(extend(
    // `top_logprobs` needs `logprobs: true` (a 400 otherwise).
    "if" = {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
    "then" = {"required": ["logprobs"], "properties": {"logprobs": {"const": true}}}
))]
pub struct ChatCompletionRequest {
    /// The model's id (`/v1/models`).
    #[schemars(length(min = 1))]
    pub model: String,
    /// The conversation so far.
    #[schemars(length(min = 1))]
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate (default: up to the context length).
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 1))]
    pub max_tokens: Option<i64>,
    /// OpenAI's newer name of `max_tokens`; wins over it.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 1))]
    pub max_completion_tokens: Option<i64>,
    /// Return the log-probability of each generated token.
    #[schemars(extend("default" = false))]
    pub logprobs: Option<bool>,
    /// Alternatives per token; needs `logprobs: true` (400 otherwise).
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 0, max = 20))]
    pub top_logprobs: Option<i64>,
    /// Sampling and stopping.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A message reduced to what chat templates take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TextMessage {
    pub role: String,
    pub content: String,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatCompletionRequest {
    /// Messages as plain text, after checking roles and content.
    pub fn text_messages(&self) -> Result<Vec<TextMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must contain at least one message",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                if !ROLES.contains(&m.role.as_str()) {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!("unknown role `{}` (expected one of {})", m.role, ROLES.join(", ")),
                    ));
                }
                let content = match &m.content {
                    None => String::new(),
                    Some(MessageContent::Text(t)) => t.clone(),
                    Some(MessageContent::Parts(parts)) => {
                        let mut text = String::new();
                        for (j, p) in parts.iter().enumerate() {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                (kind, _) => {
                                    return Err(ApiError::invalid(
                                        format!("messages[{i}].content[{j}]"),
                                        format!("content part of type `{kind}` is not supported (only text)"),
                                    ))
                                }
                            }
                        }
                        text
                    }
                };
                Ok(TextMessage { role: m.role.clone(), content })
            })
            .collect()
    }

    /// `max_completion_tokens` (newer name) or `max_tokens`.
    pub fn max_tokens(&self) -> Result<Option<usize>, ApiError> {
        match self.max_completion_tokens {
            Some(_) => validate_max_tokens("max_completion_tokens", self.max_completion_tokens),
            None => validate_max_tokens("max_tokens", self.max_tokens),
        }
    }

    /// Alternatives per token when `logprobs` is on (0–20).
    pub fn top_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            )),
            (true, None) => Ok(Some(0)),
            (true, Some(n)) if (0..=20).contains(&n) => Ok(Some(n as usize)),
            (true, Some(n)) => Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and 20, got {n}"),
            )),
        }
    }
}

/// One alternative token in chat log-probabilities.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Natural log of its probability.
    #[schemars(range(max = 0))]
    pub logprob: f32,
    /// The token's UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

/// Log-probability of one generated token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Natural log of the token's probability under the model's raw distribution (before
    /// temperature and filters).
    #[schemars(range(max = 0))]
    pub logprob: f32,
    /// The token's UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
    /// The `top_logprobs` most likely tokens, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs`: present when the request set `logprobs: true`; in a stream, each
/// chunk carries the entries of its own tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChoiceLogprobs {
    /// One entry per generated token.
    pub content: Vec<TokenLogprob>,
}

/// The assistant's reply.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    #[schemars(extend("const" = "assistant"))]
    pub role: String,
    /// The generated text.
    pub content: String,
}

/// One choice of a non-streamed response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChatChoice {
    /// Always 0 (one choice per request).
    pub index: u32,
    /// The reply.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChoiceLogprobs>,
    /// Why generation stopped: a stop sequence or end of text (`stop`), or `max_tokens` or
    /// the context length (`length`).
    #[schemars(extend("enum" = ["stop", "length", null]))]
    pub finish_reason: Option<String>,
}

/// The non-streamed response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-` and the request id without dashes.
    pub id: String,
    /// Always `chat.completion`.
    #[schemars(extend("const" = "chat.completion"))]
    pub object: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// The model, as the request named it.
    pub model: String,
    /// The one choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// The incremental part of a streamed chunk.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChatDelta {
    /// `assistant`, in the stream's first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("const" = "assistant"))]
    pub role: Option<String>,
    /// Newly generated text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a streamed chunk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChatChunkChoice {
    /// Always 0.
    pub index: u32,
    /// What this chunk adds.
    pub delta: ChatDelta,
    /// Log-probabilities of this chunk's tokens, when asked for.
    pub logprobs: Option<ChoiceLogprobs>,
    /// `stop` or `length` on the choice's last chunk, else `null`.
    #[schemars(extend("enum" = ["stop", "length", null]))]
    pub finish_reason: Option<String>,
}

/// A streamed chunk (`chat.completion.chunk`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ChatCompletionChunk {
    /// The same for every chunk of a response.
    pub id: String,
    /// Always `chat.completion.chunk`.
    #[schemars(extend("const" = "chat.completion.chunk"))]
    pub object: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// The model, as the request named it.
    pub model: String,
    /// One choice, or none in the closing usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// Only on the final chunk, and only with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> ChatCompletionRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn empty_messages_rejected() {
        let err = req(r#"{"model":"m","messages":[]}"#)
            .text_messages()
            .unwrap_err();
        assert_eq!((err.status, err.param.as_deref()), (400, Some("messages")));
    }

    #[test]
    fn unknown_role_and_image_parts_rejected() {
        let err = req(r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#)
            .text_messages()
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].role"));
        let err =
            req(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
                .text_messages()
                .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[0]"));
    }

    #[test]
    fn text_parts_are_joined() {
        let m = req(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#)
            .text_messages()
            .unwrap();
        assert_eq!(m[0].content, "ab");
    }

    #[test]
    fn max_completion_tokens_wins_and_is_validated() {
        let r = req(r#"{"model":"m","messages":[],"max_tokens":5,"max_completion_tokens":7}"#);
        assert_eq!(r.max_tokens().unwrap(), Some(7));
        let r = req(r#"{"model":"m","messages":[],"max_tokens":0}"#);
        assert_eq!(
            r.max_tokens().unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
    }

    #[test]
    fn top_logprobs_needs_logprobs() {
        assert_eq!(
            req(r#"{"model":"m","messages":[],"logprobs":true,"top_logprobs":3}"#)
                .top_logprobs()
                .unwrap(),
            Some(3)
        );
        assert!(req(r#"{"model":"m","messages":[],"top_logprobs":3}"#)
            .top_logprobs()
            .is_err());
        assert!(
            req(r#"{"model":"m","messages":[],"logprobs":true,"top_logprobs":21}"#)
                .top_logprobs()
                .is_err()
        );
    }
}
