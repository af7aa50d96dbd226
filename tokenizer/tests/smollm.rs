//! The default model, SmolLM2-135M-Instruct (BPE, `smollm` pre-tokenizer, ChatML template).
//! Reference ids come from Hugging Face `tokenizers` with SmolLM2's `tokenizer.json` pipeline
//! (digits split one by one, then GPT-2 byte-level), an implementation independent of this one.

mod common;

use candle_core::quantized::gguf_file::Content;
use std::sync::OnceLock;
use tidal_tokenizer::{ChatMessage, ChatTemplate, Kind, StreamDecoder, Tokenizer};

fn model() -> &'static (Tokenizer, Content) {
    static MODEL: OnceLock<(Tokenizer, Content)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = common::default_model();
        let mut f = std::fs::File::open(path).unwrap();
        let content = Content::read(&mut f).unwrap();
        (Tokenizer::from_gguf(&content).unwrap(), content)
    })
}

fn tok() -> &'static Tokenizer {
    &model().0
}

#[test]
fn metadata_matches_the_model() {
    let t = tok();
    assert_eq!(t.vocab_size(), 49152);
    assert!(
        matches!(t.kind(), Kind::Bpe(p) if p == tidal_tokenizer::pretokenize::PreTokenizer::Smollm)
    );
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert!(!t.add_bos());
    assert_eq!(t.prompt_bos(), None, "SmolLM2 prompts start with no BOS");
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    // <|endoftext|> and <|im_end|> both end generation (llama.cpp's EOG set).
    assert_eq!(t.eog_ids(), vec![0, 2]);
    assert!(t.is_eog(2) && t.is_eog(0) && !t.is_eog(1));
    assert_eq!(t.eot_id(), Some(2));
}

#[test]
fn capital_of_france_round_trips() {
    let t = tok();
    let text = "The capital of France is";
    let ids = t.encode(text, true);
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn digits_are_split_one_by_one() {
    let ids = tok().encode("In 2024, 1234 people", false);
    assert_eq!(
        ids,
        [788, 216, 34, 32, 34, 36, 28, 216, 33, 34, 35, 36, 701]
    );
}

#[test]
fn chatml_specials_encode_to_single_ids() {
    let t = tok();
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>\n", false);
    assert_eq!(ids, [1, 4093, 198, 26843, 2, 198]);
    // Without special parsing the same text is plain characters.
    let plain = t.encode_with("<|im_start|>", false, false);
    assert!(plain.len() > 1 && !plain.contains(&1));
    // Control tokens are dropped from decoded text but shown by a special-aware stream.
    assert_eq!(t.decode(&ids), "user\nHi\n");
    let mut dec = StreamDecoder::with_special_tokens();
    let shown: String = ids.iter().map(|&id| dec.push(t, id)).collect();
    assert_eq!(shown, "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn stream_decoding_holds_back_split_emoji_and_cjk() {
    let t = tok();
    let text = "🦙 日本語 café";
    let ids = t.encode(text, false);
    assert_eq!(
        ids,
        [10813, 116, 243, 17097, 241, 115, 40993, 179, 120, 248, 37366]
    );
    let mut dec = StreamDecoder::new();
    let chunks: Vec<String> = ids.iter().map(|&id| dec.push(t, id)).collect();
    // 🦙 is three tokens: nothing comes out until its last byte arrives.
    assert_eq!(chunks[0], "");
    assert_eq!(chunks[1], "");
    assert_eq!(chunks[2], "🦙");
    // 語 is split over three tokens too.
    assert_eq!(chunks[7], "");
    assert_eq!(chunks[8], "");
    assert_eq!(chunks[9], "語");
    assert_eq!(chunks.concat(), text);
    assert_eq!(dec.pending_bytes(), 0);
    assert_eq!(dec.finish(), "");
}

#[test]
fn long_prompt_round_trips() {
    let t = tok();
    let text = "Tidal serves GGUF models with continuous batching. ".repeat(40)
        + "Ünïcödé, 中文, emoji 🚀🦙, code: fn main() { println!(\"{}\", 42); }\n\n\tdone.";
    let ids = t.encode(&text, false);
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn chat_template_renders_chatml_exactly() {
    let tmpl = ChatTemplate::from_gguf(&model().1).unwrap();
    let out = tmpl
        .render(
            &[
                ChatMessage::new("user", "What is the capital of France?"),
                ChatMessage::new("assistant", "Paris."),
                ChatMessage::new("user", "And of Italy?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\nParis.<|im_end|>\n\
         <|im_start|>user\nAnd of Italy?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // With a system message of its own, no default system prompt is added.
    let out = tmpl
        .render(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    // The rendered prompt tokenizes with each ChatML marker as one id.
    let ids = tok().encode(&out, false);
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 2);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
}
