//! The spec → policy mapping and the source parser.

use std::time::Duration;

use tidal_autoscaler::schedule::Tz;
use tidal_autoscaler::{
    CapacityMode as P, ScaleDownHold as H, ScalingSpec, SpecError, StableAggregate as A,
};
use tidal_crds::{
    CapacityMode, ColdStart, ColdStartSource, InvalidSpec, Model, ModelSpec, ScaleDownHold, Source,
    StableAggregate, TimeConstants,
};

/// The cold start a Model is sized on before it has one of its own.
const COLD: ColdStart = ColdStart::ASSUMED;

fn spec() -> ModelSpec {
    let m: Model =
        serde_yaml::from_str(include_str!("../examples/llama-spot-fallback.yaml")).unwrap();
    m.spec
}

#[test]
fn scaling_maps_every_field() {
    // the example leaves the scale-up rate unlimited (the default); set one to see it mapped
    let mut s = spec();
    s.scaling.max_scale_up_rate = 3.0;
    let got = s.scaling_spec(COLD).unwrap();
    assert_eq!(
        got,
        ScalingSpec {
            min_replicas: 0,
            max_replicas: 8,
            target_in_flight_per_replica: 16.0,
            scale_to_zero_after: Duration::from_secs(600),
            stable_window: Duration::from_secs(120),
            stable_aggregate: A::Max,
            panic_window: Duration::from_secs(12),
            panic_threshold: 2.0,
            scale_down_delay: Duration::from_secs(300),
            max_scale_up_rate: 3.0,
            max_scale_down_rate: 2.0,
            capacity_mode: P::SpotWithFallback,
            base_on_demand_replicas: 0,
            fallback_after: Duration::from_secs(60),
            prefill_tokens_per_second: 4000.0,
            ttft_target: Duration::from_secs(2),
            decoding_weight: 0.5,
            floor_schedule: vec![tidal_autoscaler::FloorWindow {
                days: 0b001_1111,
                start_minute: 8 * 60,
                end_minute: 19 * 60,
                min_replicas: 2,
                time_zone: Tz::Europe__Berlin,
            }],
            ..ScalingSpec::default()
        }
    );
    assert_eq!(
        (got.prefill_utilisation, got.prefill_tolerance_replicas),
        (0.75, 1.2),
        "the policy's defaults"
    );
}

#[test]
fn a_scaling_block_from_tidal_sim_tune_reads_back_as_its_setting() {
    use tidal_autoscaler::sim::tune::Setting;
    let tuned = Setting {
        stable_window_s: 180,
        stable_aggregate: A::Mean,
        scale_down_delay_s: 600,
        scale_to_zero_after_s: 1200,
        decoding_weight_percent: 100,
    };
    // every value differs from the example's, so a field the CRD does not read would show;
    // pasted over the example's scaling block: its fields replace the example's, the
    // example keeps the others (bounds, target, sizing, floors)
    let block: serde_yaml::Value = serde_yaml::from_str(&tuned.scaling_yaml()).unwrap();
    let mut s = spec();
    let mut scaling = serde_yaml::to_value(&s.scaling).unwrap();
    let fields = block["scaling"].as_mapping().unwrap();
    assert_eq!(fields.len(), 6);
    for (k, v) in fields {
        scaling
            .as_mapping_mut()
            .unwrap()
            .insert(k.clone(), v.clone());
    }
    s.scaling = serde_yaml::from_value(scaling).unwrap();
    let base = spec().scaling_spec(COLD).unwrap();
    assert_eq!(s.scaling_spec(COLD).unwrap(), tuned.apply(&base));
}

#[test]
fn knative_time_constants_give_the_policy_defaults() {
    let mut s = spec();
    s.scaling = Default::default();
    s.capacity = Default::default();
    s.scaling.stable_window_seconds = Some(60);
    s.scaling.stable_aggregate = Some(StableAggregate::Mean);
    s.scaling.panic_window_seconds = Some(6);
    s.scaling.scale_down_delay_seconds = Some(0);
    s.scaling.scale_to_zero_after_seconds = Some(120);
    // given, they stand whatever the cold start
    for cold in [COLD, ColdStart::measured(Duration::from_secs(7))] {
        assert_eq!(s.scaling_spec(cold).unwrap(), ScalingSpec::default());
    }
}

