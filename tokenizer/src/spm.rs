//! SentencePiece (BPE-by-score) tokenization with byte fallback.
//!
//! Follows llama.cpp's `llm_tokenizer_spm_session`: start from UTF-8 characters, repeatedly
//! merge the adjacent pair whose concatenation is the highest-scoring token (leftmost on ties),
//! then emit each final symbol as its token or, failing that, as `<0xNN>` byte tokens.

use crate::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Encodes `text` (already space-escaped with `▁`) and appends the ids to `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: Some(i + 1),
        });
    }
    let Some(last) = symbols.last_mut() else {
        return;
    };
    last.next = None;

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: usize, r: usize| {
        let (a, b) = (symbols[l], symbols[r]);
        let piece = &text[a.start..a.start + a.len + b.len];
        if let Some(&id) = vocab.token_to_id.get(piece) {
            queue.push(Bigram {
                score: vocab.scores[id as usize],
                left: l,
                right: r,
                len: piece.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(bg) = queue.pop() {
        let (l, r) = (symbols[bg.left], symbols[bg.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.len {
            continue;
        }
        symbols[bg.left].len += r.len;
        symbols[bg.right].len = 0;
        symbols[bg.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(bg.left);
        }
        if let Some(p) = l.prev {
            try_add(&mut queue, &symbols, p, bg.left);
        }
        if let Some(n) = r.next {
            try_add(&mut queue, &symbols, bg.left, n);
        }
    }

    // Every merged symbol is a token by construction, so llama.cpp's `rev_merge` re-split never
    // applies: a final symbol is a token or a single character that falls back to bytes.
    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        let piece = &text[s.start..s.start + s.len];
        match vocab.token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for b in piece.bytes() {
                    if let Some(id) = byte_token(vocab, b) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

/// The token for one raw byte: `<0xNN>`, else the byte itself as a token, else `<unk>`.
pub(crate) fn byte_token(vocab: &Vocab, b: u8) -> Option<u32> {
    let hex = format!("<0x{b:02X}>");
    vocab
        .token_to_id
        .get(&hex)
        .or_else(|| {
            let one = [b];
            std::str::from_utf8(&one)
                .ok()
                .and_then(|s| vocab.token_to_id.get(s))
        })
        .copied()
        .or(vocab.unk)
}
