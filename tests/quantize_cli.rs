//! `tidal quantize` as a process: a tiny generated model to Q4_K_M (JSON summary, a file the
//! runtime loads), and the errors for an unknown type and an unreadable input.

use std::process::Command;

use candle_core::quantized::GgmlDType;
use tidal_runtime::model::{write_tiny_gguf, Model, ModelFile, TinySpec};

fn tidal(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .arg("quantize")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn quantises_a_model_and_explains_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tiny.gguf");
    let output = dir.path().join("tiny-q4_k_m.gguf");
    write_tiny_gguf(
        &input,
        &TinySpec {
            dtype: GgmlDType::F32,
            hidden: 256,
            ffn: 512,
            ..TinySpec::default()
        },
    )
    .unwrap();

    let (code, stdout, stderr) = tidal(&[
        "--type".as_ref(),
        "q4_k_m".as_ref(),
        input.as_os_str(),
        output.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["type"], "q4_k_m");
    assert!(
        summary["tensor_types"]["Q4K"].as_u64().unwrap() > 0,
        "{summary}"
    );
    assert!(
        summary["output_tensor_bytes"].as_u64().unwrap() * 5
            < summary["input_tensor_bytes"].as_u64().unwrap(),
        "{summary}"
    );
    Model::load(&ModelFile::open(&output).unwrap(), None).unwrap();

    let (code, _, stderr) = tidal(&[
        "--type".as_ref(),
        "q3_k_xl".as_ref(),
        input.as_os_str(),
        output.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("unknown quantisation type `q3_k_xl`") && stderr.contains("q4_k_m"),
        "{stderr}"
    );

    let missing = dir.path().join("missing.gguf");
    let (code, _, stderr) = tidal(&[
        "--type".as_ref(),
        "q6_k".as_ref(),
        missing.as_os_str(),
        output.as_os_str(),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("quantising") && stderr.contains("missing.gguf"),
        "{stderr}"
    );
}
