//! Resume on tiny generated models: a request cut after any delta (what a worker can have
//! delivered when it stops) and resumed from there gives exactly the uninterrupted result:
//! the same token ids, the same text byte for byte, the same finish reason and totals.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use tidal_tokenizer::Tokenizer;

use super::{
    Engine, EngineConfig, EngineError, FinishReason, GenerationEvent, GenerationRequest,
    ResumeFrom, Usage,
};
use crate::model::{write_tiny_gguf, Model, ModelFile, TinySpec};
use crate::sampling::SamplingParams;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!("tidal-engine-test-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tiny model's vocabulary with two thirds of its tokens turned into lone UTF-8 lead
/// and continuation bytes (GPT-2 byte-level spelling), so generated text is full of
/// characters split across tokens, invalid sequences and held-back partial characters.
fn utf8_vocabulary(content: &mut Content) {
    let Some(Value::Array(tokens)) = content.metadata.get_mut("tokenizer.ggml.tokens") else {
        panic!("tiny model without tokens");
    };
    // Continuation bytes 0xA1..=0xBF except 0xAD (not spelled as itself); 2- and 3-byte
    // leads 0xC2..=0xEF: all spelled as the Latin-1 character of the byte.
    let mut continuation = (0xA1u32..=0xBF)
        .filter(|&b| b != 0xAD)
        .filter_map(char::from_u32);
    let mut leads = (0xC2u32..=0xEF).filter_map(char::from_u32);
    for (i, t) in tokens.iter_mut().enumerate().skip(2) {
        let c = match i % 3 {
            0 => leads.next(),
            1 => continuation.next(),
            _ => None,
        };
        if let Some(c) = c {
            *t = Value::String(c.to_string());
        }
    }
}

fn start_engine(path: &Path, utf8: bool) -> Engine {
    let file = ModelFile::open(path).unwrap();
    let mut content = Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
    if utf8 {
        utf8_vocabulary(&mut content);
    }
    let tokenizer = Arc::new(Tokenizer::from_gguf(&content).unwrap());
    let model = Model::load(&file, None).unwrap();
    let config = EngineConfig {
        block_size: 4,
        kv_cache_memory: 4 << 20,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        enable_prefix_caching: true,
        threads: Some(1),
        kv_cache_dtype: Default::default(),
        device: Default::default(),
        device_memory: None,
        speculative: Default::default(),
    };
    Engine::start(model, tokenizer, config).unwrap()
}

fn tiny_engine(utf8: bool) -> (TempDir, Engine) {
    let dir = TempDir::new();
    let path = dir.0.join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::default()).unwrap();
    let engine = start_engine(&path, utf8);
    (dir, engine)
}

fn greedy(max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: vec![0, 5, 17, 33, 60, 8, 41, 2, 77],
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        resume: None,
        cache_scope: Default::default(),
        num_speculative_tokens: None,
    }
}

/// Greedy with penalties: the tiny model's plain greedy output repeats one token; this one
/// walks through the vocabulary.
fn diverse(max_tokens: usize) -> GenerationRequest {
    let mut r = greedy(max_tokens);
    r.sampling.frequency_penalty = 1.0;
    r.sampling.presence_penalty = 1.0;
    r
}

/// Everything one request produced.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    deltas: Vec<(String, Vec<u32>)>,
    finish: FinishReason,
    usage: Usage,
}

impl Run {
    fn text(&self) -> String {
        self.deltas.iter().map(|d| d.0.as_str()).collect()
    }
    fn ids(&self) -> Vec<u32> {
        self.deltas.iter().flat_map(|d| d.1.clone()).collect()
    }
}

fn run(engine: &Engine, request: GenerationRequest) -> Run {
    let mut rx = engine.submit(request).unwrap();
    let mut deltas = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Delta {
                text, token_ids, ..
            } => deltas.push((text, token_ids)),
            GenerationEvent::Done {
                finish_reason,
                usage,
            } => {
                return Run {
                    deltas,
                    finish: finish_reason,
                    usage,
                }
            }
            GenerationEvent::Error { message } => panic!("engine error: {message}"),
        }
    }
    panic!("engine stopped without Done");
}

/// Runs `base` uninterrupted, then resumed after every delta (nothing delivered, each
/// partial stream, everything but `Done`), and checks each resumed run completes the
/// delivered part into exactly the uninterrupted output. Returns the uninterrupted run.
fn check_every_cut(engine: &Engine, base: &GenerationRequest) -> Run {
    let full = run(engine, base.clone());
    assert!(!full.ids().is_empty(), "nothing generated");
    for cut in 0..=full.deltas.len() {
        let delivered = &full.deltas[..cut];
        let ids: Vec<u32> = delivered.iter().flat_map(|d| d.1.clone()).collect();
        let text: String = delivered.iter().map(|d| d.0.as_str()).collect();
        let mut req = base.clone();
        req.resume = Some(ResumeFrom {
            token_ids: ids.clone(),
            text_len: text.len(),
        });
        let rest = run(engine, req);
        let mut all_ids = ids;
        all_ids.extend(rest.ids());
        assert_eq!(
            all_ids,
            full.ids(),
            "token ids differ after a cut at delta {cut}"
        );
        assert_eq!(
            text + &rest.text(),
            full.text(),
            "text differs after a cut at delta {cut}"
        );
        assert_eq!(
            rest.finish, full.finish,
            "finish reason, cut at delta {cut}"
        );
        assert_eq!(
            (rest.usage.prompt_tokens, rest.usage.completion_tokens),
            (full.usage.prompt_tokens, full.usage.completion_tokens),
            "usage totals, cut at delta {cut}"
        );
    }
    full
}

