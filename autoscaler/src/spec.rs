//! The scaling and capacity part of a `Model`'s spec, as the policy reads it.
//!
//! Field names and defaults follow Knative's KPA where the concept is the same (stable window
//! 60 s, panic window 6 s = 10 % of it, panic threshold 200 %, max scale-up rate 1000, max
//! scale-down rate 2); serde uses camelCase so the CRD crate can embed these types unchanged.

use crate::schedule::{scheduled_floor, FloorWindow, MINUTES_PER_DAY};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use thiserror::Error;

/// Which capacity types a model's replicas may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CapacityMode {
    /// Only spot/preemptible capacity (plus `baseOnDemandReplicas`); no fallback.
    Spot,
    /// Only on-demand capacity.
    OnDemand,
    /// Spot first; on-demand replaces spot replicas that are unavailable or interrupted.
    #[default]
    SpotWithFallback,
}

/// How stable mode summarises demand over the stable window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum StableAggregate {
    /// The window's mean (Knative's KPA).
    #[default]
    Mean,
    /// The window's highest one-second demand: capacity for the recent burst, for models whose
    /// cold start is longer than their bursts (a replica started for a burst arrives too late).
    Max,
}

/// How the scale-down delay holds the targets of its trailing period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ScaleDownHold {
    /// The highest target of the trailing `scaleDownDelay` (Knative's `scale-down-delay`).
    #[default]
    Flat,
    /// Replica level `k` of a past target is held for `scaleDownDelay / k`: the first replica
    /// for the whole delay, the extra replicas of a large burst for a fraction of it. Measured
    /// in `tidal sim`, not the default (docs/autoscaling.md, "Prefill sizing").
    PerLevel,
}

/// Autoscaling parameters of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScalingSpec {
    /// Lower bound on serving replicas (0 allows scale to zero).
    pub min_replicas: u32,
    /// Upper bound on serving replicas.
    pub max_replicas: u32,
    /// Requests (queued + running) one replica is sized for.
    pub target_in_flight_per_replica: f64,
    /// Idle time (no backlog, nothing in flight, no new request) before scaling to zero.
    #[serde(with = "secs")]
    pub scale_to_zero_after: Duration,
    /// Window over which demand is averaged for normal (stable-mode) decisions.
    #[serde(with = "secs")]
    pub stable_window: Duration,
    /// How the stable window's demand is summarised.
    pub stable_aggregate: StableAggregate,
    /// Short window whose average triggers panic mode.
    #[serde(with = "secs")]
    pub panic_window: Duration,
    /// Panic when the panic-window desire is at least this multiple of ready replicas.
    pub panic_threshold: f64,
    /// Scale down only to the highest target of this trailing period (Knative's
    /// `scale-down-delay`), so replicas started for a burst are not cancelled while they
    /// are still cold-starting. Zero disables it.
    #[serde(with = "secs")]
    pub scale_down_delay: Duration,
    /// How the scale-down delay holds past targets.
    pub scale_down_hold: ScaleDownHold,
    /// At most this multiple of the ready replicas per decision (scale up).
    pub max_scale_up_rate: f64,
    /// At least ready replicas divided by this per decision (scale down).
    pub max_scale_down_rate: f64,
    /// Which capacity types to use.
    pub capacity_mode: CapacityMode,
    /// On-demand replicas kept as a floor whenever the model has any replica (latency floor).
    pub base_on_demand_replicas: u32,
    /// How long a spot pod may stay Pending before an on-demand replica replaces it.
    #[serde(with = "secs")]
    pub fallback_after: Duration,
    /// Prompt tokens per second one replica prefills (`tidal bench profile` measures it).
    /// Above zero, the policy also sizes for the prompts that arrived within the last
    /// `ttftTarget`: a burst of long prompts needs replicas that a request count misses.
    /// Zero (the default) sizes on request counts alone.
    pub prefill_tokens_per_second: f64,
    /// The time to first token the prefill sizing is for.
    #[serde(with = "secs")]
    pub ttft_target: Duration,
    /// Size so that the prompts of one `ttftTarget` take this fraction of the replicas'
    /// prefill time (headroom for queueing within the window).
    pub prefill_utilisation: f64,
    /// Replicas' worth of prefill overflow left to the request-count sizing and to the
    /// requests' TTFT slack before the prefill sizing adds a replica: a short overflow of
    /// one replica should not buy a second one held for the whole stable window.
    pub prefill_tolerance_replicas: f64,
    /// Floors by time of day (each on the clock of its time zone) that raise `minReplicas`
    /// while they hold ([`Self::at_wall_clock`]); empty: `minReplicas` all day.
    pub floor_schedule: Vec<FloorWindow>,
    /// What a job that has delivered its first token (and only decodes now) weighs in the
    /// demand, as a fraction of a queued or prefilling one, from 0 to 1. 1 (the default)
    /// counts every job alike, as Knative counts concurrency. Lower, the tail of a burst,
    /// whose jobs only decode, no longer buys replicas the warm fleet carries; it costs SLO
    /// where those replicas were prefill headroom (docs/autoscaling.md, "Decoding weight").
    pub decoding_weight: f64,
}

