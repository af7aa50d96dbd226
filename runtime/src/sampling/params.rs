//! Per-request sampling parameters and their validation against the OpenAI API ranges.

use serde::{Deserialize, Serialize};

/// A sampling parameter outside its allowed range; the message names the field, so the gateway
/// can return it as an OpenAI-style 400 (`param` = `field`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{field}`: {message}")]
pub struct SamplingError {
    /// The offending field, spelled as in the OpenAI request body.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// How to pick the next token of one sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature, 0..=2; 0 means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches this, (0, 1].
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one, 0..=1.
    pub min_p: f32,
    /// OpenAI presence penalty, -2..=2: subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, -2..=2: subtracted per occurrence in the generated tokens.
    pub frequency_penalty: f32,
    /// llama.cpp / HF repetition penalty (> 0, 1 = off) over prompt and generated tokens.
    pub repetition_penalty: f32,
    /// Seed of the sequence's RNG; `None` draws one at random.
    pub seed: Option<u64>,
    /// Number of most likely alternatives to report with each token, 0..=20.
    pub top_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    /// OpenAI defaults: temperature 1, no filters, no penalties.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            top_logprobs: None,
        }
    }
}

/// Most alternatives OpenAI allows in `top_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;

fn check(field: &'static str, ok: bool, message: &str) -> Result<(), SamplingError> {
    if ok {
        Ok(())
    } else {
        Err(SamplingError {
            field,
            message: message.to_owned(),
        })
    }
}

impl SamplingParams {
    /// OpenAI ranges; Err(message naming the field) for bad values (NaN is always bad).
    pub fn validate(&self) -> Result<(), SamplingError> {
        let t = self.temperature;
        check(
            "temperature",
            (0.0..=2.0).contains(&t),
            "must be between 0 and 2",
        )?;
        check(
            "top_p",
            self.top_p > 0.0 && self.top_p <= 1.0,
            "must be greater than 0 and at most 1",
        )?;
        check(
            "min_p",
            (0.0..=1.0).contains(&self.min_p),
            "must be between 0 and 1",
        )?;
        let p = self.presence_penalty;
        check(
            "presence_penalty",
            (-2.0..=2.0).contains(&p),
            "must be between -2 and 2",
        )?;
        let f = self.frequency_penalty;
        check(
            "frequency_penalty",
            (-2.0..=2.0).contains(&f),
            "must be between -2 and 2",
        )?;
        let r = self.repetition_penalty;
        check(
            "repetition_penalty",
            r.is_finite() && r > 0.0,
            "must be a positive number",
        )?;
        if let Some(n) = self.top_logprobs {
            check(
                "top_logprobs",
                n <= MAX_TOP_LOGPROBS,
                "must be between 0 and 20",
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(p: SamplingParams) -> &'static str {
        p.validate().unwrap_err().field
    }

    #[test]
    fn defaults_and_range_ends_are_valid() {
        SamplingParams::default().validate().unwrap();
        let edge = SamplingParams {
            temperature: 2.0,
            top_p: 1e-6,
            top_k: 1,
            min_p: 1.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            repetition_penalty: 1e-3,
            seed: Some(0),
            top_logprobs: Some(20),
        };
        edge.validate().unwrap();
        SamplingParams {
            temperature: 0.0,
            top_logprobs: Some(0),
            ..edge
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn each_bad_value_names_its_field() {
        let d = SamplingParams::default;
        assert_eq!(
            field_of(SamplingParams {
                temperature: 2.01,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(
            field_of(SamplingParams {
                temperature: -0.1,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(
            field_of(SamplingParams {
                temperature: f32::NAN,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(field_of(SamplingParams { top_p: 0.0, ..d() }), "top_p");
        assert_eq!(field_of(SamplingParams { top_p: 1.5, ..d() }), "top_p");
        assert_eq!(
            field_of(SamplingParams {
                top_p: f32::NAN,
                ..d()
            }),
            "top_p"
        );
        assert_eq!(field_of(SamplingParams { min_p: -0.1, ..d() }), "min_p");
        assert_eq!(field_of(SamplingParams { min_p: 1.1, ..d() }), "min_p");
        assert_eq!(
            field_of(SamplingParams {
                presence_penalty: 2.5,
                ..d()
            }),
            "presence_penalty"
        );
        assert_eq!(
            field_of(SamplingParams {
                frequency_penalty: -3.0,
                ..d()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            field_of(SamplingParams {
                repetition_penalty: 0.0,
                ..d()
            }),
            "repetition_penalty"
        );
        assert_eq!(
            field_of(SamplingParams {
                repetition_penalty: f32::INFINITY,
                ..d()
            }),
            "repetition_penalty"
        );
        assert_eq!(
            field_of(SamplingParams {
                top_logprobs: Some(21),
                ..d()
            }),
            "top_logprobs"
        );
    }

    #[test]
    fn error_message_names_the_field() {
        let e = SamplingParams {
            top_p: 2.0,
            ..SamplingParams::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid `top_p`: must be greater than 0 and at most 1"
        );
    }

    #[test]
    fn missing_fields_deserialise_to_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature":0.5,"seed":7}"#).unwrap();
        assert_eq!(
            p,
            SamplingParams {
                temperature: 0.5,
                seed: Some(7),
                ..SamplingParams::default()
            }
        );
    }
}
