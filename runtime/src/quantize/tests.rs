//! Table tests of the mix rules against llama.cpp's choices for known shapes.

use candle_core::quantized::GgmlDType as G;

use super::*;
use crate::model::QuantMix;

/// The tensors of a llama-architecture model, in llama.cpp's order.
fn llama(layers: usize, hidden: usize, ffn: usize, kv: usize, tied: bool) -> Vec<TensorDesc> {
    let t = |name: String, dims: Vec<usize>| TensorDesc {
        name,
        dims,
        dtype: G::F32,
    };
    let mut out = vec![
        t("token_embd.weight".into(), vec![hidden, 1000]),
        t("output_norm.weight".into(), vec![hidden]),
    ];
    if !tied {
        out.push(t("output.weight".into(), vec![hidden, 1000]));
    }
    for i in 0..layers {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        out.extend([
            t(p("attn_norm"), vec![hidden]),
            t(p("attn_q"), vec![hidden, hidden]),
            t(p("attn_k"), vec![hidden, kv]),
            t(p("attn_v"), vec![hidden, kv]),
            t(p("attn_output"), vec![hidden, hidden]),
            t(p("ffn_norm"), vec![hidden]),
            t(p("ffn_gate"), vec![hidden, ffn]),
            t(p("ffn_up"), vec![hidden, ffn]),
            t(p("ffn_down"), vec![ffn, hidden]),
        ]);
    }
    out.sort_by(|a, b| llama_order(&a.name, &b.name));
    out
}

fn facts(layers: usize) -> ModelFacts {
    ModelFacts {
        arch: "llama".into(),
        layers,
        experts: 0,
        gqa: 4,
    }
}

fn plan(ftype: FileType, layers: usize, tensors: &[TensorDesc]) -> Vec<(String, G)> {
    let types = plan_types(ftype, &facts(layers), tensors).unwrap();
    tensors.iter().map(|t| t.name.clone()).zip(types).collect()
}

fn type_of(plan: &[(String, G)], name: &str) -> G {
    plan.iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| *t)
        .unwrap()
}

#[test]
fn llama_order_puts_layers_numerically_after_the_rest() {
    let mut names = vec![
        "blk.10.a",
        "blk.2.b",
        "output.weight",
        "blk.2.a",
        "token_embd.weight",
    ];
    names.sort_by(|a, b| llama_order(a, b));
    assert_eq!(
        names,
        [
            "output.weight",
            "token_embd.weight",
            "blk.2.a",
            "blk.2.b",
            "blk.10.a"
        ]
    );
}

#[test]
fn use_more_bits_marks_llamas_layers() {
    let marked: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
    assert_eq!(
        marked,
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    );
    let smollm: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
    assert_eq!(smollm, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
}

/// Llama 3 8B's Q4_K_M as the header-only fixture (`QuantMix::Q4KM`, checked against a real
/// llama.cpp file's types) has it.
#[test]
fn llama3_8b_q4_k_m_matches_the_known_mix() {
    let tensors = llama(32, 4096, 14336, 1024, false);
    for (name, ty) in plan(FileType::Q4_K_M, 32, &tensors) {
        assert_eq!(ty, QuantMix::Q4KM.type_of(&name, 32), "{name}");
    }
}

/// SmolLM2-135M: rows of 576 fit no K-quant, so Q4_K falls back to Q5_0 and Q6_K to Q8_0;
/// only `ffn_down` (rows of 1536) is a K-quant; the tied embedding is the output (Q8_0).
#[test]
fn smollm2_q4_k_m_falls_back_where_rows_are_576() {
    let tensors = llama(30, 576, 1536, 192, true);
    let p = plan(FileType::Q4_K_M, 30, &tensors);
    assert_eq!(type_of(&p, "token_embd.weight"), G::Q8_0);
    assert_eq!(type_of(&p, "output_norm.weight"), G::F32);
    assert_eq!(type_of(&p, "blk.0.attn_norm.weight"), G::F32);
    for i in 0..30 {
        let wide = use_more_bits(i, 30);
        let name = |s: &str| format!("blk.{i}.{s}.weight");
        assert_eq!(type_of(&p, &name("attn_q")), G::Q5_0);
        assert_eq!(type_of(&p, &name("ffn_up")), G::Q5_0);
        assert_eq!(
            type_of(&p, &name("attn_v")),
            if wide { G::Q8_0 } else { G::Q5_0 }
        );
        assert_eq!(
            type_of(&p, &name("ffn_down")),
            if wide { G::Q6K } else { G::Q4K }
        );
    }
    let q6 = plan(FileType::Q6_K, 30, &tensors);
    assert_eq!(type_of(&q6, "blk.3.attn_q.weight"), G::Q8_0);
    assert_eq!(type_of(&q6, "blk.3.ffn_down.weight"), G::Q6K);
    assert_eq!(type_of(&q6, "token_embd.weight"), G::Q8_0);
}

#[test]
fn small_mixes_and_the_output_tensor() {
    let tensors = llama(16, 4096, 11008, 4096, false);
    let s = plan(FileType::Q4_K_S, 16, &tensors);
    for i in 0..16 {
        let v = type_of(&s, &format!("blk.{i}.attn_v.weight"));
        assert_eq!(v, if i < 4 { G::Q5K } else { G::Q4K }, "attn_v {i}");
        let d = type_of(&s, &format!("blk.{i}.ffn_down.weight"));
        assert_eq!(d, if i < 2 { G::Q5K } else { G::Q4K }, "ffn_down {i}");
    }
    assert_eq!(type_of(&s, "output.weight"), G::Q6K);
    assert_eq!(type_of(&s, "token_embd.weight"), G::Q4K);
    let m5 = plan(FileType::Q5_K_M, 16, &tensors);
    assert_eq!(type_of(&m5, "blk.0.attn_v.weight"), G::Q6K);
    assert_eq!(type_of(&m5, "blk.3.attn_v.weight"), G::Q5K);
    assert_eq!(type_of(&m5, "blk.4.attn_v.weight"), G::Q6K);
    // The 32-weight file types still give the output matrix Q6_K where its rows allow,
    // as llama.cpp does; Q8_0 keeps it Q8_0.
    let q40 = plan(FileType::Q4_0, 16, &tensors);
    assert_eq!(type_of(&q40, "output.weight"), G::Q6K);
    assert_eq!(type_of(&q40, "blk.0.attn_v.weight"), G::Q4_0);
    let q80 = plan(FileType::Q8_0, 16, &tensors);
    assert!(q80
        .iter()
        .all(|(n, t)| *t == if n.contains("norm") { G::F32 } else { G::Q8_0 }));
}

#[test]
fn fallbacks_and_unfit_rows() {
    let t = |cols| {
        vec![TensorDesc {
            name: "blk.0.attn_q.weight".into(),
            dims: vec![cols, 8],
            dtype: G::F32,
        }]
    };
    assert_eq!(plan(FileType::Q4_K_M, 1, &t(96))[0].1, G::Q5_0);
    assert_eq!(plan(FileType::Q6_K, 1, &t(96))[0].1, G::Q8_0);
    assert_eq!(plan(FileType::Q5_K_M, 1, &t(96))[0].1, G::Q5_1);
    assert_eq!(plan(FileType::Q4_K_M, 1, &t(100))[0].1, G::F16);
    let err = plan_types(FileType::Q8_0, &facts(1), &t(100)).unwrap_err();
    assert_eq!(err.cols, 100);
    assert!(err.to_string().contains("blk.0.attn_q.weight"), "{err}");
}