#[test]
fn time_constants_left_out_are_sized_on_the_cold_start() {
    let mut s = spec();
    s.scaling = Default::default();
    s.capacity = Default::default();
    // nothing given: the preset of the cold start, at the spec's TTFT target
    for c in [5, 20, 60, 90] {
        let c = Duration::from_secs(c);
        let assumed = ColdStart {
            duration: c,
            source: ColdStartSource::Assumed,
        };
        for cold in [ColdStart::measured(c), assumed] {
            assert_eq!(
                s.scaling_spec(cold).unwrap(),
                ScalingSpec::for_cold_start(c),
                "{cold:?}"
            );
        }
    }
    // a GPU model starting in 20 s gets the holds of a 60 s start (a restart misses a 2 s
    // target anyway); with a 30 s target, the same cold start gets its own 5c / 10c
    let gpu = s
        .scaling_spec(ColdStart::measured(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(
        (gpu.stable_window, gpu.panic_window, gpu.stable_aggregate),
        (Duration::from_secs(300), Duration::from_secs(30), A::Max)
    );
    assert_eq!(
        (gpu.scale_down_delay, gpu.scale_to_zero_after),
        (Duration::from_secs(300), Duration::from_secs(600))
    );
    s.scaling.ttft_target_milliseconds = 30_000;
    let cpu = s
        .scaling_spec(ColdStart::measured(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(
        (cpu.stable_window, cpu.panic_window, cpu.scale_down_delay),
        (
            Duration::from_secs(100),
            Duration::from_secs(10),
            Duration::from_secs(100)
        )
    );
    assert_eq!(cpu.scale_to_zero_after, Duration::from_secs(200));
    assert_eq!(cpu.ttft_target, Duration::from_secs(30));

    // the spec's cold start wins over a measured one
    s.scaling.cold_start_seconds = Some(13);
    assert_eq!(
        s.cold_start(Some(Duration::from_secs(40))),
        ColdStart::given(Duration::from_secs(13))
    );
    s.scaling.cold_start_seconds = None;
    assert_eq!(
        s.cold_start(Some(Duration::from_secs(40))),
        ColdStart::measured(Duration::from_secs(40))
    );
    assert_eq!(s.cold_start(None), COLD);

    // one given, the others sized: a given stable window gets a tenth as its panic window
    s.scaling.ttft_target_milliseconds = 2_000;
    s.scaling.stable_window_seconds = Some(45);
    let got = s.scaling_spec(COLD).unwrap();
    assert_eq!(
        (got.stable_window, got.panic_window),
        (Duration::from_secs(45), Duration::from_millis(4_500))
    );
    assert_eq!(got.scale_to_zero_after, Duration::from_secs(600));
    // a given panic window longer than the sized stable window lengthens it, so the spec
    // is valid whatever the cold start
    s.scaling.stable_window_seconds = None;
    s.scaling.panic_window_seconds = Some(400);
    s.scaling.ttft_target_milliseconds = 30_000;
    for c in [1, 20, 60, 3600] {
        let got = s
            .scaling_spec(ColdStart::measured(Duration::from_secs(c)))
            .unwrap();
        assert_eq!(got.panic_window, Duration::from_secs(400));
        assert_eq!(
            got.stable_window,
            (Duration::from_secs(5 * c)).max(Duration::from_secs(400)),
            "{c} s"
        );
    }
}

#[test]
fn the_status_shows_the_time_constants_in_force() {
    let mut s = spec();
    s.scaling.stable_window_seconds = None;
    s.scaling.panic_window_seconds = None;
    let cold = ColdStart::measured(Duration::from_secs(75));
    let policy = s.scaling_spec(cold).unwrap();
    let shown = TimeConstants::of(&policy, cold);
    assert_eq!(
        shown,
        TimeConstants {
            cold_start_seconds: 75,
            cold_start_source: ColdStartSource::Measured,
            // 5 x 75 s, sized; the rest as the example gives them
            stable_window_seconds: 375,
            stable_aggregate: StableAggregate::Max,
            panic_window_seconds: 37.5,
            scale_down_delay_seconds: 300,
            scale_to_zero_after_seconds: 600,
        }
    );
    assert_eq!(
        serde_json::to_value(&shown).unwrap(),
        serde_json::json!({
            "coldStartSeconds": 75,
            "coldStartSource": "Measured",
            "stableWindowSeconds": 375,
            "stableAggregate": "Max",
            "panicWindowSeconds": 37.5,
            "scaleDownDelaySeconds": 300,
            "scaleToZeroAfterSeconds": 600
        })
    );
    assert_eq!(
        TimeConstants::of(&policy, ColdStart::given(Duration::from_secs(9))).cold_start_source,
        ColdStartSource::Spec
    );
    assert_eq!(
        TimeConstants::of(&policy, COLD).cold_start_source,
        ColdStartSource::Assumed
    );
}

#[test]
fn modes_and_aggregates_map() {
    let mut s = spec();
    for (mode, want) in [
        (CapacityMode::Spot, P::Spot),
        (CapacityMode::OnDemand, P::OnDemand),
        (CapacityMode::SpotWithFallback, P::SpotWithFallback),
    ] {
        s.capacity.mode = mode;
        assert_eq!(s.scaling_spec(COLD).unwrap().capacity_mode, want);
    }
    s.scaling.stable_aggregate = Some(StableAggregate::Mean);
    assert_eq!(s.scaling_spec(COLD).unwrap().stable_aggregate, A::Mean);
    for (hold, want) in [
        (ScaleDownHold::Flat, H::Flat),
        (ScaleDownHold::PerLevel, H::PerLevel),
    ] {
        s.scaling.scale_down_hold = hold;
        assert_eq!(s.scaling_spec(COLD).unwrap().scale_down_hold, want);
    }
}

#[test]
fn inconsistent_scaling_is_rejected() {
    let mut s = spec();
    s.scaling.min_replicas = 9;
    assert_eq!(
        s.scaling_spec(COLD),
        Err(InvalidSpec::Scaling(SpecError::MinAboveMax {
            min: 9,
            max: 8
        }))
    );
    let mut s = spec();
    s.scaling.panic_window_seconds = Some(121);
    assert_eq!(
        s.scaling_spec(COLD),
        Err(InvalidSpec::Scaling(SpecError::PanicWindow))
    );
    let mut s = spec();
    s.capacity.base_on_demand_replicas = 9;
    assert_eq!(
        s.scaling_spec(COLD),
        Err(InvalidSpec::BaseAboveMax { base: 9, max: 8 })
    );
    let mut s = spec();
    s.scaling.max_scale_down_rate = 0.5;
    assert!(matches!(
        s.scaling_spec(COLD),
        Err(InvalidSpec::Scaling(SpecError::RateBelowOne { .. }))
    ));
    let mut s = spec();
    s.pricing.input_per_million_micros = -1;
    assert_eq!(
        s.validate(COLD),
        Err(InvalidSpec::NegativePrice("inputPerMillionMicros"))
    );
}

fn source(uri: &str, sha: Option<&str>) -> Result<Source, InvalidSpec> {
    let mut s = spec();
    s.source.uri = uri.into();
    s.source.sha256 = sha.map(String::from);
    s.source.revision = None;
    s.source()
}

const SHA: &str = "647a2b64cbcdbe670432d0502ebb2592b36dd364d51a9ef7a1387b7e3e4b8b8a";

#[test]
fn sources_parse() {
    assert_eq!(
        source("file:///models/a.gguf", None),
        Ok(Source::File {
            path: "/models/a.gguf".into()
        })
    );
    let https = source("https://h.example/x/a.gguf?sig=1", Some(SHA)).unwrap();
    assert_eq!(
        https.download_url().as_deref(),
        Some("https://h.example/x/a.gguf?sig=1")
    );
    assert_eq!(https.file_name(), "a.gguf");
    assert_eq!(https.sha256(), Some(SHA));
    let hf = source("hf://org/repo/sub/dir/m.gguf", None).unwrap();
    assert_eq!(
        hf,
        Source::HuggingFace {
            repo: "org/repo".into(),
            file: "sub/dir/m.gguf".into(),
            revision: "main".into(),
            sha256: None,
        }
    );
    assert_eq!(
        hf.download_url().as_deref(),
        Some("https://huggingface.co/org/repo/resolve/main/sub/dir/m.gguf")
    );
    assert_eq!(hf.file_name(), "m.gguf");
}

#[test]
fn bad_sources_are_rejected() {
    for (uri, sha) in [
        ("https://h.example/a.gguf", None),
        ("https://h.example/a.gguf", Some("abc")),
        ("file://relative.gguf", None),
        ("hf://org/repo", None),
        ("hf://org//file", None),
        ("s3://bucket/a.gguf", None),
        ("https:///a.gguf", Some(SHA)),
    ] {
        assert!(
            matches!(source(uri, sha), Err(InvalidSpec::Source(_))),
            "{uri} {sha:?}"
        );
    }
}

#[test]
fn floor_schedule_maps_days_and_times() {
    use tidal_autoscaler::FloorWindow;
    use tidal_crds::{ScheduledFloor, Weekday};
    let mut s = spec();
    let window = |days: Vec<Weekday>, start: &str, end: &str, min_replicas| ScheduledFloor {
        days,
        start: start.into(),
        end: end.into(),
        min_replicas,
        time_zone: None,
    };
    s.scaling.floor_schedule = vec![
        window(vec![Weekday::Mon, Weekday::Fri], "08:00", "18:30", 4),
        ScheduledFloor {
            time_zone: Some("Asia/Kolkata".into()),
            ..window(vec![], "22:15", "02:00", 1)
        },
        window(vec![Weekday::Sun], "00:00", "23:59", 8),
    ];
    assert_eq!(
        s.scaling_spec(COLD).unwrap().floor_schedule,
        vec![
            FloorWindow {
                days: 0b001_0001,
                start_minute: 480,
                end_minute: 1110,
                min_replicas: 4,
                time_zone: Tz::UTC,
            },
            FloorWindow {
                days: 0b111_1111,
                start_minute: 1335,
                end_minute: 120,
                min_replicas: 1,
                time_zone: Tz::Asia__Kolkata,
            },
            FloorWindow {
                days: 0b100_0000,
                start_minute: 0,
                end_minute: 1439,
                min_replicas: 8,
                time_zone: Tz::UTC,
            },
        ]
    );
    for time in [
        "8:00", "24:00", "12:60", "ab:cd", "1200", "12:00:00", "+1:00",
    ] {
        s.scaling.floor_schedule = vec![window(vec![], "06:00", time, 1)];
        assert_eq!(
            s.scaling_spec(COLD),
            Err(InvalidSpec::FloorTime {
                index: 0,
                time: time.into()
            }),
            "{time}"
        );
    }
    // names outside the IANA database (which is case-sensitive), and abbreviations that are
    // not zones, are refused with the entry's index
    for zone in ["Europe/Berln", "europe/berlin", "CEST", "", "UTC+2"] {
        s.scaling.floor_schedule = vec![
            window(vec![], "06:00", "07:00", 1),
            ScheduledFloor {
                time_zone: Some(zone.into()),
                ..window(vec![], "06:00", "07:00", 1)
            },
        ];
        let err = s.scaling_spec(COLD).unwrap_err();
        assert_eq!(
            err,
            InvalidSpec::FloorTimeZone {
                index: 1,
                zone: zone.into()
            },
            "{zone}"
        );
        assert!(err.to_string().contains("IANA name"), "{err}");
    }
    // a window above maxReplicas (8 in the example)
    s.scaling.floor_schedule = vec![
        window(vec![], "06:00", "07:00", 1),
        window(vec![], "06:00", "07:00", 9),
    ];
    let err = s.scaling_spec(COLD).unwrap_err().to_string();
    assert_eq!(
        err,
        "floorSchedule[1]: minReplicas (9) is greater than maxReplicas (8)"
    );
}
