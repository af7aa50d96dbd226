//! Our quantisers on blocks llama.cpp wrote: the Q4_K, Q6_K, Q5_0 and Q8_0 tensors of Gemma 3
//! 270M (Q4_K_M, fetched by `scripts/fetch-model.sh gemma3`), dequantised and quantised again
//! to their own type. The values already lie on one of the type's grids, so the round trip
//! must land on (nearly) the same values. Measured: every Q5_0 and Q8_0 block and 99.9% of
//! the Q4_K blocks come back byte for byte, 86% of the Q6_K blocks (its scale search
//! need not find the grid it started from), and no value moves by more than 0.43 of its
//! block's step.

use std::io::{Read, Seek, SeekFrom};

use crate::test_util::skip;
use crate::QuantType;
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;

fn gemma3() -> Option<std::path::PathBuf> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/fetch-model.sh");
    match std::process::Command::new("bash")
        .arg(script)
        .arg("gemma3")
        .output()
    {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).trim().into()),
        Ok(out) => {
            skip(&format!(
                "cannot fetch Gemma 3: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            None
        }
        Err(e) => {
            skip(&format!("cannot run fetch-model.sh: {e}"));
            None
        }
    }
}

fn quant_type(d: GgmlDType) -> Option<QuantType> {
    Some(match d {
        GgmlDType::Q4K => QuantType::Q4_K,
        GgmlDType::Q6K => QuantType::Q6_K,
        GgmlDType::Q5_0 => QuantType::Q5_0,
        GgmlDType::Q8_0 => QuantType::Q8_0,
        _ => return None,
    })
}

#[test]
fn requantising_llama_cpp_blocks_gives_back_their_values() {
    let Some(path) = gemma3() else { return };
    let mut f = std::fs::File::open(&path).unwrap();
    let content = Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    // Per type: blocks identical, blocks, worst error in steps.
    let mut seen = std::collections::BTreeMap::<String, (usize, usize, f64)>::new();
    for name in names {
        let info = &content.tensor_infos[name];
        let Some(ty) = quant_type(info.ggml_dtype) else {
            continue;
        };
        let n = info.shape.elem_count();
        let mut w = vec![0u8; n / ty.block_elems() * ty.block_bytes()];
        f.seek(SeekFrom::Start(content.tensor_data_offset + info.offset))
            .unwrap();
        f.read_exact(&mut w).unwrap();
        let mut x = vec![0.0; n];
        ty.dequantize(&w, &mut x);
        let mut again = vec![0u8; w.len()];
        ty.quantize(&x, &mut again);
        let mut y = vec![0.0; n];
        ty.dequantize(&again, &mut y);
        let bb = ty.block_bytes();
        let same_blocks = w
            .chunks(bb)
            .zip(again.chunks(bb))
            .filter(|(a, b)| a == b)
            .count();
        // Error relative to each block's step (its largest magnitude over the levels).
        let levels = match ty {
            QuantType::Q4_K => 15.0,
            QuantType::Q6_K => 63.0,
            QuantType::Q5_0 => 31.0,
            _ => 254.0,
        };
        let mut worst = 0.0f64;
        for (xb, yb) in x.chunks(ty.block_elems()).zip(y.chunks(ty.block_elems())) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let step = 2.0 * amax / levels;
            for (a, b) in xb.iter().zip(yb) {
                let e = (*a as f64 - *b as f64).abs();
                if step > 0.0 {
                    worst = worst.max(e / step);
                } else {
                    assert_eq!(e, 0.0, "{name}: a zero block came back non-zero");
                }
            }
        }
        let entry = seen.entry(format!("{ty:?}")).or_default();
        entry.0 += same_blocks;
        entry.1 += w.len() / bb;
        entry.2 = entry.2.max(worst);
    }
    for (ty, (same, total, worst)) in &seen {
        eprintln!("{ty}: {same} of {total} blocks requantise to the same bytes; worst error {worst:.3} steps");
        // (least fraction of identical blocks, largest error in steps)
        let (identical, steps) = match ty.as_str() {
            "Q4_K" => (0.995, 0.5),
            "Q6_K" => (0.8, 0.3),
            _ => (1.0, 0.0),
        };
        assert!(
            *same as f64 >= identical * *total as f64,
            "{ty}: {same} of {total} identical"
        );
        assert!(*worst <= steps, "{ty}: error of {worst} steps");
    }
    assert_eq!(
        seen.len(),
        4,
        "expected Q4_K, Q6_K, Q5_0 and Q8_0 tensors, found {seen:?}"
    );
}
