//! Speculative decoding settings (`--speculative`, `--num-speculative-tokens`, ...).

use std::path::PathBuf;

use crate::model::QuantizeTo;

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculativeMethod {
    /// One token per sequence per step.
    #[default]
    Off,
    /// Prompt lookup: continue the latest earlier occurrence of the last n tokens.
    Ngram,
    /// A smaller model of the same vocabulary proposes its greedy continuation.
    Draft,
}

impl SpeculativeMethod {
    /// The flag's spelling, also the `proposer` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Ngram => "ngram",
            Self::Draft => "draft",
        }
    }
}

impl std::fmt::Display for SpeculativeMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SpeculativeMethod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Ok(Self::Off),
            "ngram" | "prompt-lookup" => Ok(Self::Ngram),
            "draft" | "draft-model" => Ok(Self::Draft),
            other => Err(format!(
                "unknown speculative method `{other}` (expected off, ngram or draft)"
            )),
        }
    }
}

/// The verify cost assumed where the engine cannot measure it: SmolLM2-135M's on a 2-core
/// AMD EPYC (AVX2), 0.36 (`tidal bench speculative --verify-cost`), the dearest measured.
pub const ASSUMED_VERIFY_COST: f64 = 0.35;

/// Speculative decoding settings of one engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    /// The proposer, or off.
    pub method: SpeculativeMethod,
    /// Most tokens proposed for one sequence in one step (k).
    pub num_speculative_tokens: usize,
    /// Shortest suffix the n-gram proposer matches.
    pub ngram_min: usize,
    /// Longest suffix the n-gram proposer matches (longer matches are preferred).
    pub ngram_max: usize,
    /// Speculation pauses while more sequences than this are running: a step that already
    /// carries this many decodes is no longer bound by reading the weights, so verifying
    /// extra tokens costs nearly their full price.
    pub max_running: usize,
    /// Time of each verified token relative to a one-token step (a step of 1 + k tokens
    /// takes `1 + verify_cost · k` times a one-token step): what the choice of k weighs
    /// acceptance against. `None`: the engine measures the whole curve of 1 + k token steps
    /// when it starts, on its own device ([`super::StepCost`]), and assumes
    /// [`ASSUMED_VERIFY_COST`] only where it cannot measure.
    pub verify_cost: Option<f64>,
    /// The draft proposer's model (`--draft-model`): a GGUF whose vocabulary is the target's.
    pub draft_model: Option<PathBuf>,
    /// Re-quantise the draft's weights at load (`--draft-quantize`), as `--quantize` does
    /// the target's.
    pub draft_quantize: Option<QuantizeTo>,
    /// Blocks of the draft's own KV cache (`--draft-kv-blocks`); `None`: as many tokens as
    /// the target's cache holds, plus one block per sequence for the draft tokens.
    pub draft_kv_blocks: Option<usize>,
    /// Time of one draft forward pass relative to a one-token target step
    /// (`--draft-cost`): added to the verify cost for each token the draft proposes, since
    /// each costs one draft step. `None`: measured when the engine starts.
    pub draft_cost: Option<f64>,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: SpeculativeMethod::Off,
            num_speculative_tokens: 8,
            ngram_min: 1,
            ngram_max: 4,
            max_running: 8,
            verify_cost: None,
            draft_model: None,
            draft_quantize: None,
            draft_kv_blocks: None,
            draft_cost: None,
        }
    }
}

impl SpeculativeConfig {
    /// Whether any proposals are made.
    pub fn enabled(&self) -> bool {
        self.method != SpeculativeMethod::Off && self.num_speculative_tokens > 0
    }

    /// Checks that the settings can work.
    pub fn validate(&self) -> Result<(), String> {
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "n-gram lengths must satisfy 1 <= min ({}) <= max ({})",
                self.ngram_min, self.ngram_max
            ));
        }
        if let Some(cost) = self.verify_cost {
            if !(cost.is_finite() && cost >= 0.0) {
                return Err(format!(
                    "verify cost must be a non-negative number, not {cost}"
                ));
            }
        }
        if let Some(cost) = self.draft_cost {
            if !(cost.is_finite() && cost >= 0.0) {
                return Err(format!(
                    "draft cost must be a non-negative number, not {cost}"
                ));
            }
        }
        if self.draft_kv_blocks == Some(0) {
            return Err("the draft's KV cache needs at least one block".into());
        }
        if self.method == SpeculativeMethod::Draft && self.draft_model.is_none() {
            return Err("--speculative draft needs a draft model (--draft-model)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse_and_print() {
        assert_eq!("ngram".parse(), Ok(SpeculativeMethod::Ngram));
        assert_eq!("OFF".parse(), Ok(SpeculativeMethod::Off));
        assert_eq!("draft".parse(), Ok(SpeculativeMethod::Draft));
        assert_eq!(SpeculativeMethod::Ngram.to_string(), "ngram");
        assert_eq!(SpeculativeMethod::Draft.to_string(), "draft");
        let e = "medusa".parse::<SpeculativeMethod>().unwrap_err();
        assert!(e.contains("off, ngram or draft"), "{e}");
    }

    #[test]
    fn validation_catches_impossible_settings() {
        let ok = SpeculativeConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        assert!(!ok.enabled());
        for bad in [
            SpeculativeConfig {
                ngram_min: 0,
                ..ok.clone()
            },
            SpeculativeConfig {
                ngram_min: 5,
                ngram_max: 4,
                ..ok.clone()
            },
            SpeculativeConfig {
                verify_cost: Some(f64::NAN),
                ..ok.clone()
            },
            SpeculativeConfig {
                draft_cost: Some(-1.0),
                ..ok.clone()
            },
            SpeculativeConfig {
                draft_kv_blocks: Some(0),
                ..ok.clone()
            },
            // A draft proposer without its model.
            SpeculativeConfig {
                method: SpeculativeMethod::Draft,
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let draft = SpeculativeConfig {
            method: SpeculativeMethod::Draft,
            draft_model: Some("draft.gguf".into()),
            ..ok.clone()
        };
        assert_eq!(draft.validate(), Ok(()));
        let on = SpeculativeConfig {
            method: SpeculativeMethod::Ngram,
            ..ok
        };
        assert!(on.enabled());
        assert!(!SpeculativeConfig {
            num_speculative_tokens: 0,
            ..on
        }
        .enabled());
    }
}
