//! Splitting text at special-token texts before tokenization.
//!
//! Follows llama.cpp's `tokenizer_st_partition`: special tokens are tried longest first; each
//! one splits every remaining raw-text fragment at all its occurrences, left to right.
//! User-defined tokens always split; control and unknown tokens only when `parse_special`.

use crate::vocab::{attr, Vocab};

/// A piece of the input: raw text to tokenize, or a special token matched in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Partitions `text` into raw-text fragments and special tokens.
pub(crate) fn partition<'a>(
    vocab: &Vocab,
    text: &'a str,
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut frags = vec![Fragment::Text(text)];
    if text.is_empty() {
        return Vec::new();
    }
    for &id in &vocab.specials {
        let a = vocab.attrs[id as usize];
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.tokens[id as usize].as_str();
        // Cheap pre-check: most special tokens never occur in a given prompt.
        if !frags
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
        {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            match f {
                Fragment::Text(t) => {
                    let mut rest = t;
                    while let Some(pos) = rest.find(needle) {
                        if pos > 0 {
                            next.push(Fragment::Text(&rest[..pos]));
                        }
                        next.push(Fragment::Token(id));
                        rest = &rest[pos + needle.len()..];
                    }
                    if !rest.is_empty() {
                        next.push(Fragment::Text(rest));
                    }
                }
                token => next.push(token),
            }
        }
        frags = next;
    }
    frags
}