impl Default for ScalingSpec {
    fn default() -> Self {
        Self {
            min_replicas: 0,
            max_replicas: 10,
            target_in_flight_per_replica: 8.0,
            scale_to_zero_after: Duration::from_secs(120),
            stable_window: Duration::from_secs(60),
            stable_aggregate: StableAggregate::Mean,
            panic_window: Duration::from_secs(6),
            panic_threshold: 2.0,
            scale_down_delay: Duration::ZERO,
            scale_down_hold: ScaleDownHold::Flat,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            capacity_mode: CapacityMode::SpotWithFallback,
            base_on_demand_replicas: 0,
            fallback_after: Duration::from_secs(30),
            prefill_tokens_per_second: 0.0,
            ttft_target: Duration::from_secs(2),
            prefill_utilisation: 0.75,
            prefill_tolerance_replicas: 1.2,
            floor_schedule: Vec::new(),
            decoding_weight: 1.0,
        }
    }
}

/// A spec the policy cannot act on.
#[derive(Debug, Error, PartialEq)]
pub enum SpecError {
    /// `minReplicas` above `maxReplicas`.
    #[error("minReplicas ({min}) is greater than maxReplicas ({max})")]
    MinAboveMax {
        /// minReplicas
        min: u32,
        /// maxReplicas
        max: u32,
    },
    /// A ratio or target that must be positive and finite is not.
    #[error("{field} must be a positive finite number, got {value}")]
    NotPositive {
        /// the camelCase field name
        field: &'static str,
        /// the offending value
        value: f64,
    },
    /// The panic window must be non-zero and no longer than the stable window.
    #[error("panicWindow must be non-zero and at most stableWindow")]
    PanicWindow,
    /// A rate or count that must be zero or more (and finite) is not.
    #[error("{field} must be a finite number of at least 0, got {value}")]
    Negative {
        /// the camelCase field name
        field: &'static str,
        /// the offending value
        value: f64,
    },
    /// `decodingWeight` outside `[0, 1]`.
    #[error("decodingWeight must be from 0 to 1, got {0}")]
    DecodingWeight(f64),
    /// `prefillUtilisation` outside `(0, 1]`.
    #[error("prefillUtilisation must be above 0 and at most 1, got {0}")]
    Utilisation(f64),
    /// Prefill sizing needs a TTFT target to size for.
    #[error("ttftTarget must be above zero when prefillTokensPerSecond is set")]
    NoTtftTarget,
    /// A scheduled floor that cannot hold or exceeds `maxReplicas`.
    #[error("floorSchedule[{index}]: {why}")]
    FloorWindow {
        /// position in `floorSchedule`
        index: usize,
        /// what is wrong with it
        why: String,
    },
    /// Scale-up/down rates below 1 would forbid moving in that direction at all.
    #[error("{field} must be at least 1.0, got {value}")]
    RateBelowOne {
        /// the camelCase field name
        field: &'static str,
        /// the offending value
        value: f64,
    },
}

/// The shortest stable window and scale-down delay of [`ScalingSpec::with_cold_start`] when
/// a cold start is longer than the TTFT target: those of a 60 s cold start, the shipped
/// profiles' (docs/autoscaling.md, "Steady state").
pub const RESTART_MISS_HOLD: Duration = Duration::from_secs(300);

