//! Response bodies of both completion endpoints, built from generated text: the whole
//! response (`chat.completion` / `text_completion`) and each streamed chunk.
//!
//! The runtime's direct server and the gateway render the same OpenAI shapes from different
//! event sources (engine events there, queue response events here); this module is the one
//! place that knows those shapes, so the two cannot drift apart. SSE framing is left to the
//! caller (`data: <json>`, then `data: [DONE]`).

use serde_json::Value;

use crate::chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChoiceLogprobs, TokenLogprob,
};
use crate::completion::{Completion, CompletionChoice, CompletionLogprobs};
use crate::usage::Usage;

/// Which OpenAI endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Endpoint {
    /// Prefix of response ids (`chatcmpl-...`, `cmpl-...`), as OpenAI spells them.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }
    }

    /// Stable name (`chat`, `completion`).
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completion => "completion",
        }
    }

    /// Parses [`Endpoint::as_str`] output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "chat" => Some(Endpoint::Chat),
            "completion" => Some(Endpoint::Completion),
            _ => None,
        }
    }
}

/// Log-probabilities of a piece of text, in the endpoint's own shape.
#[derive(Debug, Clone, PartialEq)]
pub enum PieceLogprobs {
    /// Chat: one entry per token.
    Chat(Vec<TokenLogprob>),
    /// Legacy completions: parallel arrays.
    Completion(CompletionLogprobs),
}

impl PieceLogprobs {
    /// `tokens` (rendered once, in the chat shape) in `endpoint`'s shape. `text_offset` is
    /// the completion text's length before these tokens: legacy completions report each
    /// token's offset, counted over the token pieces that precede it.
    pub fn new(endpoint: Endpoint, tokens: Vec<TokenLogprob>, text_offset: usize) -> Self {
        match endpoint {
            Endpoint::Chat => PieceLogprobs::Chat(tokens),
            Endpoint::Completion => {
                let mut lp = CompletionLogprobs::default();
                let mut at = text_offset;
                for t in tokens {
                    lp.text_offset.push(at);
                    at += t.token.len();
                    lp.token_logprobs.push(t.logprob);
                    lp.top_logprobs.push(
                        t.top_logprobs
                            .into_iter()
                            .map(|a| (a.token, a.logprob))
                            .collect(),
                    );
                    lp.tokens.push(t.token);
                }
                PieceLogprobs::Completion(lp)
            }
        }
    }
}

/// What every body of one response shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseMeta {
    /// Response id (`chatcmpl-...`).
    pub id: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// Model name as the client sent it.
    pub model: String,
    /// Endpoint.
    pub endpoint: Endpoint,
}

fn split(lp: Option<PieceLogprobs>) -> (Option<ChoiceLogprobs>, Option<CompletionLogprobs>) {
    match lp {
        Some(PieceLogprobs::Chat(c)) => (Some(ChoiceLogprobs { content: c }), None),
        Some(PieceLogprobs::Completion(c)) => (None, Some(c)),
        None => (None, None),
    }
}

fn to_value<T: serde::Serialize>(v: T) -> Value {
    // These types serialise infallibly (no maps with non-string keys, no failing impls).
    serde_json::to_value(v).unwrap_or_default()
}

impl ResponseMeta {
    /// Metadata of a response to `endpoint` with id `{prefix}-{suffix}`.
    pub fn new(endpoint: Endpoint, suffix: &str, created: u64, model: impl Into<String>) -> Self {
        ResponseMeta {
            id: format!("{}-{suffix}", endpoint.id_prefix()),
            created,
            model: model.into(),
            endpoint,
        }
    }

