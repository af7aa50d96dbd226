//! `tidal runtime` as a process on the real default model: health while loading and after,
//! a request, and every metric the runtime promises on /metrics.

mod process;

use process::{default_model, free_port, KillOnDrop};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A minimal HTTP/1.1 request; returns (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(s);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut rest = String::new();
    reader.read_to_string(&mut rest)?;
    let body = rest
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

#[test]
fn runtime_serves_and_exports_metrics() {
    let model = default_model();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["runtime", "--model"])
        .arg(&model)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--model-name",
            "smol",
            "--kv-cache-memory",
            "128MiB",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = KillOnDrop(child);

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((200, _)) = http(port, "GET", "/health", "") {
            break;
        }
        assert!(Instant::now() < deadline, "runtime never became healthy");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http(
        port,
        "POST",
        "/v1/completions",
        r#"{"model":"smol","prompt":"The capital of France is","max_tokens":4,"temperature":0}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Paris"), "{body}");

    let (status, metrics) = http(port, "GET", "/metrics", "").unwrap();
    assert_eq!(status, 200);
    for name in [
        "tidal_requests_waiting",
        "tidal_requests_running",
        "tidal_kv_cache_usage_ratio",
        "tidal_prefix_cache_queries_total",
        "tidal_prefix_cache_hits_total",
        "tidal_prompt_tokens_total",
        "tidal_generation_tokens_total",
        "tidal_time_to_first_token_seconds_bucket",
        "tidal_inter_token_latency_seconds_bucket",
        "tidal_preemptions_total",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(name)),
            "/metrics lacks {name}:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("tidal_generation_tokens_total 4"),
        "{metrics}"
    );
}