/// The shortest scale-to-zero time of [`ScalingSpec::with_cold_start`] when a cold start is
/// longer than the TTFT target (see [`RESTART_MISS_HOLD`]).
pub const RESTART_MISS_ZERO: Duration = Duration::from_secs(600);

impl ScalingSpec {
    /// The defaults with windows and delays scaled to a slow cold start `c` (GPU nodes,
    /// large images and weights): a replica cannot help sooner than `c`, so reacting to
    /// bursts shorter than that only buys replicas that arrive after the burst; instead the
    /// fleet keeps capacity for the highest demand of the stable window. Stable window and
    /// scale-down delay `5c` (at least 60 s) sized on the window's peak, panic window a tenth
    /// of the stable window, scale to zero after `10c` (at least 120 s). The scale-up rate
    /// stays unlimited: it is relative to ready replicas, which grow only once per cold
    /// start, so a limit of `r` would let a burst reach `r^k` times the fleet only after
    /// `k` cold starts (on the CPU trace, 2 cost 0.3-1.8 points of SLO; docs/autoscaling.md).
    /// The TTFT target is the default's (2 s), so the holds are those of
    /// [`Self::with_cold_start`] for a cold start longer than it.
    pub fn for_cold_start(c: Duration) -> Self {
        Self::default().with_cold_start(c)
    }

    /// This spec with the windows and delays of [`Self::for_cold_start`] (and its
    /// `Flat` hold); every other field (bounds, target, capacity, prefill sizing) is kept.
    ///
    /// When `c` is longer than this spec's `ttft_target`, the holds are at least
    /// [`RESTART_MISS_HOLD`] and [`RESTART_MISS_ZERO`]: every request that arrives while
    /// a replica restarts then misses the target however short `c` is, so the holds must
    /// outlast the traffic's silences and bursts, which do not shrink with `c` (on the
    /// simulated GPU fleet with a 20 s cold start, `5c` holds reached 88 % of requests
    /// within 2 s on the trace as-is, these 99.7-100 %; docs/autoscaling.md, "Steady state").
    pub fn with_cold_start(self, c: Duration) -> Self {
        let restart_misses = c > self.ttft_target;
        let (hold_floor, zero_floor) = if restart_misses {
            (RESTART_MISS_HOLD, RESTART_MISS_ZERO)
        } else {
            (Duration::ZERO, Duration::ZERO)
        };
        let stable = (c * 5).max(hold_floor).max(Duration::from_secs(60));
        Self {
            stable_window: stable,
            panic_window: stable / 10,
            stable_aggregate: StableAggregate::Max,
            scale_down_delay: (c * 5).max(hold_floor),
            scale_down_hold: ScaleDownHold::Flat,
            scale_to_zero_after: (c * 10).max(zero_floor).max(Duration::from_secs(120)),
            ..self
        }
    }

