//! BPE pre-tokenizers: split text into words before merging.
//!
//! Follows llama.cpp's `unicode.cpp`: the hand-written splitters
//! `unicode_regex_split_custom_gpt2` / `_llama3` / `_qwen2` and, for the simple
//! `std::regex` passes (`\p{N}`, `\p{N}+`, `[\p{P}$+<=>^~|]+`, `[0-9][0-9][0-9]`),
//! a leftmost scan with the same "unmatched text is kept as its own piece" rule.
//! Character classes use llama.cpp's definitions: `\p{L}`/`\p{N}`/`\p{P}` are Unicode general
//! category groups, `\s` is the Unicode `White_Space` property.

use std::ops::Range;
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;
const PUNCT: u8 = 8;
/// Set for every code point inside the current piece: llama.cpp's `flags.as_uint() != 0`.
const IN_RANGE: u8 = 0x80;

/// A BPE pre-tokenizer (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback: punctuation runs, GPT-2 regex, number runs, digit triples.
    Default,
    /// GPT-2's regex.
    Gpt2,
    /// Llama 3's regex (numbers in groups of up to three).
    Llama3,
    /// Qwen2's regex (Llama 3's with single digits).
    Qwen2,
    /// SmolLM / StarCoder: every digit alone, then GPT-2's regex.
    Smollm,
}

impl PreTokenizer {
    /// Maps `tokenizer.ggml.pre` to a pre-tokenizer, with the llama.cpp aliases that use the
    /// same regexes and no other vocabulary flags; `None` if unknown.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "" | "default" => Self::Default,
            "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" => {
                Self::Gpt2
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => Self::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan" => {
                Self::Qwen2
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Self::Smollm,
            _ => return None,
        })
    }

    /// Whether llama.cpp sets `ignore_merges` for this pre-tokenizer (whole words that are
    /// tokens skip BPE).
    pub fn ignores_merges(self) -> bool {
        matches!(self, Self::Llama3)
    }

    /// Splits `text` into words (sub-slices of `text`, in order, covering it exactly).
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut starts: Vec<usize> = Vec::with_capacity(text.len() + 1);
        let mut flags: Vec<u8> = Vec::with_capacity(text.len());
        let mut cpts: Vec<char> = Vec::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            starts.push(i);
            cpts.push(c);
            flags.push(char_flags(c) | IN_RANGE);
        }
        starts.push(text.len());
        let cx = Chars {
            cpts: &cpts,
            flags: &flags,
        };
        let all: [Range<usize>; 1] = [Range {
            start: 0,
            end: cpts.len(),
        }];
        let ranges = match self {
            Self::Gpt2 => cx.gpt2(&all),
            Self::Llama3 => cx.llama3(&all, 3),
            Self::Qwen2 => cx.llama3(&all, 1),
            Self::Smollm => {
                let digits = cx.scan(&all, |i, _| (cx.flags[i] & NUMBER != 0).then_some(1));
                cx.gpt2(&digits)
            }
            Self::Default => {
                let punct = cx.scan(&all, |i, end| {
                    let run = (i..end)
                        .take_while(|&j| {
                            cx.flags[j] & PUNCT != 0 || "$+<=>^~|".contains(cx.cpts[j])
                        })
                        .count();
                    (run > 0).then_some(run)
                });
                let words = cx.gpt2(&punct);
                let numbers = cx.scan(&words, |i, end| {
                    let run = (i..end).take_while(|&j| cx.flags[j] & NUMBER != 0).count();
                    (run > 0).then_some(run)
                });
                cx.scan(&numbers, |i, end| {
                    (i + 3 <= end && (i..i + 3).all(|j| cx.cpts[j].is_ascii_digit())).then_some(3)
                })
            }
        };
        ranges
            .into_iter()
            .map(|r| &text[starts[r.start]..starts[r.end]])
            .collect()
    }
}

/// llama.cpp's category flags for one code point.
fn char_flags(c: char) -> u8 {
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            LETTER
        } else if c.is_ascii_digit() {
            NUMBER
        } else if c.is_ascii_whitespace() || c == '\x0b' {
            SPACE
        } else if c.is_ascii_punctuation() && !"$+<=>^`|~".contains(c) {
            PUNCT
        } else {
            0
        };
    }
    let ws = if c.is_whitespace() { SPACE } else { 0 };
    ws | match c.general_category_group() {
        GeneralCategoryGroup::Letter => LETTER,
        GeneralCategoryGroup::Number => NUMBER,
        GeneralCategoryGroup::Punctuation => PUNCT,
        _ => 0,
    }
}

