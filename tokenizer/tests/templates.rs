//! Real Hugging Face chat templates (from llama.cpp's `models/templates/`) render with
//! minijinja + pycompat, and give the exact text their model expects.

use tidal_tokenizer::{ChatMessage, ChatTemplate, ChatTemplateError};

fn load(name: &str, bos: &str, eos: &str) -> ChatTemplate {
    let path = format!(
        "{}/tests/data/templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(&path).unwrap();
    ChatTemplate::new(&src, bos, eos).unwrap()
}

fn convo() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("user", "Hi there"),
        ChatMessage::new("assistant", "Hello! How can I help?"),
        ChatMessage::new("user", "What is 2+2?"),
    ]
}

#[test]
fn every_stored_template_renders_a_plain_conversation() {
    let names = [
        ("microsoft-Phi-3.5-mini-instruct", "<s>", "<|endoftext|>"),
        ("google-gemma-2-2b-it", "<bos>", "<eos>"),
        ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>"),
        (
            "meta-llama-Llama-3.2-3B-Instruct",
            "<|begin_of_text|>",
            "<|eot_id|>",
        ),
        ("mistralai-Mistral-Nemo-Instruct-2407", "<s>", "</s>"),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        ("HuggingFaceTB-SmolLM3-3B", "", "<|im_end|>"),
        ("Qwen-Qwen3-0.6B", "", "<|im_end|>"),
    ];
    for (name, bos, eos) in names {
        let t = load(name, bos, eos);
        let out = t
            .render(&convo(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.contains("What is 2+2?"), "{name}: {out}");
        assert!(out.contains("Hi there"), "{name}: {out}");
    }
}

#[test]
fn qwen25_renders_chatml_with_default_system_prompt() {
    let out = load("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>")
        .render(&convo(), true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi there<|im_end|>\n\
         <|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn phi35_renders_exactly_and_ends_with_eos_without_generation_prompt() {
    let t = load("microsoft-Phi-3.5-mini-instruct", "<s>", "<|endoftext|>");
    let out = t.render(&convo()[..1], true).unwrap();
    assert_eq!(out, "<|user|>\nHi there<|end|>\n<|assistant|>\n");
    let out = t.render(&convo()[..2], false).unwrap();
    assert_eq!(
        out,
        "<|user|>\nHi there<|end|>\n<|assistant|>\nHello! How can I help?<|end|>\n<|endoftext|>"
    );
}

#[test]
fn gemma2_raises_on_system_role_and_non_alternating_turns() {
    let t = load("google-gemma-2-2b-it", "<bos>", "<eos>");
    let out = t.render(&convo(), true).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello! How can I help?<end_of_turn>\n\
         <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
    );
    let sys = [
        ChatMessage::new("system", "x"),
        ChatMessage::new("user", "y"),
    ];
    match t.render(&sys, true) {
        Err(ChatTemplateError::Raised(m)) => assert_eq!(m, "System role not supported"),
        other => panic!("unexpected {other:?}"),
    }
    let twice = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    match t.render(&twice, true) {
        Err(ChatTemplateError::Raised(m)) => {
            assert_eq!(
                m,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            )
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn missing_template_is_a_typed_error() {
    let ct = candle_core::quantized::gguf_file::Content {
        magic: candle_core::quantized::gguf_file::VersionedMagic::GgufV3,
        metadata: Default::default(),
        tensor_infos: Default::default(),
        tensor_data_offset: 0,
    };
    assert!(matches!(
        ChatTemplate::from_gguf(&ct),
        Err(ChatTemplateError::Missing)
    ));
}
