//! The public tokenizer: GGUF vocabulary + BPE or SentencePiece + special-token parsing.
//!
//! Encoding follows llama.cpp's `llama_vocab::impl::tokenize` and decoding its
//! `token_to_piece` / `detokenize` (without the optional `clean_spaces` pass).

use crate::bpe::Bpe;
use crate::error::TokenizerError;
use crate::pretokenize::byte_to_char_table;
use crate::special::{partition, Fragment};
use crate::spm;
use crate::vocab::{attr, Vocab, VocabKind};
use candle_core::quantized::gguf_file::Content;
use std::path::Path;

pub use crate::vocab::VocabKind as Kind;

/// A tokenizer built from GGUF metadata, exact to llama.cpp.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    bpe: Option<Bpe>,
    /// Each token's bytes as llama.cpp's `token_to_piece(special = true)` gives them.
    pieces: Vec<Vec<u8>>,
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` metadata of a parsed GGUF file.
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        let mut vocab = Vocab::from_gguf(content)?;
        // The merge list is only needed to build the BPE tables.
        let merges = std::mem::take(&mut vocab.merges);
        let bpe = match vocab.kind {
            VocabKind::Bpe(pre) => Some(Bpe::new(&vocab, &merges, pre)),
            VocabKind::Spm => None,
        };
        let pieces = build_pieces(&vocab);
        tracing::debug!(
            kind = ?vocab.kind,
            n_vocab = vocab.tokens.len(),
            n_special = vocab.specials.len(),
            "tokenizer loaded"
        );
        Ok(Self { vocab, bpe, pieces })
    }

    /// Reads the GGUF header of `path` (not the tensors) and builds the tokenizer.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let read_err = |reason: String| TokenizerError::Read {
            path: path.display().to_string(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
        // Buffered: the header is hundreds of thousands of small reads.
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        let content = Content::read(&mut reader).map_err(|e| read_err(e.to_string()))?;
        Self::from_gguf(&content)
    }

    /// Encodes `text`, turning special-token texts in it (e.g. `<|im_start|>`) into their ids;
    /// with `add_special` the model's BOS/EOS are added as its metadata asks.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, true)
    }

    /// Encodes `text`; control tokens in it are parsed only with `parse_special` (user-defined
    /// tokens always are), as llama.cpp's `llama_tokenize`.
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special {
            out.extend(self.prompt_bos());
        }
        let frags = partition(v, text, parse_special);
        match &self.bpe {
            Some(bpe) => {
                for f in frags {
                    match f {
                        Fragment::Text(t) => bpe.encode(t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            None => {
                // SentencePiece: a space is prefixed to text at the start or after a special
                // token, and spaces become `▁`.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(t) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in t.chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm::encode(v, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        out
    }

    /// Decodes ids to text, dropping control tokens; invalid UTF-8 becomes U+FFFD. As in
    /// llama.cpp, SentencePiece's prefix space is removed from the first token.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            if self.is_control(id) {
                continue;
            }
            let Some(mut piece) = self.token_to_piece(id) else {
                continue;
            };
            if i == 0 && self.vocab.add_space_prefix {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes of one token (control tokens give their text); `None` for an unknown id.
    /// A piece can be part of a multi-byte character: use [`crate::StreamDecoder`] to stream.
    pub fn token_to_piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// Whether `id` is a control or unknown token (not part of the visible text).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab
            .attrs
            .get(id as usize)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// The id of a token by its exact vocabulary text (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.token_to_id.get(text).copied()
    }

    /// The vocabulary text of a token (byte-level or `▁`-escaped, as stored in the GGUF).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// BPE (with its pre-tokenizer) or SentencePiece.
    pub fn kind(&self) -> Kind {
        self.vocab.kind
    }

    /// Beginning-of-sequence id.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// End-of-sequence id.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End-of-turn id (e.g. `<|im_end|>`, `<|eot_id|>`), from metadata or llama.cpp's defaults.
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.eot
    }

    /// Padding id, if the model has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Every id that ends generation (llama.cpp's `llama_vocab_is_eog` set), ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }

    /// Whether sampling `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Whether the model wants BOS prepended to prompts (`encode(.., add_special = true)` does).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// The token this model's prompts start with: its BOS, where it wants one prepended.
    pub fn prompt_bos(&self) -> Option<u32> {
        self.vocab.bos.filter(|_| self.vocab.add_bos)
    }

    /// Whether the model wants EOS appended to prompts.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
}

