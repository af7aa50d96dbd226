//! Speculative decoding in the engine: the same tokens with and without it (greedy and
//! seeded sampling, alone and batched, through prefix-cache hits, preemption and resume),
//! with the n-gram proposer and with a draft model (the target's own file, and a Q8_0
//! re-quantisation of it), no KV block left behind (the draft's included), a draft of
//! another vocabulary refused, and on a tiny model the next-token distribution of sampled
//! requests with speculation against the target's own.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{collect, default_model, engine, greedy, Output};
use tidal_runtime::engine::{
    Engine, EngineConfig, EngineError, GenerationEvent, GenerationRequest, ResumeFrom,
};
use tidal_runtime::model::{
    write_tiny_gguf, ForwardBatch, ForwardSeq, KvStorage, Model, ModelFile, QuantizeTo, TinySpec,
};
use tidal_runtime::sampling::SamplingParams;
use tidal_runtime::scheduler::SchedulerStats;
use tidal_runtime::speculative::{
    DraftError, SpeculativeConfig, SpeculativeMethod, ASSUMED_VERIFY_COST,
};
use tidal_tokenizer::Tokenizer;

fn config(method: SpeculativeMethod) -> EngineConfig {
    EngineConfig {
        kv_cache_memory: 64 << 20,
        speculative: SpeculativeConfig {
            method,
            ..SpeculativeConfig::default()
        },
        ..EngineConfig::default()
    }
}

/// Prompts that quote their material (where proposals are accepted) and some that do not.
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape.\nCopy: apple, banana,",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
        "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
        "Once upon a time, in a small village by the sea,",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
        "Question: what is the capital of France? Answer:",
    ]
    .iter()
    .map(|t| tok.encode(t, false))
    .collect()
}

fn sampled(prompt: Vec<u32>, max_tokens: usize, seed: u64, logprobs: bool) -> GenerationRequest {
    GenerationRequest {
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            presence_penalty: 0.3,
            seed: Some(seed),
            top_logprobs: logprobs.then_some(3),
            ..SamplingParams::default()
        },
        ..greedy(prompt, max_tokens)
    }
}

/// Runs every request concurrently and returns the outputs in order.
/// KV memory of 12 blocks of 16 tokens (f16 K and V, 30 layers × 3 heads × 64) for six
/// sequences of ~60 tokens: constant preemption.
const TIGHT_KV_MEMORY: usize = 12 * 16 * (2 * 30 * 3 * 64 * 2);

/// Greedy requests of `max_tokens` for every prompt, and their outputs without speculation.
fn greedy_without_speculation(max_tokens: usize) -> (Vec<GenerationRequest>, Vec<Output>) {
    let (off, _) = engine(config(SpeculativeMethod::Off));
    let tok = off.tokenizer().clone();
    let requests: Vec<_> = prompts(&tok)
        .into_iter()
        .map(|p| greedy(p, max_tokens))
        .collect();
    let expected = run_all(&off, &requests);
    (requests, expected)
}

fn run_all(engine: &Engine, requests: &[GenerationRequest]) -> Vec<Output> {
    let receivers: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    receivers.into_iter().map(collect).collect()
}

/// The engine's figures once it has published the step that finished the last request
/// (a client may see `Done` just before).
fn settled_stats(engine: &Engine) -> SchedulerStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = engine.stats();
        if (stats.num_running == 0 && stats.num_waiting == 0) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn assert_no_blocks_held(engine: &Engine) {
    let stats = settled_stats(engine);
    assert_eq!(stats.num_running, 0);
    assert_eq!(
        stats.num_free_blocks, stats.num_blocks,
        "every KV block is free once all requests are done"
    );
    assert_eq!(
        stats.draft_kv_free_blocks, stats.draft_kv_blocks,
        "every draft KV block is free once all requests are done"
    );
}

/// Speculation by a draft model: the default model's own file, re-quantised or not. Drafting
/// is taken as free and a verified token priced at a fixed fraction of a step, so that every
/// sequence speculates, and proposes several tokens, whatever this machine's steps cost.
fn draft_config(quantize: Option<QuantizeTo>) -> EngineConfig {
    EngineConfig {
        speculative: SpeculativeConfig {
            draft_model: Some(default_model()),
            draft_quantize: quantize,
            draft_cost: Some(0.0),
            verify_cost: Some(0.1),
            ..config(SpeculativeMethod::Draft).speculative
        },
        ..config(SpeculativeMethod::Draft)
    }
}

