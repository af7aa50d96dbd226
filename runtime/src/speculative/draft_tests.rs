//! The draft proposer on tiny generated models: its proposals are the draft model's greedy
//! continuation computed from scratch, whatever its KV held before (first use, accepted and
//! rejected drafts, a diverging sequence, a prompt caught up in chunks, several sequences
//! at once), its KV holds only the sequence's tokens and the draft tokens it fed, a full
//! cache proposes nothing, and freeing returns every block.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use tidal_tokenizer::Tokenizer;

use super::*;
use crate::engine::EngineConfig;
use crate::model::{write_tiny_gguf, KvStorage, Model, ModelFile, TinySpec};
use crate::speculative::draft_cache::DraftCache;
use crate::speculative::{check_vocabulary, DraftError};

const BLOCK: usize = 4;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!("tidal-draft-test-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn model(&self, name: &str, spec: &TinySpec) -> PathBuf {
        let path = self.0.join(name);
        write_tiny_gguf(&path, spec).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(path: &Path) -> Model {
    Model::load(&ModelFile::open(path).unwrap(), None).unwrap()
}

/// A proposer over the model at `path` with `blocks` KV blocks, catching up `chunk` tokens
/// per call.
fn proposer(path: &Path, blocks: usize, chunk: usize) -> DraftProposer {
    let config = EngineConfig {
        block_size: BLOCK,
        threads: Some(1),
        ..EngineConfig::default()
    };
    let executor = Executor::new(load(path), &config, blocks).unwrap();
    let cache = DraftCache::new(blocks, BLOCK).unwrap();
    DraftProposer::new(executor, cache, chunk, Some(0.0), 1.0)
}

/// The model's greedy continuation of `tokens`, each token from a fresh prefill.
fn greedy(model: &Model, tokens: &[u32], k: usize) -> Vec<u32> {
    let mut t = tokens.to_vec();
    for _ in 0..k {
        let blocks = t.len().div_ceil(BLOCK);
        let mut kv = KvStorage::new(model.config(), Default::default(), blocks, BLOCK);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                tokens: &t,
                start_pos: 0,
                block_table: &table,
                num_logits: 1,
            }],
        };
        let logits = model.forward(&batch, &mut kv).unwrap();
        t.push(argmax(&logits));
    }
    t[tokens.len()..].to_vec()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7 + salt * 13) % 90 + 3)
        .collect()
}

fn one(p: &mut DraftProposer, id: SeqId, tokens: &[u32], k: usize) -> Vec<u32> {
    let out = p.propose(&[ProposalRequest { id, tokens, k }]);
    p.cache().check_invariants().unwrap();
    out.into_iter().next().unwrap()
}

#[test]
fn catch_up_and_rewind_keep_proposals_the_greedy_continuation() {
    let dir = TempDir::new();
    let path = dir.model("draft.gguf", &TinySpec::default());
    let model = load(&path);
    let mut p = proposer(&path, 32, 64);
    let mut seq = prompt(10, 1);

    // First use: the prompt, then k - 1 draft tokens fed.
    let d = one(&mut p, 1, &seq, 3);
    assert_eq!(d, greedy(&model, &seq, 3));
    let mut held = seq.clone();
    held.extend_from_slice(&d[..2]);
    assert_eq!(p.cache().held(1), Some(&held[..]));

    // The first draft accepted, the second rejected: the target's token differs.
    let correction = (d[1] + 1) % 90 + 3;
    seq.extend_from_slice(&[d[0], correction]);
    let d = one(&mut p, 1, &seq, 4);
    assert_eq!(d, greedy(&model, &seq, 4));
    let mut held = seq.clone();
    held.extend_from_slice(&d[..3]);
    assert_eq!(
        p.cache().held(1),
        Some(&held[..]),
        "the rejected draft is gone"
    );

    // All accepted plus the target's own token.
    seq.extend_from_slice(&d);
    seq.push(5);
    assert_eq!(one(&mut p, 1, &seq, 2), greedy(&model, &seq, 2));

    // Nothing accepted and no proposal asked for a while: one token more.
    seq.push(6);
    assert_eq!(one(&mut p, 1, &seq, 1), greedy(&model, &seq, 1));
    assert_eq!(
        p.cache().held(1),
        Some(&seq[..]),
        "k = 1 feeds no draft token"
    );

    // A sequence that shares nothing with what the id held starts over.
    let other = prompt(7, 9);
    assert_eq!(one(&mut p, 1, &other, 3), greedy(&model, &other, 3));

    p.free(1);
    assert_eq!(p.cache().held(1), None);
    assert_eq!(p.kv_blocks(), (32, 32), "every draft block is free again");
}

