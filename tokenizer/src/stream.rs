//! Incremental detokenisation for streaming responses.
//!
//! Each token's piece is raw bytes (a byte-level BPE piece or a SentencePiece `<0xNN>` byte can
//! be part of a multi-byte character), so the decoder appends bytes and releases only the
//! longest valid UTF-8 prefix, holding back an incomplete trailing character until the next
//! token completes it. Like llama.cpp's server, each piece is taken as is: SentencePiece's `▁`
//! is already a space in the piece and no leading space is stripped (generated text continues a
//! prompt, so its first space is real).

use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into a stream of complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    show_special: bool,
}

impl StreamDecoder {
    /// A decoder that drops control tokens (the usual choice for user-visible text).
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that renders control tokens as their text (e.g. `<|im_end|>`).
    pub fn with_special_tokens() -> Self {
        Self {
            pending: Vec::new(),
            show_special: true,
        }
    }

    /// Feeds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        if self.show_special || !tokenizer.is_control(id) {
            if let Some(piece) = tokenizer.token_to_piece(id) {
                self.pending.extend_from_slice(piece);
            }
        }
        self.take_complete()
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: whatever is held back comes out, invalid bytes as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix is valid UTF-8 by `valid_up_to`'s contract.
                    out.push_str(&String::from_utf8_lossy(
                        &self.pending[start..start + valid],
                    ));
                    start += valid;
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => break,
                        // Bytes that can never become valid: replace them, as lossy decoding does.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::testutil::content;
    use candle_core::quantized::gguf_file::Value;

    /// A byte-level BPE vocabulary with one token per byte (GPT-2's byte table) + one control.
    fn byte_vocab() -> Tokenizer {
        let table = crate::pretokenize::byte_to_char_table();
        let mut toks: Vec<(String, i32)> = table.iter().map(|c| (c.to_string(), 1)).collect();
        toks.push(("<|eot|>".into(), 3));
        let refs: Vec<(&str, i32)> = toks.iter().map(|(t, ty)| (t.as_str(), *ty)).collect();
        let extra = vec![("tokenizer.ggml.eos_token_id", Value::U32(256))];
        Tokenizer::from_gguf(&content(
            "gpt2",
            Some("gpt-2"),
            &refs,
            None,
            &["x y"],
            extra,
        ))
        .unwrap()
    }

    /// Token id of a raw byte in `byte_vocab`.
    fn byte_id(t: &Tokenizer, b: u8) -> u32 {
        let c = crate::pretokenize::byte_to_char_table()[b as usize];
        t.token_id(&c.to_string()).unwrap()
    }

    #[test]
    fn every_split_of_multibyte_text_streams_whole_characters() {
        let t = byte_vocab();
        let text = "a🦙中é!";
        let ids: Vec<u32> = text.bytes().map(|b| byte_id(&t, b)).collect();
        let mut dec = StreamDecoder::new();
        let mut out: Vec<String> = Vec::new();
        let mut done = 0;
        for &id in &ids {
            let chunk = dec.push(&t, id);
            // Every chunk is whole characters of the text, in order.
            assert!(text[done..].starts_with(&chunk));
            done += chunk.len();
            out.push(chunk);
        }
        assert_eq!(out.concat(), text);
        assert_eq!(out, ["a", "", "", "", "🦙", "", "", "中", "", "é", "!"]);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let t = byte_vocab();
        let mut dec = StreamDecoder::new();
        // A lone continuation byte can never be valid: replaced at once.
        assert_eq!(dec.push(&t, byte_id(&t, 0x80)), "\u{FFFD}");
        // A lead byte followed by ASCII: the lead is replaced, the ASCII kept.
        assert_eq!(dec.push(&t, byte_id(&t, 0xE4)), "");
        assert_eq!(dec.push(&t, byte_id(&t, b'x')), "\u{FFFD}x");
        // A truncated character at the end comes out of finish() as U+FFFD.
        assert_eq!(dec.push(&t, byte_id(&t, 0xF0)), "");
        assert_eq!(dec.pending_bytes(), 1);
        assert_eq!(dec.finish(), "\u{FFFD}");
    }

    #[test]
    fn control_tokens_are_hidden_unless_asked_for() {
        let t = byte_vocab();
        let mut dec = StreamDecoder::new();
        assert_eq!(dec.push(&t, 256), "");
        let mut dec = StreamDecoder::with_special_tokens();
        assert_eq!(dec.push(&t, 256), "<|eot|>");
    }
}
