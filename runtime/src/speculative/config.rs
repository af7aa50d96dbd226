//! Speculative decoding settings (`--speculative`, `--num-speculative-tokens`, ...).

use super::NgramProposer;

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculativeMethod {
    /// One token per sequence per step.
    #[default]
    Off,
    /// Prompt lookup: continue the latest earlier occurrence of the last n tokens.
    Ngram,
}

impl SpeculativeMethod {
    /// The flag's spelling, also the `proposer` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Ngram => "ngram",
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
            other => Err(format!(
                "unknown speculative method `{other}` (expected off or ngram)"
            )),
        }
    }
}

/// Speculative decoding settings of one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// acceptance against. The default is SmolLM2-135M's on a 2-core AMD EPYC (AVX2)
    /// (`tidal bench speculative --verify-cost`: 0.36); a GPU's is far lower.
    pub verify_cost: f64,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: SpeculativeMethod::Off,
            num_speculative_tokens: 5,
            ngram_min: 2,
            ngram_max: 4,
            max_running: 8,
            verify_cost: 0.35,
        }
    }
}

impl SpeculativeConfig {
    /// Whether any proposals are made.
    pub fn enabled(&self) -> bool {
        self.method != SpeculativeMethod::Off && self.num_speculative_tokens > 0
    }

    /// The proposer these settings ask for, or `None` when speculation is off.
    pub fn proposer(&self) -> Option<NgramProposer> {
        match self.method {
            _ if !self.enabled() => None,
            SpeculativeMethod::Off => None,
            SpeculativeMethod::Ngram => Some(NgramProposer::new(self.ngram_min, self.ngram_max)),
        }
    }

    /// Checks that the settings can work.
    pub fn validate(&self) -> Result<(), String> {
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "n-gram lengths must satisfy 1 <= min ({}) <= max ({})",
                self.ngram_min, self.ngram_max
            ));
        }
        if !(self.verify_cost.is_finite() && self.verify_cost >= 0.0) {
            return Err(format!(
                "verify cost must be a non-negative number, not {}",
                self.verify_cost
            ));
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
        assert_eq!(SpeculativeMethod::Ngram.to_string(), "ngram");
        let e = "medusa".parse::<SpeculativeMethod>().unwrap_err();
        assert!(e.contains("off or ngram"), "{e}");
    }

    #[test]
    fn validation_catches_impossible_settings() {
        let ok = SpeculativeConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        assert!(!ok.enabled());
        for bad in [
            SpeculativeConfig { ngram_min: 0, ..ok },
            SpeculativeConfig {
                ngram_min: 5,
                ngram_max: 4,
                ..ok
            },
            SpeculativeConfig {
                verify_cost: f64::NAN,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
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
