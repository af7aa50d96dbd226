use std::borrow::Cow;

use schemars::JsonSchema;
use serde::Serialize;

/// An error as OpenAI returns it: an HTTP status and `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The offending request field, when there is one.
    pub param: Option<String>,
    /// A machine-readable code such as `model_not_found` or `context_length_exceeded`.
    pub code: Option<Cow<'static, str>>,
}

/// Every OpenAI error `type` an [`ApiError`] can carry.
pub const ERROR_TYPES: [&str; 6] = [
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "insufficient_quota",
    "rate_limit_error",
    "server_error",
];

/// The body of an error response, as `ApiError::body` writes it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody<'a> {
    /// What went wrong.
    pub error: ErrorDetail<'a>,
}

/// `error` of an [`ErrorBody`].
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(inline)]
pub struct ErrorDetail<'a> {
    /// For people.
    pub message: &'a str,
    /// OpenAI's error type.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ERROR_TYPES))]
    pub kind: &'a str,
    /// The offending request field or parameter, when there is one.
    pub param: Option<&'a str>,
    /// A machine-readable code (`model_not_found`, `rate_limit_exceeded`, ...).
    pub code: Option<&'a str>,
}

impl ApiError {
    /// 400 about a request field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// 400 about the request as a whole (e.g. malformed JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 404 for a model nobody serves.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: 404,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some(Cow::Borrowed("model_not_found")),
        }
    }

    /// 400 when prompt + max_tokens exceed the context window.
    pub fn context_length(limit: usize, prompt: usize, max_tokens: usize) -> Self {
        Self {
            status: 400,
            message: format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                prompt + max_tokens
            ),
            kind: "invalid_request_error",
            param: Some("messages".into()),
            code: Some(Cow::Borrowed("context_length_exceeded")),
        }
    }

    /// 503 when the server cannot take the request now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: 503,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some(Cow::Borrowed("service_unavailable")),
        }
    }

    /// 500 for a failure on our side.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// An error with any status, e.g. one a worker reported through the queue; the OpenAI
    /// `type` follows from the status.
    pub fn new(
        status: u16,
        code: Option<String>,
        param: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            message: message.into(),
            kind: kind_for_status(status),
            param,
            code: code.map(Cow::Owned),
        }
    }

    /// 401: missing, unknown or revoked API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::fixed(401, "invalid_api_key", message)
    }

    /// 403: the key may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::fixed(403, "forbidden", message)
    }

    /// 404 with a machine-readable code (`unknown_url`, `not_found`, ...).
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::fixed(404, code, message)
    }

    /// 429: a rate limit was hit (the caller adds `Retry-After`).
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::fixed(429, "rate_limit_exceeded", message)
    }

    /// 402: the tenant's budget is spent.
    pub fn payment_required(message: impl Into<String>) -> Self {
        Self::fixed(402, "insufficient_quota", message)
    }

    fn fixed(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind: kind_for_status(status),
            param: None,
            code: Some(Cow::Borrowed(code)),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        })
        .unwrap_or_default()
    }
}

/// OpenAI's error `type` for an HTTP status.
pub fn kind_for_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "insufficient_quota",
        403 => "permission_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Parses a JSON request body, turning serde's message into a 400.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid("temperature", "temperature must be between 0 and 2");
        let body = e.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "temperature");
        assert_eq!(
            body["error"]["message"],
            "temperature must be between 0 and 2"
        );
        assert!(body["error"]["code"].is_null());
    }

    #[test]
    fn every_status_maps_to_a_documented_type() {
        for status in 100..600 {
            assert!(ERROR_TYPES.contains(&kind_for_status(status)), "{status}");
        }
        for e in [ApiError::invalid("p", "m"), ApiError::internal("m")] {
            assert!(ERROR_TYPES.contains(&e.kind));
        }
    }

    #[test]
    fn malformed_json_is_a_400() {
        let err = parse_json::<serde_json::Value>(b"{not json").unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.starts_with("Invalid request body"));
    }
}
