//! Engine log-probabilities → the chat and completion JSON shapes.

use std::collections::BTreeMap;

use tidal_protocol::chat::{TokenLogprob as ChatTokenLogprob, TopLogprob};
use tidal_protocol::completion::CompletionLogprobs;
use tidal_tokenizer::Tokenizer;

use crate::engine::TokenLogprob;

fn piece(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer
        .token_to_piece(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat format: one entry per token with its alternatives.
pub fn chat(tokenizer: &Tokenizer, items: &[TokenLogprob]) -> Vec<ChatTokenLogprob> {
    items
        .iter()
        .map(|lp| {
            let (token, bytes) = piece(tokenizer, lp.token);
            ChatTokenLogprob {
                token,
                logprob: lp.logprob,
                bytes,
                top_logprobs: lp
                    .top
                    .iter()
                    .map(|&(id, logprob)| {
                        let (token, bytes) = piece(tokenizer, id);
                        TopLogprob {
                            token,
                            logprob,
                            bytes,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Legacy completions format; `offset` is the text length before these tokens.
pub fn completion(
    tokenizer: &Tokenizer,
    items: &[TokenLogprob],
    offset: usize,
    into: &mut CompletionLogprobs,
) {
    let mut at = offset;
    for lp in items {
        let (token, _) = piece(tokenizer, lp.token);
        into.text_offset.push(at);
        at += token.len();
        into.tokens.push(token);
        into.token_logprobs.push(lp.logprob);
        into.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(id, logprob)| (piece(tokenizer, id).0, logprob))
                .collect::<BTreeMap<_, _>>(),
        );
    }
}
