//! Helpers for tests on the real default model.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tidal_runtime::engine::{Engine, EngineConfig, GenerationEvent, GenerationRequest, Usage};
use tidal_runtime::model::{Model, ModelFile};
use tidal_runtime::sampling::SamplingParams;
use tidal_tokenizer::{ChatTemplate, Tokenizer};

/// Path of the default model, fetched (and verified) by the project's script on first use.
pub fn default_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetch_model("smollm2")).clone()
}

/// Path of a model `scripts/fetch-model.sh` knows (`smollm2`, `gemma3`), fetched and
/// verified by it.
pub fn fetch_model(name: &str) -> PathBuf {
    let mut script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-model.sh");
    if !script.exists() {
        // A test binary run in another copy of the repository (scripts/gpu-check.sh on a GPU
        // machine) from its root.
        script = PathBuf::from("scripts/fetch-model.sh");
    }
    let out = std::process::Command::new("bash")
        .arg(script)
        .arg(name)
        .output()
        .expect("run fetch-model.sh");
    assert!(
        out.status.success(),
        "fetch-model.sh {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Starts an engine on the default model with the given settings.
pub fn engine(config: EngineConfig) -> (Engine, Option<ChatTemplate>) {
    let file = ModelFile::open(default_model()).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.content()).unwrap());
    let template = ChatTemplate::from_gguf(file.content()).ok();
    let model = Model::load(&file, None).unwrap();
    (Engine::start(model, tokenizer, config).unwrap(), template)
}

/// A greedy request for `max_tokens` tokens.
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
        resume: None,
        cache_scope: Default::default(),
        num_speculative_tokens: None,
    }
}

/// What a finished request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub text: String,
    pub ids: Vec<u32>,
    pub finish: String,
    pub usage: Usage,
}

/// Waits for a submitted request on this thread.
pub fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>) -> Output {
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Delta {
                text: t, token_ids, ..
            } => {
                text.push_str(&t);
                ids.extend(token_ids);
            }
            GenerationEvent::Done {
                finish_reason,
                usage,
            } => {
                return Output {
                    text,
                    ids,
                    finish: finish_reason.as_str().into(),
                    usage,
                }
            }
            GenerationEvent::Error { message } => panic!("engine error: {message}"),
        }
    }
    panic!("engine stopped without Done");
}