#[test]
fn sequences_propose_together_and_long_prompts_catch_up_in_chunks() {
    let dir = TempDir::new();
    let path = dir.model("draft.gguf", &TinySpec::default());
    let model = load(&path);
    let mut p = proposer(&path, 64, 16);
    let long = prompt(30, 2);
    let short: Vec<Vec<u32>> = (3..6).map(|s| prompt(4, s)).collect();
    let mut requests: Vec<ProposalRequest<'_>> = short
        .iter()
        .enumerate()
        .map(|(i, t)| ProposalRequest {
            id: i as SeqId + 10,
            tokens: t,
            k: 2 + i,
        })
        .collect();
    requests.push(ProposalRequest {
        id: 1,
        tokens: &long,
        k: 3,
    });
    // 16 tokens a call: the short ones (12) first, the long one's first 4 tokens.
    let out = p.propose(&requests);
    for (r, d) in requests.iter().zip(&out).take(3) {
        assert_eq!(d, &greedy(&model, r.tokens, r.k), "sequence {}", r.id);
    }
    assert!(out[3].is_empty(), "the long prompt is still catching up");
    assert_eq!(p.cache().held(1).map(<[u32]>::len), Some(4));
    p.cache().check_invariants().unwrap();
    // Alone it takes 16 tokens a call: 20, then 30 and its proposal.
    assert!(one(&mut p, 1, &long, 3).is_empty());
    assert_eq!(one(&mut p, 1, &long, 3), greedy(&model, &long, 3));
    for id in [1, 10, 11, 12] {
        p.free(id);
    }
    assert_eq!(p.kv_blocks(), (64, 64));
}

#[test]
fn a_full_draft_cache_proposes_nothing_until_blocks_are_free() {
    let dir = TempDir::new();
    let path = dir.model("draft.gguf", &TinySpec::default());
    let model = load(&path);
    // 12 positions: one sequence of 8 tokens and 2 draft tokens fed.
    let mut p = proposer(&path, 3, 64);
    let (a, b) = (prompt(8, 1), prompt(8, 2));
    assert_eq!(one(&mut p, 1, &a, 3), greedy(&model, &a, 3));
    assert!(one(&mut p, 2, &b, 3).is_empty(), "no room for a second");
    assert_eq!(p.cache().held(2), None);
    p.retain(|id| id != 1);
    assert_eq!(one(&mut p, 2, &b, 3), greedy(&model, &b, 3));
    // A proposal longer than the draft's context is cut to it.
    let ctx = TinySpec::default().context;
    p.free(2);
    let mut p = proposer(&path, 80, 512);
    let near_end = prompt(ctx - 1, 3);
    assert_eq!(one(&mut p, 3, &near_end, 5).len(), 2);
}

/// The tiny model's vocabulary with token `id` spelled `text`.
fn tokenizer_with(path: &Path, id: usize, text: &str) -> Tokenizer {
    let mut content = Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
    if let Some(Value::Array(tokens)) = content.metadata.get_mut("tokenizer.ggml.tokens") {
        tokens[id] = Value::String(text.into());
    }
    Tokenizer::from_gguf(&content).unwrap()
}

#[test]
fn vocabularies_must_match_token_for_token() {
    let dir = TempDir::new();
    let target = dir.model("target.gguf", &TinySpec::default());
    let same = dir.model(
        "same.gguf",
        &TinySpec {
            layers: 1,
            seed: 3,
            ..TinySpec::default()
        },
    );
    let smaller = dir.model(
        "smaller.gguf",
        &TinySpec {
            vocab: 80,
            ..TinySpec::default()
        },
    );
    let tok = |p: &Path| Tokenizer::from_gguf_file(p).unwrap();
    check_vocabulary(&tok(&target), &tok(&same)).unwrap();
    match check_vocabulary(&tok(&target), &tok(&smaller)) {
        Err(
            e @ DraftError::VocabularySize {
                target: 96,
                draft: 80,
            },
        ) => {
            let message = e.to_string();
            assert!(
                message.contains("80") && message.contains("96"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    match check_vocabulary(&tok(&target), &tokenizer_with(&same, 40, "zz")) {
        Err(DraftError::VocabularyToken { id: 40, draft, .. }) => assert_eq!(draft, "zz"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_proposer_gives_each_slot_its_own_draft() {
    use crate::speculative::proposer::{ProposalSlot, Proposer};
    use crate::speculative::{Acceptance, ProposalKind};
    let dir = TempDir::new();
    let path = dir.model("draft.gguf", &TinySpec::default());
    let model = load(&path);
    let mut p = Proposer::Draft(Box::new(proposer(&path, 32, 64)));
    let (a, b, c) = (prompt(9, 1), prompt(7, 2), prompt(11, 3));
    let fresh = Acceptance::new();
    let mut burnt = Acceptance::new();
    for _ in 0..20 {
        burnt.record(ProposalKind::Draft, 3, 0);
    }
    // The draft is free (cost 0) and a verified token costs 0.2 of a step: at the prior
    // acceptance (0.6) two tokens pay best, at a spent one none.
    let slots = [(1, &a, 3, &fresh), (2, &b, 3, &burnt), (3, &c, 2, &fresh)].map(
        |(id, tokens, limit, acceptance)| ProposalSlot {
            id,
            tokens: tokens.as_slice(),
            limit,
            acceptance,
        },
    );
    let out = p.propose(&slots, |k| 1.0 + 0.2 * k as f64);
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], Some((greedy(&model, &a, 2), ProposalKind::Draft)));
    assert_eq!(out[1], None, "a spent acceptance proposes nothing");
    assert_eq!(out[2], Some((greedy(&model, &c, 2), ProposalKind::Draft)));
}