/// The code points of the text with their flags, and the splitters over them.
struct Chars<'a> {
    cpts: &'a [char],
    flags: &'a [u8],
}

/// Accumulates the pieces of one pass (llama.cpp's `_add_token`).
struct Pieces {
    out: Vec<Range<usize>>,
    prev_end: usize,
}

impl Pieces {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(self.prev_end..end);
        }
        self.prev_end = end;
        len
    }
}

impl Chars<'_> {
    /// Leftmost-match scan like `std::regex_iterator`: `matcher(i, end)` gives the length of a
    /// match at `i`; unmatched stretches between matches are kept as pieces.
    fn scan(
        &self,
        ranges: &[Range<usize>],
        matcher: impl Fn(usize, usize) -> Option<usize>,
    ) -> Vec<Range<usize>> {
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            let mut unmatched = r.start;
            let mut i = r.start;
            while i < r.end {
                match matcher(i, r.end) {
                    Some(len) => {
                        if i > unmatched {
                            out.push(unmatched..i);
                        }
                        out.push(i..i + len);
                        i += len;
                        unmatched = i;
                    }
                    None => i += 1,
                }
            }
            if unmatched < r.end {
                out.push(unmatched..r.end);
            }
        }
        out
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    fn gpt2(&self, ranges: &[Range<usize>]) -> Vec<Range<usize>> {
        let mut p = Pieces {
            out: Vec::with_capacity(ranges.len() * 2),
            prev_end: 0,
        };
        for r in ranges {
            let (ini, end) = (r.start, r.end);
            p.prev_end = ini;
            let cpt = |pos: usize| (pos < end).then(|| self.cpts[pos]);
            let flags = |pos: usize| if pos < end { self.flags[pos] } else { 0 };
            let mut pos = ini;
            while pos < end {
                let c = self.cpts[pos];
                let f = self.flags[pos];
                if c == '\'' && pos + 1 < end {
                    let n = self.cpts[pos + 1];
                    if matches!(n, 's' | 't' | 'm' | 'd') {
                        pos += p.add(pos + 2);
                        continue;
                    }
                    if pos + 2 < end {
                        let nn = self.cpts[pos + 2];
                        if matches!((n, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                            pos += p.add(pos + 3);
                            continue;
                        }
                    }
                }
                let space = usize::from(c == ' ');
                let mut f2 = if c == ' ' { flags(pos + 1) } else { f };
                if f2 & LETTER != 0 {
                    pos += space;
                    while f2 & LETTER != 0 {
                        pos += 1;
                        f2 = flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                if f2 & NUMBER != 0 {
                    pos += space;
                    while f2 & NUMBER != 0 {
                        pos += 1;
                        f2 = flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                if f2 & (SPACE | LETTER | NUMBER) == 0 && f2 != 0 {
                    pos += space;
                    while f2 & (SPACE | LETTER | NUMBER) == 0 && f2 != 0 {
                        pos += 1;
                        f2 = flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                let mut ws = 0;
                while flags(pos + ws) & SPACE != 0 {
                    ws += 1;
                }
                if ws > 1 && cpt(pos + ws).is_some() {
                    pos += ws - 1;
                    p.add(pos);
                    continue;
                }
                if ws > 0 {
                    pos += ws;
                    p.add(pos);
                    continue;
                }
                pos += 1;
                p.add(pos);
            }
        }
        p.out
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    fn llama3(&self, ranges: &[Range<usize>], max_digits: usize) -> Vec<Range<usize>> {
        let mut p = Pieces {
            out: Vec::with_capacity(ranges.len() * 2),
            prev_end: 0,
        };
        for r in ranges {
            let (ini, end) = (r.start, r.end);
            p.prev_end = ini;
            let cpt = |pos: usize| (pos < end).then(|| self.cpts[pos]);
            let flags = |pos: usize| if pos < end { self.flags[pos] } else { 0 };
            let mut pos = ini;
            while pos < end {
                let c = self.cpts[pos];
                let f = self.flags[pos];
                if c == '\'' && pos + 1 < end {
                    let n = self.cpts[pos + 1].to_ascii_lowercase();
                    if matches!(n, 's' | 't' | 'm' | 'd') {
                        pos += p.add(pos + 2);
                        continue;
                    }
                    if pos + 2 < end {
                        let nn = self.cpts[pos + 2].to_ascii_lowercase();
                        if matches!((n, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                            pos += p.add(pos + 3);
                            continue;
                        }
                    }
                }
                if !(c == '\r' || c == '\n' || f & NUMBER != 0)
                    && (f & LETTER != 0 || flags(pos + 1) & LETTER != 0)
                {
                    pos += 1;
                    while flags(pos) & LETTER != 0 {
                        pos += 1;
                    }
                    p.add(pos);
                    continue;
                }
                if f & NUMBER != 0 {
                    let mut start = pos;
                    while flags(pos) & NUMBER != 0 {
                        pos += 1;
                        if pos - start >= max_digits {
                            p.add(pos);
                            start = pos;
                        }
                    }
                    p.add(pos);
                    continue;
                }
                let mut f2 = if c == ' ' { flags(pos + 1) } else { f };
                if f2 & (SPACE | LETTER | NUMBER) == 0 && f != 0 {
                    pos += usize::from(c == ' ');
                    while f2 & (SPACE | LETTER | NUMBER) == 0 && f2 != 0 {
                        pos += 1;
                        f2 = flags(pos);
                    }
                    while matches!(cpt(pos), Some('\r' | '\n')) {
                        pos += 1;
                    }
                    p.add(pos);
                    continue;
                }
                let mut ws = 0;
                let mut last_newline_end = 0;
                while flags(pos + ws) & SPACE != 0 {
                    if matches!(self.cpts[pos + ws], '\r' | '\n') {
                        last_newline_end = pos + ws + 1;
                    }
                    ws += 1;
                }
                if last_newline_end > 0 {
                    pos = last_newline_end;
                    p.add(pos);
                    continue;
                }
                if ws > 1 && cpt(pos + ws).is_some() {
                    pos += ws - 1;
                    p.add(pos);
                    continue;
                }
                if ws > 0 {
                    pos += ws;
                    p.add(pos);
                    continue;
                }
                pos += 1;
                p.add(pos);
            }
        }
        p.out
    }
}

/// GPT-2's byte-to-unicode table: every byte maps to a printable code point.
pub fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut extra = 0u32;
        for b in 0..=255u8 {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            table[b as usize] = if printable {
                char::from(b)
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        table
    })
}

/// Appends the byte-level encoding of `word` to `out`.
pub(crate) fn byte_encode(word: &str, out: &mut String) {
    let table = byte_to_char_table();
    for b in word.bytes() {
        out.push(table[b as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, s: &str) -> Vec<&str> {
        p.split(s)
    }

    #[test]
    fn gpt2_splits_contractions_words_and_space_runs() {
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello'Ve world 123\n\n  foo"),
            ["Hello", "'", "Ve", " world", " 123", "\n\n ", " foo"]
        );
        assert_eq!(split(PreTokenizer::Gpt2, "it's  "), ["it", "'s", "  "]);
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines() {
        assert_eq!(
            split(PreTokenizer::Llama3, "Hello'Ve world 12345\n\n  foo"),
            ["Hello", "'Ve", " world", " ", "123", "45", "\n\n", " ", " foo"]
        );
    }

    #[test]
    fn qwen2_splits_every_digit() {
        assert_eq!(
            split(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn smollm_isolates_digits_then_applies_gpt2() {
        assert_eq!(
            split(PreTokenizer::Smollm, "ab 12c"),
            ["ab", " ", "1", "2", "c"]
        );
    }

    #[test]
    fn default_splits_punctuation_numbers_and_digit_triples() {
        assert_eq!(
            split(PreTokenizer::Default, "a+b 12345!"),
            ["a", "+", "b", " ", "123", "45", "!"]
        );
    }

    #[test]
    fn non_ascii_letters_and_spaces_use_unicode_classes() {
        // U+00A0 is White_Space; 'é' and '中' are letters; '…' is punctuation.
        assert_eq!(
            split(PreTokenizer::Gpt2, "é中\u{a0}x…"),
            ["é中", "\u{a0}", "x", "…"]
        );
    }

    #[test]
    fn pieces_cover_the_text_exactly() {
        let text = "  Hello,  world!\n\n\tÀ 1234 ünïcödé 🦙🦙 '' 'LL x\r\n";
        for p in [
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
            PreTokenizer::Smollm,
        ] {
            assert_eq!(p.split(text).concat(), text, "{p:?}");
        }
    }

    #[test]
    fn byte_table_is_a_bijection_onto_printable_chars() {
        let t = byte_to_char_table();
        let set: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
    }
}
