//! Sampling and stopping fields shared by chat and text completions, and their validation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::number::{self, Int};

/// `stop`: one string or a list of up to four, none empty.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(untagged)]
pub enum StopField {
    One(#[schemars(length(min = 1))] String),
    Many(#[schemars(length(max = 4), inner(length(min = 1)))] Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, JsonSchema)]
pub struct StreamOptions {
    /// End the stream with a chunk that has no choices and carries `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields common to both completion endpoints, flattened into each request type.
/// `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids` and `ignore_eos` are the usual
/// extensions of open-model servers (vLLM, llama.cpp); `num_speculative_tokens` caps
/// speculative decoding for one request.
///
/// Numbers are read as the OpenAPI document types them: floats as `f64`, so a range is
/// checked on the value sent, not on its `f32` rounding; integers also as integral floats
/// ([`crate::number`]). The schema attributes state the ranges [`SamplingFields::validate`]
/// checks, so the gateway's OpenAPI document refuses exactly what it refuses.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, JsonSchema)]
pub struct SamplingFields {
    /// Default 1.
    #[schemars(range(min = 0, max = 2))]
    pub temperature: Option<f64>,
    /// Default 1. Greater than 0; a value too small for a 32-bit float acts as the smallest
    /// positive one (greedy).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1))]
    pub top_p: Option<f64>,
    /// -1 or 0: off.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = -1))]
    pub top_k: Option<i64>,
    /// Default 0 (off).
    #[schemars(range(min = 0, max = 1))]
    pub min_p: Option<f64>,
    /// Default 0.
    #[schemars(range(min = -2, max = 2))]
    pub presence_penalty: Option<f64>,
    /// Default 0.
    #[schemars(range(min = -2, max = 2))]
    pub frequency_penalty: Option<f64>,
    /// Default 1 (off).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 10))]
    pub repetition_penalty: Option<f64>,
    /// Makes sampling reproducible.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>")]
    pub seed: Option<i64>,
    /// Stop sequences (not included in the output).
    pub stop: Option<StopField>,
    /// Token ids that end generation.
    #[serde(default, deserialize_with = "number::opt_int_list")]
    #[schemars(with = "Option<Vec<Int<u32>>>")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: Option<bool>,
    /// At most this many speculative tokens per step for this request, under the server's
    /// own limit (`--num-speculative-tokens`); 0 turns speculative decoding off for it. The
    /// output is the same either way; only its speed changes.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 0))]
    pub num_speculative_tokens: Option<i64>,
    /// Choices per request: only 1.
    #[serde(default, deserialize_with = "number::opt_int")]
    #[schemars(with = "Option<Int<i64>>", range(min = 1, max = 1))]
    pub n: Option<i64>,
    /// Answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Options of a stream.
    pub stream_options: Option<StreamOptions>,
    /// The end user, for the caller's records.
    pub user: Option<String>,
}

/// Validated sampling settings with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = off.
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Number of alternatives per token to report, when log-probabilities were asked for.
    pub top_logprobs: Option<usize>,
    /// This request's cap on speculative tokens per step (`None`: the server's).
    pub num_speculative_tokens: Option<usize>,
}

/// `value` (or `default`) checked against `[lo, hi]` as sent, then as the engine's `f32`.
fn in_range(
    param: &str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    default: f64,
) -> Result<f32, ApiError> {
    let v = value.unwrap_or(default);
    if !v.is_finite() || v < lo || v > hi {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(v as f32)
}

/// `value` (or `default`) in `(0, hi]`; a positive value too small for an `f32` is taken as
/// the smallest positive normal `f32`, so it keeps its meaning (e.g. greedy for `top_p`).
fn positive(param: &str, value: Option<f64>, hi: f64, default: f64) -> Result<f32, ApiError> {
    let v = in_range(param, value, 0.0, hi, default)?;
    if value.unwrap_or(default) == 0.0 {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be greater than 0"),
        ));
    }
    Ok(v.max(f32::MIN_POSITIVE))
}

impl SamplingFields {
    /// Checks every field against OpenAI's documented ranges.
    pub fn validate(&self, top_logprobs: Option<usize>) -> Result<Sampling, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    "n",
                    format!("only n = 1 is supported, got {n}"),
                ));
            }
        }
        let top_p = positive("top_p", self.top_p, 1.0, 1.0)?;
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1, 0 or positive, got {k}"),
                ))
            }
        };
        let repetition_penalty =
            positive("repetition_penalty", self.repetition_penalty, 10.0, 1.0)?;
        let num_speculative_tokens = match self.num_speculative_tokens {
            None => None,
            Some(k) if k >= 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            Some(k) => {
                return Err(ApiError::invalid(
                    "num_speculative_tokens",
                    format!("`num_speculative_tokens` must be 0 or positive, got {k}"),
                ))
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid(
                "stop",
                format!("at most 4 stop sequences are allowed, got {}", stop.len()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        Ok(Sampling {
            temperature: in_range("temperature", self.temperature, 0.0, 2.0, 1.0)?,
            top_p,
            top_k,
            min_p: in_range("min_p", self.min_p, 0.0, 1.0, 0.0)?,
            presence_penalty: in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?,
            frequency_penalty: in_range(
                "frequency_penalty",
                self.frequency_penalty,
                -2.0,
                2.0,
                0.0,
            )?,
            repetition_penalty,
            seed: self.seed.map(|s| s as u64),
            stop,
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            top_logprobs,
            num_speculative_tokens,
        })
    }

    /// Whether the final chunk of a stream carries usage.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// `max_tokens` must be a positive integer when given.
pub fn validate_max_tokens(param: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v > 0 => Ok(Some(v as usize)),
        Some(v) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be at least 1, got {v}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults() {
        let s = fields("{}").validate(None).unwrap();
        assert_eq!(s.temperature, 1.0);
        assert_eq!(s.top_p, 1.0);
        assert_eq!(s.top_k, 0);
        assert_eq!(s.repetition_penalty, 1.0);
        assert!(s.stop.is_empty());
        assert_eq!(s.num_speculative_tokens, None);
        let s = fields(r#"{"num_speculative_tokens": 3}"#)
            .validate(None)
            .unwrap();
        assert_eq!(s.num_speculative_tokens, Some(3));
        let s = fields(r#"{"num_speculative_tokens": 0}"#)
            .validate(None)
            .unwrap();
        assert_eq!(s.num_speculative_tokens, Some(0));
    }

    #[test]
    fn each_bad_value_names_its_field() {
        for (json, param) in [
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"temperature": -0.1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"top_k": -2}"#, "top_k"),
            (
                r#"{"num_speculative_tokens": -1}"#,
                "num_speculative_tokens",
            ),
            (r#"{"min_p": 1.5}"#, "min_p"),
            (r#"{"presence_penalty": 3}"#, "presence_penalty"),
            (r#"{"frequency_penalty": -3}"#, "frequency_penalty"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"n": 2}"#, "n"),
            (r#"{"stop": ["a","b","c","d","e"]}"#, "stop"),
            (r#"{"stop": ""}"#, "stop"),
        ] {
            let err = fields(json).validate(None).unwrap_err();
            assert_eq!(err.status, 400, "{json}");
            assert_eq!(err.param.as_deref(), Some(param), "{json}");
        }
    }

    #[test]
    fn ranges_hold_for_the_value_sent_not_its_f32_rounding() {
        // 5e-324 > 0 is a valid top_p though it rounds to 0 as an f32.
        let s = fields(r#"{"top_p": 5e-324, "repetition_penalty": 1e-300}"#)
            .validate(None)
            .unwrap();
        assert!(s.top_p > 0.0 && s.repetition_penalty > 0.0);
        // 2.0000000001 > 2 though it rounds to 2 as an f32.
        let e = fields(r#"{"temperature": 2.0000000001}"#)
            .validate(None)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = fields(r#"{"top_p": 1.00000001}"#)
            .validate(None)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn integer_fields_take_integral_floats() {
        let f = fields(r#"{"n": 1.0, "top_k": 4e1, "seed": -3.0, "stop_token_ids": [2.0]}"#);
        assert_eq!((f.n, f.top_k, f.seed), (Some(1), Some(40), Some(-3)));
        assert_eq!(f.stop_token_ids, Some(vec![2]));
        assert!(f.validate(None).is_ok());
        for json in [
            r#"{"n": 1.5}"#,
            r#"{"top_k": 0.1}"#,
            r#"{"stop_token_ids": [-1]}"#,
        ] {
            assert!(
                serde_json::from_str::<SamplingFields>(json).is_err(),
                "{json}"
            );
        }
    }

    #[test]
    fn stop_accepts_string_or_list() {
        assert_eq!(
            fields(r#"{"stop": "x"}"#).validate(None).unwrap().stop,
            vec!["x"]
        );
        assert_eq!(
            fields(r#"{"stop": ["x","y"]}"#)
                .validate(None)
                .unwrap()
                .stop,
            vec!["x", "y"]
        );
    }

    #[test]
    fn max_tokens_must_be_positive() {
        assert_eq!(validate_max_tokens("max_tokens", Some(5)).unwrap(), Some(5));
        assert_eq!(validate_max_tokens("max_tokens", None).unwrap(), None);
        assert_eq!(
            validate_max_tokens("max_tokens", Some(0))
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            validate_max_tokens("max_tokens", Some(-3))
                .unwrap_err()
                .status,
            400
        );
    }
}