/// Precomputes every token's bytes (llama.cpp's `cache_token_to_piece`).
fn build_pieces(v: &Vocab) -> Vec<Vec<u8>> {
    let is_bpe = matches!(v.kind, VocabKind::Bpe(_));
    // Reverse of the byte table; its code points are all below 0x200.
    let mut unbyte_table = [None; 0x200];
    for (b, &c) in byte_to_char_table().iter().enumerate() {
        if let Some(slot) = unbyte_table.get_mut(c as usize) {
            *slot = Some(b as u8);
        }
    }
    let unbyte = |c: char| unbyte_table.get(c as usize).copied().flatten();
    v.tokens
        .iter()
        .zip(&v.attrs)
        .map(|(text, &a)| {
            if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
                text.as_bytes().to_vec()
            } else if a & attr::NORMAL != 0 {
                if is_bpe {
                    // Byte-level decoding; a character outside the table is kept as is.
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match unbyte(c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                } else {
                    text.replace('▁', " ").into_bytes()
                }
            } else if a & attr::BYTE != 0 {
                let hex = text
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => vec![b],
                    None => text.chars().filter_map(unbyte).collect(),
                }
            } else {
                Vec::new()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::testutil::content;
    use crate::StreamDecoder;
    use candle_core::quantized::gguf_file::Value;

    /// A SentencePiece vocabulary with byte fallback; scores steer the merge order.
    pub(crate) fn spm() -> Tokenizer {
        let mut toks: Vec<(String, i32)> =
            vec![("<unk>".into(), 2), ("<s>".into(), 3), ("</s>".into(), 3)];
        for b in 0..=255u8 {
            toks.push((format!("<0x{b:02X}>"), 6));
        }
        let normal = [
            ("▁", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("ll", -1.0),
            ("▁h", -3.0),
            ("he", -0.5),
            ("llo", -0.2),
            ("[U]", 0.0),
        ];
        let mut scores = vec![0.0; toks.len()];
        for (t, s) in normal {
            let ty = if t == "[U]" { 4 } else { 1 };
            toks.push((t.into(), ty));
            scores.push(s);
        }
        let refs: Vec<(&str, i32)> = toks.iter().map(|(t, ty)| (t.as_str(), *ty)).collect();
        Tokenizer::from_gguf(&content("llama", None, &refs, Some(&scores), &[], vec![])).unwrap()
    }

    fn id(t: &Tokenizer, s: &str) -> u32 {
        t.token_id(s).unwrap()
    }

    #[test]
    fn spm_merges_by_score_and_prefixes_a_space() {
        let t = spm();
        let want = vec![id(&t, "▁"), id(&t, "he"), id(&t, "llo")];
        assert_eq!(t.encode_with("hello", false, false), want);
        let mut with_bos = vec![1];
        with_bos.extend(&want);
        assert_eq!(t.encode("hello", true), with_bos);
        assert_eq!(t.decode(&with_bos), " hello");
        assert_eq!(t.decode(&want), "hello");
    }

    #[test]
    fn spm_falls_back_to_bytes() {
        let t = spm();
        let ids = t.encode_with("hé", false, false);
        // "▁h" is a token; 'é' is not, so it falls back to its two UTF-8 bytes.
        let want = vec![id(&t, "▁h"), id(&t, "<0xC3>"), id(&t, "<0xA9>")];
        assert_eq!(ids, want);
        assert_eq!(t.decode(&ids), "hé");
    }

    #[test]
    fn specials_split_text_and_restart_the_space_prefix() {
        let t = spm();
        let he = [id(&t, "▁"), id(&t, "he")];
        let ids = t.encode("he</s>he", false);
        assert_eq!(ids, [he[0], he[1], 2, he[0], he[1]]);
        // Without special parsing `</s>` is text (bytes here).
        let raw = t.encode_with("he</s>he", false, false);
        assert!(!raw.contains(&2));
        assert_eq!(t.decode(&raw), "he</s>he");
        // User-defined tokens are split out even without special parsing.
        let ids = t.encode_with("he[U]he", false, false);
        assert_eq!(ids[2], id(&t, "[U]"));
    }

    #[test]
    fn spm_stream_decodes_spaces_and_byte_pieces() {
        let t = spm();
        let ids = t.encode_with("he héllo", false, false);
        let mut dec = StreamDecoder::new();
        let chunks: Vec<String> = ids.iter().map(|&i| dec.push(&t, i)).collect();
        assert_eq!(chunks.concat(), " he héllo");
        // The two bytes of 'é' arrive as two tokens: the first yields nothing.
        let c3 = ids.iter().position(|&i| i == id(&t, "<0xC3>")).unwrap();
        assert_eq!(chunks[c3], "");
        assert_eq!(chunks[c3 + 1], "é");
    }

    fn bpe(pre: &str, merges: &[&str]) -> Tokenizer {
        let toks = [
            ("a", 1),
            ("b", 1),
            ("c", 1),
            ("ab", 1),
            ("bc", 1),
            ("abc", 1),
            ("Ġ", 1),
            ("Ġa", 1),
            ("<|end|>", 3),
        ];
        let extra = vec![("tokenizer.ggml.eos_token_id", Value::U32(8))];
        Tokenizer::from_gguf(&content("gpt2", Some(pre), &toks, None, merges, extra)).unwrap()
    }

    #[test]
    fn bpe_applies_merges_in_rank_order() {
        // "b c" first, then "a bc".
        let t = bpe("gpt-2", &["b c", "a b", "a bc"]);
        assert_eq!(t.encode("abc", false), [5]);
        // "a b" first; "ab c" is not a merge, so "ab" + "c" stay apart.
        let t = bpe("gpt-2", &["a b", "b c", "a bc"]);
        assert_eq!(t.encode("abc", false), [3, 2]);
        // No "Ġ a" merge: the space stays its own token.
        assert_eq!(t.encode("abc abc", false), [3, 2, 6, 3, 2]);
        assert_eq!(t.decode(&[3, 2, 6, 3, 2]), "abc abc");
        let t = bpe("gpt-2", &["Ġ a", "a b"]);
        assert_eq!(t.encode("ab ab", false), [3, 7, 1]);
    }

    #[test]
    fn llama3_takes_whole_words_that_are_tokens() {
        let t = bpe("llama3", &["x y"]);
        assert_eq!(t.encode_with("abc", false, false), [5]);
        let t = bpe("gpt-2", &["x y"]);
        assert_eq!(t.encode_with("abc", false, false), [0, 1, 2]);
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<StreamDecoder>();
        assert_send_sync::<crate::StopMatcher>();
    }

    #[test]
    fn control_tokens_parse_and_end_generation() {
        let t = bpe("gpt-2", &["a b"]);
        assert_eq!(t.encode("ab<|end|>", false), [3, 8]);
        assert!(t.is_eog(8) && t.is_control(8));
        assert_eq!(t.decode(&[3, 8]), "ab");
        assert_eq!(t.token_to_piece(8), Some(&b"<|end|>"[..]));
        assert_eq!(t.token_to_piece(99), None);
    }
}