    /// The non-streamed response.
    pub fn whole(
        &self,
        text: String,
        logprobs: Option<PieceLogprobs>,
        finish_reason: &str,
        usage: Usage,
    ) -> Value {
        let (chat_lp, completion_lp) = split(logprobs);
        match self.endpoint {
            Endpoint::Chat => to_value(ChatCompletion {
                id: self.id.clone(),
                object: "chat.completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: "assistant".into(),
                        content: text,
                    },
                    logprobs: chat_lp,
                    finish_reason: Some(finish_reason.to_owned()),
                }],
                usage,
            }),
            Endpoint::Completion => to_value(Completion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: completion_lp,
                    finish_reason: Some(finish_reason.to_owned()),
                }],
                usage: Some(usage),
            }),
        }
    }

    /// The chunk that opens a chat stream (assistant role, empty content); `None` for
    /// legacy completions, whose streams have no such chunk.
    pub fn role_chunk(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            self.chat_chunk(
                vec![ChatChunkChoice {
                    index: 0,
                    delta: ChatDelta {
                        role: Some("assistant".into()),
                        content: Some(String::new()),
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )
        })
    }

    /// A chunk with newly generated text.
    pub fn delta_chunk(&self, text: String, logprobs: Option<PieceLogprobs>) -> Value {
        self.choice_chunk(Some(text), logprobs, None)
    }

    /// The chunk that ends the choice with `finish_reason` (no text).
    pub fn finish_chunk(&self, finish_reason: &str) -> Value {
        self.choice_chunk(None, None, Some(finish_reason.to_owned()))
    }

    /// The closing chunk of `stream_options.include_usage`: no choices, only usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        match self.endpoint {
            Endpoint::Chat => self.chat_chunk(vec![], Some(usage)),
            Endpoint::Completion => self.completion_chunk(vec![], Some(usage)),
        }
    }

    fn choice_chunk(
        &self,
        text: Option<String>,
        logprobs: Option<PieceLogprobs>,
        finish: Option<String>,
    ) -> Value {
        let (chat_lp, completion_lp) = split(logprobs);
        match self.endpoint {
            Endpoint::Chat => self.chat_chunk(
                vec![ChatChunkChoice {
                    index: 0,
                    delta: ChatDelta {
                        role: None,
                        content: text,
                    },
                    logprobs: chat_lp,
                    finish_reason: finish,
                }],
                None,
            ),
            Endpoint::Completion => self.completion_chunk(
                vec![CompletionChoice {
                    index: 0,
                    text: text.unwrap_or_default(),
                    logprobs: completion_lp,
                    finish_reason: finish,
                }],
                None,
            ),
        }
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Value {
        to_value(ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Value {
        to_value(Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: Endpoint) -> ResponseMeta {
        ResponseMeta::new(endpoint, "abc", 7, "m")
    }

    #[test]
    fn endpoint_names_round_trip() {
        for e in [Endpoint::Chat, Endpoint::Completion] {
            assert_eq!(Endpoint::parse(e.as_str()), Some(e));
        }
        assert_eq!(Endpoint::parse("embeddings"), None);
        assert_eq!(meta(Endpoint::Chat).id, "chatcmpl-abc");
        assert_eq!(meta(Endpoint::Completion).id, "cmpl-abc");
    }

    #[test]
    fn whole_chat_response() {
        let v = meta(Endpoint::Chat).whole("hi".into(), None, "stop", Usage::new(3, 1, 2));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert!(v["choices"][0]["logprobs"].is_null());
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }

    #[test]
    fn whole_completion_response() {
        let v = meta(Endpoint::Completion).whole("hi".into(), None, "length", Usage::new(1, 0, 1));
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "hi");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 1);
    }

    #[test]
    fn chat_stream_chunks() {
        let m = meta(Endpoint::Chat);
        let role = m.role_chunk().unwrap();
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(role["choices"][0]["delta"]["content"], "");
        assert!(role.get("usage").is_none());
        let d = m.delta_chunk("x".into(), None);
        assert_eq!(d["choices"][0]["delta"]["content"], "x");
        assert!(d["choices"][0]["delta"].get("role").is_none());
        assert!(d["choices"][0]["finish_reason"].is_null());
        let f = m.finish_chunk("stop");
        assert_eq!(f["choices"][0]["finish_reason"], "stop");
        assert!(f["choices"][0]["delta"].get("content").is_none());
        let u = m.usage_chunk(Usage::new(2, 0, 3));
        assert_eq!(u["choices"].as_array().unwrap().len(), 0);
        assert_eq!(u["usage"]["total_tokens"], 5);
    }

    #[test]
    fn completion_stream_chunks() {
        let m = meta(Endpoint::Completion);
        assert!(m.role_chunk().is_none());
        let d = m.delta_chunk("x".into(), None);
        assert_eq!(d["object"], "text_completion");
        assert_eq!(d["choices"][0]["text"], "x");
        assert!(d.get("usage").is_none());
        let f = m.finish_chunk("length");
        assert_eq!(f["choices"][0]["text"], "");
        assert_eq!(f["choices"][0]["finish_reason"], "length");
        let u = m.usage_chunk(Usage::new(2, 0, 3));
        assert_eq!(u["choices"].as_array().unwrap().len(), 0);
        assert_eq!(u["usage"]["prompt_tokens"], 2);
    }

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob {
            token: text.into(),
            logprob,
            bytes: text.as_bytes().to_vec(),
            top_logprobs: top
                .iter()
                .map(|&(t, logprob)| crate::chat::TopLogprob {
                    token: t.into(),
                    logprob,
                    bytes: t.as_bytes().to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn completion_logprobs_count_offsets_over_token_pieces() {
        let tokens = vec![
            token(" Par", -0.1, &[(" Par", -0.1), (" the", -2.5)]),
            token("is", -0.01, &[("is", -0.01)]),
        ];
        let PieceLogprobs::Completion(lp) = PieceLogprobs::new(Endpoint::Completion, tokens, 5)
        else {
            panic!("a completion request gets the completion shape");
        };
        assert_eq!(lp.tokens, [" Par", "is"]);
        assert_eq!(lp.token_logprobs, [-0.1, -0.01]);
        assert_eq!(lp.text_offset, [5, 9]);
        assert_eq!(lp.top_logprobs[0].len(), 2);
        assert_eq!(lp.top_logprobs[0][" the"], -2.5);
        assert_eq!(lp.top_logprobs[1]["is"], -0.01);
        let chat = vec![token("x", -0.5, &[])];
        assert_eq!(
            PieceLogprobs::new(Endpoint::Chat, chat.clone(), 5),
            PieceLogprobs::Chat(chat)
        );
    }

    #[test]
    fn logprobs_land_in_the_endpoint_shape() {
        let lp = PieceLogprobs::Chat(vec![TokenLogprob {
            token: "x".into(),
            logprob: -0.5,
            bytes: vec![b'x'],
            top_logprobs: vec![],
        }]);
        let d = meta(Endpoint::Chat).delta_chunk("x".into(), Some(lp));
        assert_eq!(d["choices"][0]["logprobs"]["content"][0]["token"], "x");
        let lp = PieceLogprobs::Completion(CompletionLogprobs {
            tokens: vec!["x".into()],
            token_logprobs: vec![-0.5],
            top_logprobs: vec![],
            text_offset: vec![0],
        });
        let d = meta(Endpoint::Completion).delta_chunk("x".into(), Some(lp));
        assert_eq!(d["choices"][0]["logprobs"]["tokens"][0], "x");
    }
}