/// Greedy requests give the off engine's tokens through `on`, alone and batched; returns
/// the acceptance rate over both rounds.
fn assert_greedy_tokens_unchanged(off: &Engine, on: &Engine, max_tokens: usize) -> f64 {
    let tok = off.tokenizer().clone();
    let requests: Vec<_> = prompts(&tok)
        .into_iter()
        .map(|p| greedy(p, max_tokens))
        .collect();
    let expected: Vec<Output> = requests
        .iter()
        .map(|r| collect(off.submit(r.clone()).unwrap()))
        .collect();
    for (r, want) in requests.iter().zip(&expected) {
        let got = collect(on.submit(r.clone()).unwrap());
        assert_eq!(&got, want, "alone");
    }
    let got = run_all(on, &requests);
    for (g, w) in got.iter().zip(&expected) {
        assert_eq!(g.ids, w.ids, "batched");
        assert_eq!(g.text, w.text, "batched");
    }
    let stats = settled_stats(on);
    assert!(stats.speculation.drafts > 0, "{:?}", stats.speculation);
    stats.speculation.acceptance_rate()
}

#[test]
fn greedy_tokens_are_the_same_with_and_without_speculation() {
    let (off, _) = engine(config(SpeculativeMethod::Off));
    let (on, _) = engine(config(SpeculativeMethod::Ngram));
    let tok = off.tokenizer().clone();
    let requests: Vec<_> = prompts(&tok).into_iter().map(|p| greedy(p, 48)).collect();
    let expected: Vec<Output> = requests
        .iter()
        .map(|r| collect(off.submit(r.clone()).unwrap()))
        .collect();
    // Alone, one after another.
    for (r, want) in requests.iter().zip(&expected) {
        let got = collect(on.submit(r.clone()).unwrap());
        assert_eq!(&got, want, "alone");
    }
    let spec = on.stats().speculation;
    assert!(spec.drafts > 0 && spec.accepted_tokens > 0, "{spec:?}");
    // All at once (batched with each other's decodes and prefill chunks), and again with
    // every prompt now in the prefix cache.
    for round in ["batched", "prefix-cache hits"] {
        let got = run_all(&on, &requests);
        for (g, w) in got.iter().zip(&expected) {
            assert_eq!(g.ids, w.ids, "{round}");
            assert_eq!(g.text, w.text, "{round}");
            assert_eq!(g.usage.completion_tokens, w.usage.completion_tokens);
        }
        if round == "prefix-cache hits" {
            assert!(got.iter().any(|g| g.usage.cached_tokens > 0));
        }
    }
    assert_no_blocks_held(&on);
}

#[test]
fn a_request_caps_its_own_speculation() {
    let (on, _) = engine(config(SpeculativeMethod::Ngram));
    let tok = on.tokenizer().clone();
    // The repeating sentence: proposals are found and accepted at nearly every step.
    let prompt = prompts(&tok)[2].clone();
    let capped = |cap: Option<usize>| GenerationRequest {
        num_speculative_tokens: cap,
        ..greedy(prompt.clone(), 40)
    };
    let want = collect(on.submit(capped(None)).unwrap());
    let mut before = settled_stats(&on).speculation;
    assert!(before.drafts > 0, "{before:?}");
    // 0: no proposal at all, every step after the first token is a plain decode.
    let got = collect(on.submit(capped(Some(0))).unwrap());
    assert_eq!(got.ids, want.ids);
    let after = settled_stats(&on).speculation;
    let spent = after.since(&before);
    assert_eq!((spent.drafts, spent.draft_tokens), (0, 0), "{spent:?}");
    assert_eq!(spent.plain_decodes, got.ids.len() as u64 - 1, "{spent:?}");
    before = after;
    // 2: verifications of at most two proposed tokens.
    let got = collect(on.submit(capped(Some(2))).unwrap());
    assert_eq!(got.ids, want.ids);
    let spent = settled_stats(&on).speculation.since(&before);
    assert!(spent.drafts > 0, "{spent:?}");
    assert!(spent.draft_tokens <= 2 * spent.drafts, "{spent:?}");
    // Every decode step is either a verification or a plain decode.
    let steps = spent.drafts + spent.plain_decodes;
    assert_eq!(
        steps + spent.accepted_tokens,
        got.ids.len() as u64 - 1,
        "{spent:?}"
    );
}

