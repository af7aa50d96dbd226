//! Per-replica service model and prices: what one replica of a model can do and cost.
//!
//! Decode throughput follows a saturating batching curve calibrated from two measurements
//! (batch-1 tokens/s and aggregate tokens/s at the maximum batch):
//! `D(n) = d1 * n / (1 + k * (n - 1))`, with `k` chosen so that `D(max) = d_max`. `k = 0` is
//! perfect batching, `k = 1` none. Prefill runs at a fixed tokens/s and takes priority over
//! decode within a step, as vLLM's scheduler does.

use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;

/// One replica's service model, cold start, prices and SLO, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceProfile {
    /// Name shown in reports.
    pub name: String,
    /// Prefill throughput, prompt tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Decode throughput of a single sequence, tokens per second.
    pub decode_tokens_per_s_single: f64,
    /// Aggregate decode throughput at `maxConcurrentSeqs`, tokens per second.
    pub decode_tokens_per_s_at_max: f64,
    /// Sequences one replica runs at once.
    pub max_concurrent_seqs: u32,
    /// Node + image + model load, seconds.
    pub cold_start_s: f64,
    /// Spot price of one replica, micro-units of currency per hour.
    pub spot_price_micros_per_hour: u64,
    /// On-demand price of one replica, micro-units per hour.
    pub on_demand_price_micros_per_hour: u64,
    /// Time-to-first-token target for SLO attainment, seconds.
    pub ttft_slo_s: f64,
    /// The autoscaler's per-replica in-flight target for this hardware.
    pub target_in_flight: f64,
}

/// A profile that cannot be used.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// the profile file
        path: String,
        /// the I/O error
        source: std::io::Error,
    },
    /// The file is not a valid profile.
    #[error("parsing {path}: {source}")]
    Json {
        /// the profile file
        path: String,
        /// the parse error
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("profile {0}: {1}")]
    Invalid(String, &'static str),
    /// No built-in profile has that name.
    #[error("unknown profile {0:?} (built in: cpu-smollm2-135m, gpu-8b)")]
    Unknown(String),
}

impl ServiceProfile {
    /// SmolLM2-135M (Q4_1 as shipped) on 2 CPU cores, measured with `tidal bench profile`
    /// (medians of three runs of five): 1,469-token prefill at 660 tokens/s,
    /// 164 tokens/s batch-1 decode, 554 tokens/s aggregate at 16 sequences; cold start 30 s
    /// for node and image (the measured 0.08 s model load is below the precision of that
    /// estimate and left out); 6 requests in flight per replica (those it prefills within
    /// half the 30 s TTFT target).
    pub fn cpu_smollm2() -> Self {
        Self {
            name: "cpu-smollm2-135m".into(),
            prefill_tokens_per_s: 660.0,
            decode_tokens_per_s_single: 164.0,
            decode_tokens_per_s_at_max: 554.0,
            max_concurrent_seqs: 16,
            cold_start_s: 30.0,
            spot_price_micros_per_hour: 34_000,
            on_demand_price_micros_per_hour: 85_000,
            ttft_slo_s: 30.0,
            target_in_flight: 6.0,
        }
    }

    /// An 8B model on one datacentre GPU: prefill ~10k tokens/s, decode ~2.5k tokens/s
    /// aggregate at 64 sequences (90 tokens/s single), cold start 60 s.
    pub fn gpu_8b() -> Self {
        Self {
            name: "gpu-8b".into(),
            prefill_tokens_per_s: 10_000.0,
            decode_tokens_per_s_single: 90.0,
            decode_tokens_per_s_at_max: 2_500.0,
            max_concurrent_seqs: 64,
            cold_start_s: 60.0,
            spot_price_micros_per_hour: 1_600_000,
            on_demand_price_micros_per_hour: 4_000_000,
            ttft_slo_s: 2.0,
            target_in_flight: 16.0,
        }
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        match name {
            "cpu-smollm2-135m" | "cpu" => Ok(Self::cpu_smollm2()),
            "gpu-8b" | "gpu" => Ok(Self::gpu_8b()),
            other => Err(ProfileError::Unknown(other.into())),
        }
    }