    /// Checks the invariants `decide` relies on.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.min_replicas > self.max_replicas {
            return Err(SpecError::MinAboveMax {
                min: self.min_replicas,
                max: self.max_replicas,
            });
        }
        for (field, value) in [
            (
                "targetInFlightPerReplica",
                self.target_in_flight_per_replica,
            ),
            ("panicThreshold", self.panic_threshold),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(SpecError::NotPositive { field, value });
            }
        }
        for (field, value) in [
            ("maxScaleUpRate", self.max_scale_up_rate),
            ("maxScaleDownRate", self.max_scale_down_rate),
        ] {
            if !(value.is_finite() && value >= 1.0) {
                return Err(SpecError::RateBelowOne { field, value });
            }
        }
        if self.panic_window.is_zero() || self.panic_window > self.stable_window {
            return Err(SpecError::PanicWindow);
        }
        for (field, value) in [
            ("prefillTokensPerSecond", self.prefill_tokens_per_second),
            ("prefillToleranceReplicas", self.prefill_tolerance_replicas),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(SpecError::Negative { field, value });
            }
        }
        if !(self.prefill_utilisation > 0.0 && self.prefill_utilisation <= 1.0) {
            return Err(SpecError::Utilisation(self.prefill_utilisation));
        }
        if !(0.0..=1.0).contains(&self.decoding_weight) {
            return Err(SpecError::DecodingWeight(self.decoding_weight));
        }
        if self.prefill_tokens_per_second > 0.0 && self.ttft_target.is_zero() {
            return Err(SpecError::NoTtftTarget);
        }
        for (index, w) in self.floor_schedule.iter().enumerate() {
            let bad = |why: String| Err(SpecError::FloorWindow { index, why });
            if w.days == 0 || w.days > crate::schedule::EVERY_DAY {
                return bad(format!(
                    "days mask {:#b} names no day or a day past Sunday",
                    w.days
                ));
            }
            if w.start_minute >= MINUTES_PER_DAY || w.end_minute >= MINUTES_PER_DAY {
                return bad("start and end must be minutes of a day (0 to 1439)".into());
            }
            if w.min_replicas > self.max_replicas {
                return bad(format!(
                    "minReplicas ({}) is greater than maxReplicas ({})",
                    w.min_replicas, self.max_replicas
                ));
            }
        }
        Ok(())
    }

    /// This spec as it holds at wall-clock time `unix_secs` (seconds since the Unix epoch):
    /// `minReplicas` raised to the floor of the `floorSchedule` windows that hold then. The
    /// caller that knows the wall clock (the controller) applies it before [`crate::decide`],
    /// whose own clock need only be monotonic.
    pub fn at_wall_clock(&self, unix_secs: u64) -> std::borrow::Cow<'_, ScalingSpec> {
        let floor = scheduled_floor(&self.floor_schedule, unix_secs);
        if floor <= self.min_replicas {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(ScalingSpec {
            min_replicas: floor,
            ..self.clone()
        })
    }
}