#[test]
fn the_engine_measures_what_a_longer_step_costs() {
    // The engine times its steps before it takes the first request.
    let started = |config: EngineConfig| {
        let (engine, _) = engine(config);
        let tok = engine.tokenizer().clone();
        collect(
            engine
                .submit(greedy(tok.encode("Hello", false), 1))
                .unwrap(),
        );
        settled_stats(&engine)
    };
    let measured = started(config(SpeculativeMethod::Ngram)).verify_cost;
    assert!(measured.is_finite() && measured >= 0.0, "{measured}");
    // A fallback to the assumed price would show as exactly that price.
    assert!(
        (measured - ASSUMED_VERIFY_COST).abs() > 1e-9,
        "the curve was not measured: {measured}"
    );
    let given = EngineConfig {
        speculative: SpeculativeConfig {
            verify_cost: Some(0.25),
            ..config(SpeculativeMethod::Ngram).speculative
        },
        ..config(SpeculativeMethod::Ngram)
    };
    assert_eq!(started(given).verify_cost, 0.25);
    assert_eq!(started(config(SpeculativeMethod::Off)).verify_cost, 0.0);
}

#[test]
fn seeded_sampling_and_logprobs_are_the_same_with_and_without_speculation() {
    let (off, _) = engine(config(SpeculativeMethod::Off));
    let (on, _) = engine(config(SpeculativeMethod::Ngram));
    let tok = off.tokenizer().clone();
    let requests: Vec<_> = prompts(&tok)
        .into_iter()
        .enumerate()
        .map(|(i, p)| sampled(p, 40, 1000 + i as u64, i % 2 == 0))
        .collect();
    let want = run_all(&off, &requests);
    let got = run_all(&on, &requests);
    assert_eq!(got, want);
    // Logprobs too, event by event.
    let events = |engine: &Engine, r: &GenerationRequest| {
        let mut rx = engine.submit(r.clone()).unwrap();
        let mut logprobs = Vec::new();
        while let Some(ev) = rx.blocking_recv() {
            if let GenerationEvent::Delta { logprobs: l, .. } = ev {
                logprobs.extend(l);
            }
        }
        logprobs
    };
    let lp_off = events(&off, &requests[0]);
    assert_eq!(lp_off.len(), want[0].ids.len());
    assert_eq!(events(&on, &requests[0]), lp_off);
    assert!(on.stats().speculation.accepted_tokens > 0);
    assert_no_blocks_held(&on);
}

#[test]
fn preempted_and_resumed_sequences_keep_their_tokens() {
    let (requests, expected) = greedy_without_speculation(40);
    let (tight, _) = engine(EngineConfig {
        kv_cache_memory: TIGHT_KV_MEMORY,
        ..config(SpeculativeMethod::Ngram)
    });
    let got = run_all(&tight, &requests);
    assert!(
        tight.stats().preemptions > 0,
        "the cache must be tight enough to preempt"
    );
    for (g, w) in got.iter().zip(&expected) {
        assert_eq!(g.ids, w.ids);
    }
    assert_no_blocks_held(&tight);

    // Resumed after 17 delivered tokens on an engine with speculation.
    let (on, _) = engine(config(SpeculativeMethod::Ngram));
    let tok = on.tokenizer().clone();
    for (r, w) in requests.iter().zip(&expected).take(3) {
        let delivered = &w.ids[..17];
        let text_len = tok.decode(delivered).len();
        let resumed = collect(
            on.submit(GenerationRequest {
                resume: Some(ResumeFrom {
                    token_ids: delivered.to_vec(),
                    text_len,
                }),
                ..r.clone()
            })
            .unwrap(),
        );
        assert_eq!(resumed.ids, w.ids[17..], "resumed ids");
        assert_eq!(resumed.usage.completion_tokens, w.usage.completion_tokens);
    }
}

