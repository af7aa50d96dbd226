//! Engine log-probabilities (token ids) → the protocol's token entries (token text and
//! bytes), rendered once with the model's tokenizer. The direct server and the worker both
//! use this; the endpoint's own shape is then made by
//! [`tidal_protocol::render::PieceLogprobs::new`], here or in the gateway.

use tidal_protocol::chat::{TokenLogprob as RenderedLogprob, TopLogprob};
use tidal_tokenizer::Tokenizer;

use crate::engine::TokenLogprob;

fn piece(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer
        .token_to_piece(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// One entry per token with its alternatives, most likely first.
pub fn render(tokenizer: &Tokenizer, items: &[TokenLogprob]) -> Vec<RenderedLogprob> {
    items
        .iter()
        .map(|lp| {
            let (token, bytes) = piece(tokenizer, lp.token);
            RenderedLogprob {
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
