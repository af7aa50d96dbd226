//! The pieces the document is assembled from: schema generators for request and response
//! bodies, operations, and the responses they share.

use axum::http::Method;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};
use tidal_protocol::error::ErrorBody;

use super::DocError;

/// Schemas of request bodies (what their `Deserialize` accepts) and of responses (what their
/// `Serialize` writes: the two differ for fields with defaults or skipped when empty), to be
/// gathered under `#/components/schemas`.
pub(crate) struct Schemas {
    requests: SchemaGenerator,
    responses: SchemaGenerator,
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    })
}

impl Schemas {
    pub fn new() -> Self {
        Schemas {
            requests: settings().for_deserialize().into_generator(),
            responses: settings().for_serialize().into_generator(),
        }
    }

    /// `T`'s schema as a request body is read (a `$ref` for a named type).
    pub fn request<T: JsonSchema>(&mut self) -> Value {
        self.requests.subschema_for::<T>().to_value()
    }

    /// `T`'s schema as a response is written (a `$ref` for a named type).
    pub fn response<T: JsonSchema>(&mut self) -> Value {
        self.responses.subschema_for::<T>().to_value()
    }

    /// The named schemas of both kinds; a name may be shared only by identical schemas.
    pub fn into_components(mut self) -> Result<Map<String, Value>, DocError> {
        let mut all = self.requests.take_definitions(true);
        for (name, schema) in self.responses.take_definitions(true) {
            match all.get(&name) {
                Some(existing) if *existing != schema => return Err(DocError::SchemaClash(name)),
                Some(_) => {}
                None => {
                    all.insert(name, schema);
                }
            }
        }
        Ok(all)
    }
}

/// One operation: where it is served and its OpenAPI operation object.
pub(crate) struct Operation {
    pub path: &'static str,
    pub method: Method,
    pub spec: Value,
}

impl Operation {
    pub fn new(path: &'static str, method: Method, spec: Value) -> Self {
        Operation { path, method, spec }
    }
}

/// A JSON response of `schema`.
pub(crate) fn json_response(description: &str, schema: Value) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": schema}},
    })
}

/// An error response (OpenAI's error body).
pub(crate) fn error(s: &mut Schemas, description: &str) -> Value {
    json_response(description, s.response::<ErrorBody<'static>>())
}

/// An error response that carries `Retry-After`.
pub(crate) fn retry(s: &mut Schemas, description: &str) -> Value {
    let mut r = error(s, description);
    r["headers"] = json!({
        "Retry-After": {
            "description": "Seconds to wait before retrying.",
            "schema": {"type": "integer", "minimum": 1},
        },
    });
    r
}

/// The `x-request-id` header of a response.
pub(crate) fn request_id_header() -> Value {
    json!({
        "x-request-id": {
            "description": "The request id (UUIDv7), also the job id; present on every response.",
            "schema": {"type": "string", "format": "uuid"},
        },
    })
}

/// A request body of `schema`.
pub(crate) fn body(schema: Value, required: bool) -> Value {
    json!({
        "required": required,
        "content": {"application/json": {"schema": schema}},
    })
}

/// `security` of an operation for the scheme `name`.
pub(crate) fn security(name: &str) -> Value {
    let mut scheme = Map::new();
    scheme.insert(name.to_owned(), json!([]));
    json!([scheme])
}
