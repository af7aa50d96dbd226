//! `tidal bench profile` measures one replica on the default model and `tidal sim` replays the
//! shipped trace against that measured profile: the simulator's calibration path, end to end.

mod process;

use process::{default_model, tidal_json};

#[test]
fn a_measured_profile_drives_the_simulator() {
    let model = default_model();
    let profile = tidal_json(&[
        "bench",
        "profile",
        "--model",
        model.to_str().unwrap(),
        "--kv-cache-memory",
        "64MiB",
        "--name",
        "measured-here",
        "--prefill-tokens",
        "64",
        "--decode-context",
        "16",
        "--generate",
        "4",
        "--max-concurrent-seqs",
        "2",
        "--repeats",
        "1",
        "--node-and-image-s",
        "5",
        "--ttft-slo-s",
        "10",
    ]);
    let num = |key: &str| {
        profile[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} in {profile}"))
    };
    assert_eq!(profile["name"], "measured-here");
    assert_eq!(profile["maxConcurrentSeqs"], 2);
    assert!(num("prefillTokensPerS") > 0.0, "{profile}");
    let single = num("decodeTokensPerSSingle");
    let at_max = num("decodeTokensPerSAtMax");
    assert!(
        single > 0.0 && at_max >= single && at_max <= 2.0 * single,
        "{profile}"
    );
    // the cluster's part plus the measured load of a 96 MB model
    let cold = num("coldStartS");
    assert!((5.0..65.0).contains(&cold), "{profile}");
    assert_eq!(num("ttftSloS"), 10.0);
    let in_flight = num("targetInFlight");
    assert!((1.0..=2.0).contains(&in_flight), "{profile}");
    assert_eq!(profile["spotPriceMicrosPerHour"], 34_000);
    assert_eq!(profile["onDemandPriceMicrosPerHour"], 85_000);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    std::fs::write(&path, profile.to_string()).unwrap();
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/traces/azure-llm-2023-code.csv"
    );
    let report = tidal_json(&[
        "sim",
        "--trace",
        trace,
        "--service-profile",
        path.to_str().unwrap(),
        "--thin",
        "0.01",
        "--json",
    ]);
    assert_eq!(report["fleet"]["profile"]["name"], "measured-here");
    assert_eq!(report["fleet"]["profile"]["coldStartS"], cold);
    let requests = report["requests"].as_u64().unwrap();
    assert!(requests > 0);
    let policies = report["policies"].as_array().unwrap();
    // ours, ours-coldstart, KPA, KEDA, always-on at the peak and sized for the SLO (the
    // bounds are rows of their own)
    assert_eq!(policies.len(), 6, "{report}");
    // the fixed fleet sized for the SLO reaches 99 %, or as close to it as any fleet can: the
    // oracle row serves every request at its unloaded latency, and on a loaded machine the
    // measured prefill rate can put the longest prompts past the target (one request of
    // slack for the 100 ms steps)
    assert_eq!(policies[5]["name"], "always-on-slo");
    let best = report["oracle"]["slo_attainment"]
        .as_f64()
        .unwrap()
        .min(0.99);
    let sized = policies[5]["slo_attainment"].as_f64().unwrap();
    assert!(
        sized >= best - 1.0 / requests as f64,
        "{sized} < {best}: {report}"
    );
    assert!(
        report["always_on_slo_replicas"].as_u64().unwrap() <= 20,
        "{report}"
    );
    for p in policies {
        assert_eq!(p["completed"].as_u64(), Some(requests), "{p}");
        assert_eq!(p["lost"], 0, "{p}");
        // every fleet pays cold starts, so none beats the oracle that pays them too
        assert!(p["cost_vs_oracle"].as_f64().unwrap() >= 1.0, "{p}");
    }
}