/// Runs `tidal <command>` on a model file that does not exist with `flags`, expects it to
/// refuse them before loading anything, and returns what it printed on stderr.
fn refuses(command: &str, flags: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args([command, "--model", "unused.gguf"])
        .args(flags)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{command} {flags:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// [`refuses`] for `tidal up`, with every one of `says` in its error.
fn up_refuses(flags: &[&str], says: &[&str]) {
    let stderr = refuses("up", flags);
    for said in says {
        assert!(stderr.contains(said), "{flags:?}: no {said:?} in {stderr}");
    }
}

#[test]
fn a_zero_claim_prefill_budget_is_refused() {
    // a budget of 0 tokens could never claim: both commands that take it refuse it up front
    for command in ["runtime", "up"] {
        let stderr = refuses(command, &["--claim-prefill-budget-tokens", "0"]);
        assert!(
            stderr.contains("--claim-prefill-budget-tokens") && stderr.contains("zero"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn a_bad_claim_prefill_budget_duration_is_refused() {
    // `0s` is valid (no budget); what is not a duration is refused with the flag named
    for command in ["runtime", "up"] {
        for (value, why) in [
            ("soon", "not a duration"),
            ("1 parsec", "unknown duration unit"),
        ] {
            let stderr = refuses(command, &["--claim-prefill-budget", value]);
            assert!(
                stderr.contains("--claim-prefill-budget") && stderr.contains(why),
                "{command} {value}: {stderr}"
            );
        }
    }
}

#[test]
fn a_negative_prefill_rate_is_refused_before_anything_starts() {
    up_refuses(
        &["--prefill-tokens-per-second=-5"],
        &["scaling settings", "prefillTokensPerSecond"],
    );
    up_refuses(
        &["--decoding-weight", "1.5"],
        &[
            "--decoding-weight",
            "decodingWeight must be from 0 to 1, got 1.5",
        ],
    );
}

#[test]
fn a_bad_floor_window_is_refused_before_anything_starts() {
    up_refuses(
        &["--floor-window", "weekdays 08:00-19:00 1"],
        &["--floor-window", "\"weekdays\" are not days"],
    );
    up_refuses(
        &["--floor-window", "Mon-Fri 08:00-19:00 1 Mars/Base"],
        &["unknown time zone"],
    );
    up_refuses(
        &[
            "--max-workers",
            "1",
            "--floor-window",
            "daily 08:00-09:00 2",
        ],
        &[
            "--floor-window",
            "floorSchedule[0]: minReplicas (2) is greater than maxReplicas (1)",
        ],
    );
}

#[test]
fn more_min_workers_than_max_workers_is_refused_before_anything_starts() {
    up_refuses(
        &["--min-workers", "3", "--max-workers", "2"],
        &["scaling settings", "minReplicas (3)"],
    );
}

/// `tidal runtime --model M --dry-run` with `flags`: (exit code, stdout).
fn dry_run(model: &std::path::Path, flags: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["runtime", "--model"])
        .arg(model)
        .args(flags)
        .arg("--dry-run")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "$ tidal runtime --model {} {} --dry-run\n{stdout}",
        model.display(),
        flags.join(" ")
    );
    (out.status.code(), stdout)
}

#[test]
fn a_dry_run_plans_an_8b_model_for_an_l4_without_its_weights() {
    use tidal_runtime::model::{write_shape_gguf, QuantMix, ShapeSpec};
    // Llama 3 8B's header in the Q4_K_M mix, its 4.9 GB of data a sparse file's zeros.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("Meta-Llama-3-8B-Instruct-Q4_K_M.gguf");
    write_shape_gguf(&path, &ShapeSpec::llama3_8b(QuantMix::Q4KM)).unwrap();
    // The CUDA kernels read K-quants as stored: 4.30 GiB on the device (the embedding is a
    // lookup table on the host). An L4 (about 22 GiB free) holds them with an 8 GiB KV cache,
    // not with 18 GiB.
    let l4 = |kv: &str| {
        dry_run(
            &path,
            &[
                "--device",
                "cuda",
                "--device-memory",
                "22GiB",
                "--kv-cache-memory",
                kv,
                "--max-num-batched-tokens",
                "2048",
            ],
        )
    };
    let (code, out) = l4("8GiB");
    assert_eq!(code, Some(0), "{out}");
    for says in [
        "memory plan: Meta-Llama-3-8B-Instruct (llama, 32 layers) on cuda:0",
        "weights         4.30 GiB  (192 Q4K 3.13 GiB, 33 Q6K 1.17 GiB)",
        "KV cache        8.00 GiB  (65536 tokens, 131072 bytes each)",
        "available      22.00 GiB  (--device-memory)",
        "fits, with",
    ] {
        assert!(out.contains(says), "no {says:?} in\n{out}");
    }
    let (code, out) = l4("18GiB");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("the model does not fit cuda:0"), "{out}");
    assert!(out.contains("lower --kv-cache-memory to at most"), "{out}");
    // On the CPU every K-quant stays as stored: the file's 4.58 GiB.
    let (code, out) = dry_run(
        &path,
        &["--device-memory", "16GiB", "--kv-cache-memory", "8GiB"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("weights         4.58 GiB  (193 Q4K"), "{out}");
}

#[test]
fn a_model_over_the_device_memory_is_refused_before_it_loads() {
    let model = default_model();
    let (code, out) = dry_run(
        &model,
        &["--device-memory", "256MiB", "--kv-cache-memory", "1GiB"],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("does not fit cpu"), "{out}");
    // Without --dry-run the worker refuses the same way, before it loads a weight, and
    // leaves the verdict where Kubernetes shows it in the pod's status (and the controller
    // reads it).
    let dir = tempfile::tempdir().unwrap();
    let termination_log = dir.path().join("termination-log");
    std::fs::write(&termination_log, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["runtime", "--model"])
        .arg(&model)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--device-memory", "256MiB", "--kv-cache-memory", "1GiB"])
        .env("TIDAL_TERMINATION_LOG", &termination_log)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("does not fit cpu"), "{stderr}");
    assert!(
        stderr.contains("lower --kv-cache-memory to at most"),
        "{stderr}"
    );
    let message = std::fs::read_to_string(&termination_log).unwrap();
    assert!(message.starts_with("memory plan: "), "{message}");
    let verdict = message.lines().last().unwrap_or_default();
    assert!(
        verdict.starts_with("the model does not fit cpu: it needs"),
        "{message}"
    );
    // And a plan that fits runs.
    let (code, out) = dry_run(&model, &["--kv-cache-memory", "64MiB"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("the host's MemAvailable") || out.contains("cgroup"),
        "{out}"
    );
}