    /// Reads and validates a JSON profile.
    pub fn from_file(path: &Path) -> Result<Self, ProfileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: name.clone(),
            source,
        })?;
        let p: Self = serde_json::from_str(&text)
            .map_err(|source| ProfileError::Json { path: name, source })?;
        p.validate()?;
        Ok(p)
    }

    /// Checks the ranges the simulator relies on.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |why| Err(ProfileError::Invalid(self.name.clone(), why));
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if !pos(self.prefill_tokens_per_s) || !pos(self.decode_tokens_per_s_single) {
            return bad("throughputs must be positive");
        }
        if !pos(self.target_in_flight) || !pos(self.ttft_slo_s) {
            return bad("targetInFlight and ttftSloS must be positive");
        }
        if self.max_concurrent_seqs == 0 {
            return bad("maxConcurrentSeqs must be at least 1");
        }
        let n = f64::from(self.max_concurrent_seqs);
        let d1 = self.decode_tokens_per_s_single;
        if !(self.decode_tokens_per_s_at_max >= d1 && self.decode_tokens_per_s_at_max <= d1 * n) {
            return bad(
                "decodeTokensPerSAtMax must lie between single and single x maxConcurrentSeqs",
            );
        }
        if !(self.cold_start_s.is_finite() && self.cold_start_s >= 0.0) {
            return bad("coldStartS must be non-negative");
        }
        if self.spot_price_micros_per_hour > self.on_demand_price_micros_per_hour {
            return bad("spot must not cost more than on-demand");
        }
        Ok(())
    }

    /// A replica's cold start (billed, not ready) in the whole milliseconds the simulator
    /// bills, so that the bounds count exactly what the fleet pays.
    pub fn cold_start_ms(&self) -> u64 {
        (self.cold_start_s * 1000.0).round() as u64
    }

    /// The batching-inefficiency constant `k` of the decode curve.
    pub fn batching_k(&self) -> f64 {
        let n = f64::from(self.max_concurrent_seqs);
        if n <= 1.0 {
            return 0.0;
        }
        let ratio = self.decode_tokens_per_s_single * n / self.decode_tokens_per_s_at_max;
        ((ratio - 1.0) / (n - 1.0)).clamp(0.0, 1.0)
    }

    /// Aggregate decode tokens/s with `n` sequences decoding.
    pub fn decode_rate(&self, n: u32) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let n = f64::from(n);
        self.decode_tokens_per_s_single * n / (1.0 + self.batching_k() * (n - 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_validate_and_hit_their_calibration_points() {
        for p in [ServiceProfile::cpu_smollm2(), ServiceProfile::gpu_8b()] {
            p.validate().unwrap();
            assert!((p.decode_rate(1) - p.decode_tokens_per_s_single).abs() < 1e-9);
            let at_max = p.decode_rate(p.max_concurrent_seqs);
            assert!(
                (at_max - p.decode_tokens_per_s_at_max).abs() < 1e-6,
                "{at_max}"
            );
            // more sequences never lower aggregate throughput
            assert!((1..p.max_concurrent_seqs).all(|n| p.decode_rate(n + 1) >= p.decode_rate(n)));
        }
        assert_eq!(ServiceProfile::cpu_smollm2().decode_rate(0), 0.0);
    }

    #[test]
    fn json_round_trips_and_bad_values_are_rejected() {
        let p = ServiceProfile::gpu_8b();
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains("prefillTokensPerS"));
        let path = std::env::temp_dir().join(format!("tidal-prof-{}.json", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        assert_eq!(ServiceProfile::from_file(&path).unwrap(), p);
        let bad = ServiceProfile {
            decode_tokens_per_s_at_max: 1e9,
            ..p.clone()
        };
        assert!(bad.validate().is_err());
        let bad = ServiceProfile {
            spot_price_micros_per_hour: 5_000_000,
            ..p
        };
        assert!(bad.validate().is_err());
        assert!(ServiceProfile::builtin("tpu").is_err());
    }
}