#[test]
fn resumed_greedy_run_matches_uninterrupted_run() {
    let (_dir, engine) = tiny_engine(false);
    let full = check_every_cut(&engine, &greedy(24));
    assert_eq!(full.ids().len(), 24);
    assert_eq!(full.finish, FinishReason::Length);
}

#[test]
fn resumed_seeded_sampling_matches_uninterrupted_run() {
    let (_dir, engine) = tiny_engine(false);
    let mut base = greedy(24);
    base.sampling = SamplingParams {
        temperature: 1.5,
        seed: Some(3),
        ..SamplingParams::default()
    };
    let full = check_every_cut(&engine, &base);
    let distinct: std::collections::HashSet<u32> = full.ids().into_iter().collect();
    assert!(distinct.len() > 3, "sampled, not greedy: {:?}", full.ids());
}

#[test]
fn resume_keeps_partial_utf8_characters_whole() {
    let (_dir, engine) = tiny_engine(true);
    let full = check_every_cut(&engine, &diverse(48));
    // The vocabulary makes the decoder hold bytes back: some delta must carry tokens whose
    // text is still incomplete (fewer deltas than tokens), else this test proves nothing.
    assert!(
        full.deltas.len() < full.ids().len(),
        "no held-back characters in {:?}",
        full.text()
    );
    assert!(full.text().chars().any(|c| c as u32 > 0x7f));
}

#[test]
fn resume_continues_partial_stop_string_matches() {
    let (_dir, engine) = tiny_engine(false);
    let plain = run(&engine, diverse(32)).text();
    let chars: Vec<char> = plain.chars().collect();
    assert!(chars.len() >= 20, "{plain:?}");
    // A stop string that really occurs: its first characters are held back while the
    // match is open, then the stream ends before it.
    let hit: String = chars[12..15].iter().collect();
    let mut req = diverse(32);
    req.stop = vec![hit.clone()];
    let stopped = check_every_cut(&engine, &req);
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert!(!stopped.text().contains(&hit));
    // A stop string that starts like the text but never completes: held back at every
    // occurrence of its first character and released after it.
    let mut req = diverse(32);
    let first = chars[3];
    req.stop = vec![format!("{first}\u{1}")];
    let released = check_every_cut(&engine, &req);
    assert_eq!(released.text(), plain);
    assert_eq!(released.finish, FinishReason::Length);
}

#[test]
fn resumed_tokens_count_for_stop_tokens_and_penalties() {
    let (_dir, engine) = tiny_engine(false);
    // Penalties see the delivered tokens as generated ones.
    let mut req = greedy(24);
    req.sampling.frequency_penalty = 0.8;
    req.sampling.presence_penalty = 0.5;
    req.sampling.repetition_penalty = 1.3;
    let penalised = check_every_cut(&engine, &req);
    assert_ne!(penalised.ids(), run(&engine, greedy(24)).ids());
    // A stop token id ends the request at its first occurrence, also after a resume.
    let plain = run(&engine, diverse(24)).ids();
    let first = (5..plain.len())
        .find(|&i| !plain[..i].contains(&plain[i]))
        .expect("a token first seen after position 5");
    let mut req = diverse(24);
    req.stop_token_ids = vec![plain[first]];
    let stopped = check_every_cut(&engine, &req);
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert_eq!(stopped.ids(), plain[..first].to_vec());
    assert_eq!(stopped.usage.completion_tokens, first + 1);
}

#[test]
fn resume_is_validated() {
    let (_dir, engine) = tiny_engine(false);
    let mut req = greedy(4);
    req.resume = Some(ResumeFrom {
        token_ids: vec![3; 5],
        text_len: 5,
    });
    assert!(matches!(engine.submit(req), Err(EngineError::Invalid(_))));
    let mut req = greedy(4);
    req.resume = Some(ResumeFrom {
        token_ids: vec![10_000],
        text_len: 1,
    });
    assert!(matches!(engine.submit(req), Err(EngineError::Invalid(_))));
}

#[test]
fn prefill_throughput_is_measured_on_prefill_steps() {
    let (_dir, engine) = tiny_engine(false);
    assert_eq!(engine.stats().prefill_tokens_per_s, 0.0);
    // a 9-token prompt is one prefill step; the stats of that step are published before
    // the next step runs, so well before `Done` three decode steps later
    run(&engine, greedy(4));
    let rate = engine.stats().prefill_tokens_per_s;
    assert!(rate > 0.0 && rate.is_finite(), "{rate}");
}
