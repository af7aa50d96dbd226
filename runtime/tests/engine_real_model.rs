//! The engine on the real default model (SmolLM2-135M-Instruct Q4_1), on CPU.

mod common;

use common::{collect, engine, greedy};
use tidal_runtime::engine::EngineConfig;

fn small_config() -> EngineConfig {
    EngineConfig {
        kv_cache_memory: 64 << 20,
        ..EngineConfig::default()
    }
}

#[test]
fn capital_of_france_is_paris() {
    let (engine, _) = engine(small_config());
    let tok = engine.tokenizer().clone();
    let prompt = tok.encode("The capital of France is", false);
    let out = collect(engine.submit(greedy(prompt.clone(), 8)).unwrap());
    assert!(
        out.text.contains("Paris"),
        "greedy continuation was {:?}",
        out.text
    );
    assert_eq!(out.usage.prompt_tokens, prompt.len());
    assert_eq!(out.usage.completion_tokens, 8);
    assert_eq!(out.ids.len(), 8);
}

/// The greedy ids of a request are the same alone and batched with 7 others of different
/// lengths (prefill chunks and decodes of other sequences in the same steps).
#[test]
fn batch_invariance() {
    let (engine, _) = engine(small_config());
    let tok = engine.tokenizer().clone();
    let target = tok.encode("Once upon a time, in a small village by the sea,", false);
    let alone = collect(engine.submit(greedy(target.clone(), 24)).unwrap()).ids;

    let others = [
        "Hi",
        "The quick brown fox jumps over the lazy dog and keeps running through the forest until night falls.",
        "1 2 3 4 5 6 7 8 9 10 11 12",
        "def fibonacci(n):",
        "In 1969, astronauts",
        "Water boils at",
        "A list of fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango",
    ];
    let mut receivers: Vec<_> = others
        .iter()
        .enumerate()
        .map(|(i, text)| {
            engine
                .submit(greedy(tok.encode(text, false), 10 + 3 * i))
                .unwrap()
        })
        .collect();
    let target_rx = engine.submit(greedy(target, 24)).unwrap();
    let batched = collect(target_rx).ids;
    for rx in receivers.drain(..) {
        collect(rx);
    }
    assert_eq!(alone, batched, "greedy ids changed when batched");
}

/// A prompt that hits the prefix cache yields the same greedy ids as a cold run, and the
/// reuse is reported as cached tokens.
#[test]
fn prefix_cache_hit_gives_same_ids() {
    let (engine, _) = engine(small_config());
    let tok = engine.tokenizer().clone();
    let system = "You are a helpful assistant who answers questions about geography. ".repeat(6);
    let prompt = tok.encode(
        &format!("{system}Question: what is the largest ocean?"),
        false,
    );
    let cold = collect(engine.submit(greedy(prompt.clone(), 16)).unwrap());
    assert_eq!(cold.usage.cached_tokens, 0);
    let warm = collect(engine.submit(greedy(prompt.clone(), 16)).unwrap());
    assert!(
        warm.usage.cached_tokens >= 16,
        "expected a prefix hit, got {:?}",
        warm.usage
    );
    assert!(
        warm.usage.cached_tokens < prompt.len(),
        "the last prompt token is always recomputed"
    );
    assert_eq!(cold.ids, warm.ids);
}

/// With a KV cache too small for all sequences at once, the scheduler preempts and later
/// recomputes; every sequence still gets exactly its undisturbed greedy ids.
#[test]
fn preempted_sequences_recompute_to_same_ids() {
    let tok_engine = engine(small_config()).0;
    let tok = tok_engine.tokenizer().clone();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            tok.encode(
                &format!("Story {i}: the lighthouse keeper climbed the stairs and saw"),
                false,
            )
        })
        .collect();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(tok_engine.submit(greedy(p.clone(), 40)).unwrap()).ids)
        .collect();
    drop(tok_engine);

    // 16 blocks of 16 tokens: six sequences of ~55 tokens (4 blocks each) cannot all fit.
    let bytes_per_token = 2 * 30 * 3 * 64 * 4;
    let (tight, _) = engine(EngineConfig {
        kv_cache_memory: 16 * 16 * bytes_per_token,
        ..EngineConfig::default()
    });
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| tight.submit(greedy(p.clone(), 40)).unwrap())
        .collect();
    for (rx, want) in receivers.into_iter().zip(expected) {
        assert_eq!(collect(rx).ids, want);
    }
}

#[test]
fn stop_strings_and_eos_end_generation() {
    let (engine, template) = engine(small_config());
    let tok = engine.tokenizer().clone();
    let template = template.expect("SmolLM2 has a chat template");
    let text = template
        .render(
            &[tidal_tokenizer::ChatMessage::new("user", "What is 2+2?")],
            true,
        )
        .unwrap();
    let mut req = greedy(tok.encode(&text, false), 64);
    req.ignore_eos = false;
    let out = collect(engine.submit(req.clone()).unwrap());
    assert_eq!(
        out.finish, "stop",
        "the chat reply should end with <|im_end|>: {out:?}"
    );
    assert!(out.text.contains('4'), "{:?}", out.text);
    assert!(!out.text.contains("<|im_end|>"));

    req.stop = vec!["4".into()];
    let stopped = collect(engine.submit(req).unwrap());
    assert_eq!(stopped.finish, "stop");
    assert!(!stopped.text.contains('4'), "{:?}", stopped.text);
    assert!(stopped.usage.completion_tokens < out.usage.completion_tokens);
    assert!(out.text.starts_with(&stopped.text));
}
