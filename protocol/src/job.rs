//! The request a queue job carries from the gateway to a worker (the job's `body`).
//!
//! The gateway checks everything it can without the model (JSON shape, sampling ranges,
//! roles, max_tokens sign) and forwards the request as the client sent it; the worker does
//! what needs the model (chat template, tokenisation, context length) and reports failures
//! as an error event that the gateway turns back into the same [`ApiError`].

use serde::{Deserialize, Serialize};

use crate::chat::ChatCompletionRequest;
use crate::completion::CompletionRequest;
use crate::error::ApiError;

/// One OpenAI request, tagged with its endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "request", rename_all = "snake_case")]
pub enum JobRequest {
    /// `/v1/chat/completions`.
    Chat(ChatCompletionRequest),
    /// `/v1/completions`.
    Completion(CompletionRequest),
}

impl JobRequest {
    /// The requested model name.
    pub fn model(&self) -> &str {
        match self {
            JobRequest::Chat(r) => &r.model,
            JobRequest::Completion(r) => &r.model,
        }
    }

    /// Whether the client asked for a stream.
    pub fn stream(&self) -> bool {
        match self {
            JobRequest::Chat(r) => r.sampling.stream,
            JobRequest::Completion(r) => r.sampling.stream,
        }
    }

    /// Whether the response carries log-probabilities (what the worker's engine computes
    /// for `top_logprobs`; a request that fails [`JobRequest::validate`] carries none).
    pub fn logprobs(&self) -> bool {
        let top = match self {
            JobRequest::Chat(r) => r.top_logprobs(),
            JobRequest::Completion(r) => r.top_logprobs(),
        };
        matches!(top, Ok(Some(_)))
    }

    /// The checks that need no model: what the gateway runs before enqueueing.
    pub fn validate(&self) -> Result<(), ApiError> {
        match self {
            JobRequest::Chat(r) => {
                r.text_messages()?;
                r.max_tokens()?;
                r.sampling.validate(r.top_logprobs()?)?;
            }
            JobRequest::Completion(r) => {
                r.check_unsupported()?;
                r.prompt()?;
                r.max_tokens()?;
                r.sampling.validate(r.top_logprobs()?)?;
            }
        }
        Ok(())
    }

    /// The job body JSON.
    pub fn to_body(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Parses a job body; a body no gateway could have written is a 400.
    pub fn from_body(body: &serde_json::Value) -> Result<Self, ApiError> {
        Self::deserialize(body).map_err(|e| ApiError::bad_request(format!("Invalid job body: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_round_trips_and_is_tagged() {
        let req: ChatCompletionRequest = serde_json::from_value(serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.0,
            "stream": true
        }))
        .unwrap();
        let job = JobRequest::Chat(req);
        let body = job.to_body();
        assert_eq!(body["kind"], "chat");
        assert_eq!(body["request"]["messages"][0]["content"], "hi");
        let back = JobRequest::from_body(&body).unwrap();
        assert_eq!(back, job);
        assert!(back.stream());
        assert_eq!(back.model(), "m");
        back.validate().unwrap();
    }

    #[test]
    fn logprobs_follow_each_endpoints_switch() {
        let job = |v: serde_json::Value| JobRequest::from_body(&v).unwrap();
        let chat = |extra: serde_json::Value| {
            let mut r =
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            job(serde_json::json!({"kind": "chat", "request": r}))
        };
        assert!(!chat(serde_json::json!({})).logprobs());
        assert!(!chat(serde_json::json!({"logprobs": false})).logprobs());
        assert!(chat(serde_json::json!({"logprobs": true})).logprobs());
        assert!(chat(serde_json::json!({"logprobs": true, "top_logprobs": 3})).logprobs());
        let completion = |lp: serde_json::Value| {
            job(
                serde_json::json!({"kind": "completion", "request": {"model": "m", "prompt": "x", "logprobs": lp}}),
            )
        };
        assert!(!completion(serde_json::Value::Null).logprobs());
        assert!(completion(serde_json::json!(0)).logprobs());
        assert!(completion(serde_json::json!(2)).logprobs());
    }

    #[test]
    fn validation_runs_the_model_free_checks() {
        let req: CompletionRequest = serde_json::from_value(serde_json::json!({
            "model": "m", "prompt": "x", "temperature": 7.0
        }))
        .unwrap();
        let err = JobRequest::Completion(req).validate().unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.param.as_deref(), Some("temperature"));
        let bad = JobRequest::from_body(&serde_json::json!({"kind": "embedding"})).unwrap_err();
        assert_eq!(bad.status, 400);
    }
}