#[test]
fn a_draft_model_leaves_greedy_and_seeded_tokens_unchanged() {
    let (off, _) = engine(config(SpeculativeMethod::Off));
    let (on, _) = engine(draft_config(None));
    // The target's own weights as the draft: it proposes what the target picks.
    let rate = assert_greedy_tokens_unchanged(&off, &on, 48);
    let spec = on.stats().speculation;
    eprintln!(
        "the target's own file as draft: acceptance {rate:.3}, mean accepted length {:.2}",
        spec.mean_accepted_length()
    );
    assert!(rate >= 0.9, "acceptance {rate}");
    assert!(spec.mean_accepted_length() > 2.0);
    assert_no_blocks_held(&on);

    let tok = off.tokenizer().clone();
    let requests: Vec<_> = prompts(&tok)
        .into_iter()
        .enumerate()
        .map(|(i, p)| sampled(p, 40, 2000 + i as u64, i % 2 == 1))
        .collect();
    let before = settled_stats(&on).speculation;
    assert_eq!(run_all(&on, &requests), run_all(&off, &requests));
    let after = settled_stats(&on).speculation;
    assert!(
        after.drafts > before.drafts,
        "sampled requests speculated too"
    );
    assert_no_blocks_held(&on);
}

#[test]
fn a_requantised_draft_model_leaves_greedy_tokens_unchanged() {
    let (off, _) = engine(config(SpeculativeMethod::Off));
    // Q8_0 weights of the Q4_1 file: a different model of the same vocabulary.
    let (on, _) = engine(draft_config(Some(QuantizeTo::Q8_0)));
    let rate = assert_greedy_tokens_unchanged(&off, &on, 48);
    let spec = on.stats().speculation;
    eprintln!(
        "Q8_0 draft for the Q4_1 target: acceptance {rate:.3}, mean accepted length {:.2}",
        spec.mean_accepted_length()
    );
    assert!(rate > 0.5, "acceptance {rate}");
    assert_no_blocks_held(&on);
}

