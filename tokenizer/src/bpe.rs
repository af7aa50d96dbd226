//! Byte-level BPE: rank-ordered merges over the UTF-8 characters of each pre-tokenized,
//! byte-encoded word.
//!
//! Follows llama.cpp's `llm_tokenizer_bpe_session::tokenize`: a priority queue of adjacent
//! pairs ordered by merge rank then position, stale pairs skipped, and for a final symbol that
//! is not a token, its single-byte pieces. Strings are interned so that merging compares ids;
//! finished words are cached because natural text repeats words constantly.

use crate::pretokenize::{byte_encode, PreTokenizer};
use crate::vocab::Vocab;
use ahash::AHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

/// Words longer than this (in bytes) are not cached: they are rare and would bloat the cache.
const MAX_CACHED_WORD: usize = 64;
/// The cache is cleared when it holds this many words, bounding memory on adversarial input.
const MAX_CACHE_ENTRIES: usize = 1 << 16;

/// A BPE model: interned strings, merge ranks and a word cache.
#[derive(Debug)]
pub(crate) struct Bpe {
    pre: PreTokenizer,
    /// Every token text (id = token id) plus merge parts and results that are not tokens
    /// (ids from `n_vocab` up).
    intern: AHashMap<String, u32>,
    n_vocab: u32,
    /// (left, right) -> (rank, merged).
    ranks: AHashMap<(u32, u32), (u32, u32)>,
    ignore_merges: bool,
    cache: Mutex<AHashMap<String, Vec<u32>>>,
}

/// A mergeable adjacent pair: (rank, left index, right index, left id, right id).
type Candidate = (u32, usize, usize, u32, u32);

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    /// Interned id of the symbol's text; `None` when the text occurs in no token or merge.
    id: Option<u32>,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Bpe {
    /// Builds the merge table from the vocabulary.
    pub fn new(vocab: &Vocab, merges: &[(String, String)], pre: PreTokenizer) -> Self {
        let mut intern = vocab.token_to_id.clone();
        let n_vocab = vocab.tokens.len() as u32;
        let mut next_id = n_vocab;
        let mut id_of = |s: &str, intern: &mut AHashMap<String, u32>| -> u32 {
            if let Some(&id) = intern.get(s) {
                return id;
            }
            intern.insert(s.to_string(), next_id);
            next_id += 1;
            next_id - 1
        };
        let mut ranks = AHashMap::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            if a.is_empty() || b.is_empty() {
                continue;
            }
            let l = id_of(a, &mut intern);
            let r = id_of(b, &mut intern);
            let m = id_of(&format!("{a}{b}"), &mut intern);
            // The first occurrence of a pair keeps its rank (llama.cpp's `emplace`).
            ranks.entry((l, r)).or_insert((rank as u32, m));
        }
        Self {
            pre,
            intern,
            n_vocab,
            ranks,
            ignore_merges: pre.ignores_merges(),
            cache: Mutex::new(AHashMap::new()),
        }
    }

    /// Encodes raw text (no special tokens in it) and appends the ids to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        for piece in self.pre.split(text) {
            word.clear();
            byte_encode(piece, &mut word);
            self.encode_word(&word, out);
        }
    }

    fn encode_word(&self, word: &str, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(&id) = self.intern.get(word).filter(|&&id| id < self.n_vocab) {
                out.push(id);
                return;
            }
        }
        let cacheable = word.len() <= MAX_CACHED_WORD;
        if cacheable {
            if let Ok(cache) = self.cache.lock() {
                if let Some(ids) = cache.get(word) {
                    out.extend_from_slice(ids);
                    return;
                }
            }
        }
        let start = out.len();
        self.merge_word(word, out);
        if cacheable {
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= MAX_CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(word.to_string(), out[start..].to_vec());
            }
        }
    }

    fn merge_word(&self, word: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let mut buf = [0u8; 4];
        for (i, (start, c)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                id: self.intern.get(&*c.encode_utf8(&mut buf)).copied(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = None;
        }
        // Min-heap on (rank, left position); the ids detect pairs made stale by other merges.
        let mut queue: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, symbols: &[Symbol], l: usize, r: usize| {
            if let (Some(a), Some(b)) = (symbols[l].id, symbols[r].id) {
                if let Some(&(rank, _)) = self.ranks.get(&(a, b)) {
                    queue.push(Reverse((rank, l, r, a, b)));
                }
            }
        };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, i - 1, i);
        }
        while let Some(Reverse((_, l, r, a, b))) = queue.pop() {
            let (left, right) = (symbols[l], symbols[r]);
            if left.len == 0 || right.len == 0 || left.id != Some(a) || right.id != Some(b) {
                continue;
            }
            let Some(&(_, merged)) = self.ranks.get(&(a, b)) else {
                continue;
            };
            symbols[l].len += right.len;
            symbols[l].id = Some(merged);
            symbols[l].next = right.next;
            symbols[r].len = 0;
            if let Some(n) = right.next {
                symbols[n].prev = Some(l);
            }
            if let Some(p) = symbols[l].prev {
                push(&mut queue, &symbols, p, l);
            }
            if let Some(n) = symbols[l].next {
                push(&mut queue, &symbols, l, n);
            }
        }
        for s in symbols.iter().filter(|s| s.len > 0) {
            match s.id.filter(|&id| id < self.n_vocab) {
                Some(id) => out.push(id),
                None => {
                    // Not a token: llama.cpp looks up each byte alone (only ASCII can match).
                    let text = &word[s.start..s.start + s.len];
                    for b in text.bytes().filter(u8::is_ascii) {
                        let byte = [b];
                        if let Some(&id) = std::str::from_utf8(&byte)
                            .ok()
                            .and_then(|t| self.intern.get(t))
                            .filter(|&&id| id < self.n_vocab)
                        {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }
}