/// Durations as (fractional) seconds in JSON/YAML, as the CRD writes them.
pub(crate) mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_camel_case() {
        let spec = ScalingSpec::default();
        spec.validate().unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["scaleToZeroAfter"], 120.0);
        assert_eq!(json["capacityMode"], "SpotWithFallback");
        let back: ScalingSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn cold_start_scaling_keeps_knative_floors() {
        // a cold start within the TTFT target (a CPU model with a 30 s target): Knative's
        // floors, and a delay of 5c
        let cpu = ScalingSpec {
            ttft_target: Duration::from_secs(30),
            ..ScalingSpec::default()
        };
        let fast = cpu.clone().with_cold_start(Duration::from_secs(5));
        assert_eq!(
            (fast.stable_window, fast.panic_window),
            (Duration::from_secs(60), Duration::from_secs(6))
        );
        assert_eq!(
            (fast.scale_down_delay, fast.scale_to_zero_after),
            (Duration::from_secs(25), Duration::from_secs(120))
        );
        let at_target = cpu.with_cold_start(Duration::from_secs(30));
        assert_eq!(
            (at_target.stable_window, at_target.scale_down_delay),
            (Duration::from_secs(150), Duration::from_secs(150))
        );
        assert_eq!(at_target.scale_to_zero_after, Duration::from_secs(300));
        // longer than the target (2 s by default), however short: a restart under load
        // misses, so the holds are those of a 60 s cold start
        for c in [3, 5, 20, 45, 60] {
            let gpu = ScalingSpec::for_cold_start(Duration::from_secs(c));
            assert_eq!(
                (gpu.stable_window, gpu.panic_window, gpu.scale_down_delay),
                (RESTART_MISS_HOLD, RESTART_MISS_HOLD / 10, RESTART_MISS_HOLD),
                "{c} s"
            );
            assert_eq!(gpu.scale_to_zero_after, RESTART_MISS_ZERO, "{c} s");
            gpu.validate().unwrap();
        }
        // at or under the target: the scaled holds
        let instant = ScalingSpec::for_cold_start(Duration::from_secs(2));
        assert_eq!(
            (instant.stable_window, instant.scale_down_delay),
            (Duration::from_secs(60), Duration::from_secs(10))
        );
        let longer = ScalingSpec::for_cold_start(Duration::from_secs(90));
        assert_eq!(
            (longer.stable_window, longer.scale_to_zero_after),
            (Duration::from_secs(450), Duration::from_secs(900))
        );
        let slow = ScalingSpec::for_cold_start(Duration::from_secs(60));
        assert_eq!(
            (slow.stable_window, slow.panic_window),
            (Duration::from_secs(300), Duration::from_secs(30))
        );
        assert_eq!(
            (slow.scale_down_delay, slow.scale_to_zero_after),
            (Duration::from_secs(300), Duration::from_secs(600))
        );
        assert_eq!(slow.stable_aggregate, StableAggregate::Max);
        assert_eq!(
            slow.max_scale_up_rate,
            ScalingSpec::default().max_scale_up_rate
        );
        slow.validate().unwrap();
        // onto another spec: the preset's windows and hold, that spec's bounds and sizing
        let mine = ScalingSpec {
            max_replicas: 7,
            prefill_tokens_per_second: 5_000.0,
            scale_down_hold: ScaleDownHold::PerLevel,
            stable_window: Duration::from_secs(9),
            ..ScalingSpec::default()
        }
        .with_cold_start(Duration::from_secs(60));
        assert_eq!(
            mine,
            ScalingSpec {
                max_replicas: 7,
                prefill_tokens_per_second: 5_000.0,
                ..slow
            }
        );
    }

    #[test]
    fn a_floor_schedule_raises_min_replicas_while_a_window_holds() {
        use crate::schedule::FloorWindow;
        // weekdays 08:00-18:00 UTC at 6; 2026-11-30 was a Monday
        let monday = 1_795_996_800;
        let spec = ScalingSpec {
            min_replicas: 1,
            floor_schedule: vec![FloorWindow {
                days: 0b001_1111,
                start_minute: 8 * 60,
                end_minute: 18 * 60,
                min_replicas: 6,
                time_zone: chrono_tz::Tz::UTC,
            }],
            ..ScalingSpec::default()
        };
        spec.validate().unwrap();
        assert_eq!(spec.at_wall_clock(monday + 9 * 3600).min_replicas, 6);
        assert_eq!(spec.at_wall_clock(monday + 19 * 3600).min_replicas, 1);
        // Saturday 09:00
        assert_eq!(
            spec.at_wall_clock(monday + 5 * 86_400 + 9 * 3600)
                .min_replicas,
            1
        );
        // a floor below minReplicas changes nothing
        let high = ScalingSpec {
            min_replicas: 8,
            ..spec.clone()
        };
        assert_eq!(high.at_wall_clock(monday + 9 * 3600).min_replicas, 8);
        // everything else is the spec's own
        let at_nine = spec.at_wall_clock(monday + 9 * 3600).into_owned();
        assert_eq!(
            at_nine,
            ScalingSpec {
                min_replicas: 6,
                ..spec.clone()
            }
        );
        // windows that cannot hold, or ask for more than maxReplicas, are refused
        let window = spec.floor_schedule[0];
        for (bad, why) in [
            (FloorWindow { days: 0, ..window }, "names no day"),
            (
                FloorWindow {
                    days: 0x80,
                    ..window
                },
                "past Sunday",
            ),
            (
                FloorWindow {
                    end_minute: 1440,
                    ..window
                },
                "minutes of a day",
            ),
            (
                FloorWindow {
                    min_replicas: 11,
                    ..window
                },
                "minReplicas (11) is greater than maxReplicas (10)",
            ),
        ] {
            let spec = ScalingSpec {
                floor_schedule: vec![window, bad],
                ..spec.clone()
            };
            let err = spec.validate().unwrap_err().to_string();
            assert!(
                err.starts_with("floorSchedule[1]: ") && err.contains(why),
                "{err}"
            );
        }
    }

    #[test]
    fn missing_fields_take_defaults() {
        let spec: ScalingSpec =
            serde_json::from_str(r#"{"maxReplicas": 3, "fallbackAfter": 1.5}"#).unwrap();
        assert_eq!(spec.max_replicas, 3);
        assert_eq!(spec.fallback_after, Duration::from_millis(1500));
        assert_eq!(spec.stable_window, Duration::from_secs(60));
        assert_eq!(spec.prefill_tokens_per_second, 0.0);
        let sized: ScalingSpec =
            serde_json::from_str(r#"{"prefillTokensPerSecond": 10000, "ttftTarget": 2}"#).unwrap();
        assert_eq!(sized.prefill_tokens_per_second, 10_000.0);
        assert_eq!(sized.ttft_target, Duration::from_secs(2));
        assert_eq!(sized.prefill_utilisation, 0.75);
        assert_eq!(spec.scale_down_hold, ScaleDownHold::Flat);
        let held: ScalingSpec = serde_json::from_str(r#"{"scaleDownHold": "PerLevel"}"#).unwrap();
        assert_eq!(held.scale_down_hold, ScaleDownHold::PerLevel);
        // a floor window's zone is an IANA name, UTC when left out
        let floors: ScalingSpec = serde_json::from_str(
            r#"{"floorSchedule": [
                {"days": 31, "startMinute": 480, "endMinute": 1080, "minReplicas": 2,
                 "timeZone": "America/Sao_Paulo"},
                {"days": 96, "startMinute": 0, "endMinute": 0, "minReplicas": 1}]}"#,
        )
        .unwrap();
        let zones: Vec<_> = floors.floor_schedule.iter().map(|w| w.time_zone).collect();
        assert_eq!(
            zones,
            [chrono_tz::Tz::America__Sao_Paulo, chrono_tz::Tz::UTC]
        );
        assert!(serde_json::from_str::<ScalingSpec>(
            r#"{"floorSchedule": [{"days": 1, "startMinute": 0, "endMinute": 60,
                "minReplicas": 1, "timeZone": "Mars/Olympus_Mons"}]}"#
        )
        .is_err());
    }

    #[test]
    fn negative_duration_is_a_parse_error() {
        assert!(serde_json::from_str::<ScalingSpec>(r#"{"stableWindow": -1}"#).is_err());
    }

    #[test]
    fn validate_rejects_each_bad_field() {
        let bad = |f: fn(&mut ScalingSpec)| {
            let mut s = ScalingSpec::default();
            f(&mut s);
            s.validate().unwrap_err()
        };
        assert_eq!(
            bad(|s| s.min_replicas = 11),
            SpecError::MinAboveMax { min: 11, max: 10 }
        );
        assert!(matches!(
            bad(|s| s.target_in_flight_per_replica = 0.0),
            SpecError::NotPositive { .. }
        ));
        assert!(matches!(
            bad(|s| s.panic_threshold = f64::NAN),
            SpecError::NotPositive { .. }
        ));
        assert!(matches!(
            bad(|s| s.max_scale_up_rate = 0.5),
            SpecError::RateBelowOne { .. }
        ));
        assert!(matches!(
            bad(|s| s.max_scale_down_rate = 0.9),
            SpecError::RateBelowOne { .. }
        ));
        assert_eq!(
            bad(|s| s.panic_window = Duration::ZERO),
            SpecError::PanicWindow
        );
        assert_eq!(
            bad(|s| s.panic_window = Duration::from_secs(61)),
            SpecError::PanicWindow
        );
        assert_eq!(
            bad(|s| s.prefill_tokens_per_second = -1.0),
            SpecError::Negative {
                field: "prefillTokensPerSecond",
                value: -1.0
            }
        );
        assert!(matches!(
            bad(|s| s.prefill_tolerance_replicas = f64::INFINITY),
            SpecError::Negative {
                field: "prefillToleranceReplicas",
                ..
            }
        ));
        assert_eq!(
            bad(|s| s.prefill_utilisation = 0.0),
            SpecError::Utilisation(0.0)
        );
        assert_eq!(
            bad(|s| s.prefill_utilisation = 1.5),
            SpecError::Utilisation(1.5)
        );
        assert_eq!(
            bad(|s| s.decoding_weight = 1.01),
            SpecError::DecodingWeight(1.01)
        );
        assert_eq!(
            bad(|s| s.decoding_weight = -0.1),
            SpecError::DecodingWeight(-0.1)
        );
        assert!(matches!(
            bad(|s| s.decoding_weight = f64::NAN),
            SpecError::DecodingWeight(_)
        ));
        assert_eq!(
            bad(|s| {
                s.prefill_tokens_per_second = 10_000.0;
                s.ttft_target = Duration::ZERO;
            }),
            SpecError::NoTtftTarget
        );
        // without prefill sizing the TTFT target is not read
        let off = ScalingSpec {
            ttft_target: Duration::ZERO,
            ..ScalingSpec::default()
        };
        off.validate().unwrap();
    }
}
