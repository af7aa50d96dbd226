//! The OpenAPI 3.1 document served at `/openapi.json`, generated from the types the handlers
//! read and write: request bodies from their `Deserialize` types, responses from their
//! `Serialize` types, both through `schemars` (the schema attributes on those types state the
//! checks past serde, such as ranges, so the document refuses what the handlers refuse).
//! [`paths`] lists the operations; every route of [`crate::route_table`] must have one and
//! every operation a route, or the document is not built.
//!
//! `gateway/openapi.json` is a copy for readers, kept current by the `openapi` test.

mod build;
mod paths;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

pub(crate) use build::{Operation, Schemas};

/// Why the document could not be built (a defect of the gateway, caught by its tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// Two types of one name have different schemas as request and as response.
    #[error("schema {0} differs between requests and responses")]
    SchemaClash(String),
    /// A route has no operation.
    #[error("route {1} {0} is not documented")]
    Undocumented(String, String),
    /// An operation has no route.
    #[error("operation {1} {0} is not served")]
    Unserved(String, String),
}

const DESCRIPTION: &str = "OpenAI-compatible API of Tidal. Requests wait in a per-model queue \
until a worker takes them; every response carries `x-request-id`. Errors use OpenAI's body \
`{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`. Rate limits are per tenant and per \
minute, counted with a sliding-window counter (previous minute weighted by its overlap plus the \
current minute) shared by all gateway replicas through Redis; tokens are counted when a request \
finishes (prompt + completion). Request bodies are read only after the API key (or admin token) \
is checked, and are capped per route: 4 MiB for completions, 64 KiB for the admin API (413 \
beyond; 408 when a body takes longer than 30 s to arrive). Fields typed `integer` accept any \
JSON number without a fractional part (`16`, `16.0`, `1.6e1`); optional request fields also \
accept `null`, meaning absent. While the ledger (keys, budgets, limits) is unreachable, a key or \
a tenant's settings checked successfully within the gateway's `max_stale` window (60 s by \
default) keep working; others get 503. A key refused by the ledger once (revoked) never works \
again. A method a path does not serve is a 405 with `Allow`.";

/// Builds the document.
pub fn document() -> Result<Value, DocError> {
    let mut schemas = Schemas::new();
    let operations = paths::operations(&mut schemas);
    check_routes(&operations)?;
    let mut paths = Map::new();
    for op in operations {
        let item = paths
            .entry(op.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(item) = item {
            item.insert(op.method.as_str().to_ascii_lowercase(), op.spec);
        }
    }
    Ok(json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tidal gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": DESCRIPTION,
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas.into_components()?,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant API key (`tidal_...`).",
                },
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The gateway's admin token (`--admin-token` / `TIDAL_ADMIN_TOKEN`).",
                },
            },
            "parameters": {"IdempotencyKey": paths::idempotency_key()},
        },
    }))
}

/// The document as served, generated on first use and then cached.
pub fn json() -> Result<&'static str, DocError> {
    static DOC: OnceLock<Result<String, DocError>> = OnceLock::new();
    DOC.get_or_init(|| {
        let doc = document()?;
        // A `Value` always serialises (its map keys are strings).
        Ok(serde_json::to_string_pretty(&doc).unwrap_or_default())
    })
    .as_ref()
    .map(String::as_str)
    .map_err(Clone::clone)
}

/// Every route has an operation and every operation a route.
fn check_routes(operations: &[Operation]) -> Result<(), DocError> {
    let key = |p: &str, m: &axum::http::Method| (p.to_owned(), m.as_str().to_owned());
    let routes: BTreeSet<_> = crate::route_table()
        .iter()
        .map(|(p, m)| key(p, m))
        .collect();
    let documented: BTreeSet<_> = operations.iter().map(|o| key(o.path, &o.method)).collect();
    if let Some((p, m)) = routes.difference(&documented).next() {
        return Err(DocError::Undocumented(p.clone(), m.clone()));
    }
    if let Some((p, m)) = documented.difference(&routes).next() {
        return Err(DocError::Unserved(p.clone(), m.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_builds_and_refers_only_to_its_schemas() {
        let doc = document().unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let text = doc.to_string();
        for part in text.split("\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(schemas.contains_key(name), "dangling $ref to {name}");
        }
        assert!(!text.contains("\"$defs\""), "every schema is a component");
        assert_eq!(json().unwrap(), serde_json::to_string_pretty(&doc).unwrap());
    }
}