#[test]
fn a_draft_model_survives_preemption_and_a_full_draft_cache() {
    let (requests, expected) = greedy_without_speculation(40);
    // Draft blocks for about two of the six sequences.
    let mut config = draft_config(None);
    config.kv_cache_memory = TIGHT_KV_MEMORY;
    config.speculative.draft_kv_blocks = Some(9);
    config.speculative.max_running = 64;
    let (tight, _) = engine(config);
    let got = run_all(&tight, &requests);
    let stats = settled_stats(&tight);
    assert!(
        stats.preemptions > 0,
        "the cache must be tight enough to preempt"
    );
    assert_eq!(stats.draft_kv_blocks, 9);
    assert!(
        stats.speculation.accepted_tokens > 0,
        "{:?}",
        stats.speculation
    );
    for (g, w) in got.iter().zip(&expected) {
        assert_eq!(g.ids, w.ids);
    }
    assert_no_blocks_held(&tight);
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.gguf");
    let draft = dir.path().join("draft.gguf");
    write_tiny_gguf(&target, &TinySpec::default()).unwrap();
    write_tiny_gguf(
        &draft,
        &TinySpec {
            vocab: 64,
            ..TinySpec::default()
        },
    )
    .unwrap();
    let start = |draft_model: Option<PathBuf>| {
        let file = ModelFile::open(&target).unwrap();
        let tokenizer = Arc::new(Tokenizer::from_gguf(file.content()).unwrap());
        Engine::start(
            Model::load(&file, None).unwrap(),
            tokenizer,
            EngineConfig {
                block_size: 4,
                kv_cache_memory: 1 << 20,
                speculative: SpeculativeConfig {
                    method: SpeculativeMethod::Draft,
                    draft_model,
                    ..SpeculativeConfig::default()
                },
                ..EngineConfig::default()
            },
        )
    };
    match start(Some(draft)) {
        Err(EngineError::Draft(
            e @ DraftError::VocabularySize {
                target: 96,
                draft: 64,
            },
        )) => {
            let message = e.to_string();
            assert!(
                message.contains("64") && message.contains("96"),
                "{message}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a draft of 64 tokens for a target of 96 was accepted"),
    }
    match start(None) {
        Err(EngineError::Invalid(m)) => assert!(m.contains("--draft-model"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("--speculative draft without a draft model was accepted"),
    }
    // The target's own file is a draft of the same vocabulary.
    assert!(start(Some(target.clone())).is_ok());
}

/// Chi-square critical value for `df` degrees of freedom at significance 0.001
/// (Wilson–Hilferty).
fn chi2_critical(df: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + 3.090 * a.sqrt()).powi(3)
}

/// On a tiny model with a 96-token vocabulary, the second token of 3,000 sampled requests,
/// verified against a proposal (the prompt holds every token but two, so the n-gram proposer
/// has one after almost any first token), follows the target's distribution given the first token: the softmax of
/// the model's own logits at temperature 0.7.
#[test]
fn sampled_tokens_follow_the_target_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::default()).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.content()).unwrap());
    let vocab = TinySpec::default().vocab;
    let prompt: Vec<u32> = (0..2).flat_map(|_| 2..vocab as u32).collect();
    let temperature = 0.7;
    let engine = Engine::start(
        Model::load(&file, None).unwrap(),
        tokenizer,
        EngineConfig {
            block_size: 4,
            kv_cache_memory: 8 << 20,
            threads: Some(1),
            speculative: SpeculativeConfig {
                method: SpeculativeMethod::Ngram,
                ngram_min: 1,
                // 50 requests at a time, every one speculating.
                max_running: 64,
                // A fixed, cheap price: this test is about the distribution, and a curve
                // measured on a busy machine may price every proposal out.
                verify_cost: Some(0.1),
                ..SpeculativeConfig::default()
            },
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let n = 3_000u64;
    let mut pairs: HashMap<u32, Vec<u32>> = HashMap::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let receivers: Vec<_> = chunk
            .iter()
            .map(|&seed| {
                // The third token leaves room for one proposal after the first.
                let mut r = sampled(prompt.clone(), 3, seed, false);
                r.sampling = SamplingParams {
                    temperature,
                    seed: Some(seed),
                    ..SamplingParams::default()
                };
                engine.submit(r).unwrap()
            })
            .collect();
        for rx in receivers {
            let ids = collect(rx).ids;
            pairs.entry(ids[0]).or_default().push(ids[1]);
        }
    }
    // A first token in the prompt always has a continuation there to propose (0 and 1
    // are not in it).
    let spec = settled_stats(&engine).speculation;
    let proposable: usize = pairs
        .iter()
        .filter(|(&first, _)| first >= 2)
        .map(|(_, seconds)| seconds.len())
        .sum();
    assert_eq!(
        spec.drafts, proposable as u64,
        "every such second token was verified: {spec:?}"
    );
    assert!(spec.accepted_tokens > 0, "{spec:?}");

    // The target: logits after prompt + first token, straight from the model.
    let model = Model::load(&file, None).unwrap();
    let target = |first: u32| -> Vec<f64> {
        let mut tokens = prompt.clone();
        tokens.push(first);
        let block_size = 16;
        let blocks = tokens.len().div_ceil(block_size);
        let mut kv = KvStorage::new(model.config(), Default::default(), blocks, block_size);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                tokens: &tokens,
                start_pos: 0,
                block_table: &table,
                num_logits: 1,
            }],
        };
        let logits = model.forward(&batch, &mut kv).unwrap();
        let max = logits.iter().fold(f32::MIN, |a, &b| a.max(b));
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| (f64::from(l - max) / f64::from(temperature)).exp())
            .collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect()
    };
    let (mut chi2, mut df) = (0.0, 0usize);
    for (&first, seconds) in &pairs {
        if first < 2 || seconds.len() < 50 {
            continue;
        }
        let p = target(first);
        let mut counts = vec![0usize; vocab];
        for &s in seconds {
            counts[s as usize] += 1;
        }
        // Cells expected at least 5 times; the rest pooled into one.
        let total = seconds.len() as f64;
        let (mut pooled_o, mut pooled_e, mut cells) = (0.0, 0.0, 0usize);
        for (o, pi) in counts.iter().zip(&p) {
            let e = total * pi;
            if e >= 5.0 {
                chi2 += (*o as f64 - e).powi(2) / e;
                cells += 1;
            } else {
                pooled_o += *o as f64;
                pooled_e += e;
            }
        }
        if pooled_e >= 5.0 {
            chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
            cells += 1;
        }
        df += cells.saturating_sub(1);
    }
    assert!(df >= 20, "too few cells to test ({df})");
    let critical = chi2_critical(df as f64);
    assert!(
        chi2 < critical,
        "chi2 {chi2:.1} over {df} df >= {critical:.1}"
    );
    assert_no_blocks_held(&engine);
}
