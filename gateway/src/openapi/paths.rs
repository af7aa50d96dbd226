//! The operations of the document, one per route of [`crate::route_table`], each naming the
//! types its handler reads and writes.

use axum::http::Method;
use serde_json::{json, Map, Value};
use tidal_billing::{IssuedKey, Tenant};
use tidal_protocol::chat::{ChatCompletion, ChatCompletionChunk, ChatCompletionRequest};
use tidal_protocol::completion::{Completion, CompletionRequest};
use tidal_protocol::error::ErrorBody;

use super::build::{
    body, error, json_response, request_id_header, retry, security, Operation, Schemas,
};
use crate::routes::admin::{
    BudgetBody, LimitsBody, NewKey, NewTenant, RevokedKey, TenantBudget, TenantLimits, TenantList,
    TenantView, TENANT_ID_PATTERN,
};
use crate::routes::completions::ModelList;
use crate::routes::ops::Health;
use crate::routes::{ADMIN_BODY_BYTES, COMPLETION_BODY_BYTES};

const STREAM: &str = "The completion: JSON, or with `stream: true` an SSE stream \
(`text/event-stream`) of `data: <chunk>` events, each with `id: <seq>` (the response event's \
sequence number, for reattaching), ending with `data: [DONE]`. A chat stream opens with an \
assistant-role chunk; with `stream_options.include_usage` the last chunk before `[DONE]` has no \
choices and carries `usage`. An error after streaming began arrives as a \
`data: {\"error\": {...}}` chunk followed by `[DONE]`.";

const UNAVAILABLE: &str = "The model's backlog is at its cap, no worker started the request \
within the model's max queue wait (the job was withdrawn and never runs), or the queue is \
unreachable. Code `gateway_restarting`: this gateway began stopping while the request was still \
queued; the request was NOT cancelled and keeps its `x-request-id` (read its result with \
`GET /v1/requests/{id}/events`). A streaming request gets the same error as the only chunk of a \
200 stream. Code `service_unavailable` also when the ledger is unreachable and the key's or \
tenant's last successful check is older than the gateway's `max_stale` (60 s by default). Code \
`request_lost`: the queue lost the request (its data was lost while it was queued or running), \
so it will not complete; it may be retried (mid-stream: an error chunk, then `[DONE]`).";

const IDEMPOTENCY: &str = "Makes retries safe: the first request with a key (per tenant, kept \
24 h) runs; a retry with the same key and the same body, while that request is still running or \
undelivered (e.g. after its connection or its gateway died), enqueues nothing and answers as the \
first request (same `x-request-id`, same text). A retry after the answer was delivered gets 409; \
a different body under a used key 422. A request that ended without an answer (its client went \
away, or its max queue wait passed) frees its key.";

/// `#/components/parameters/IdempotencyKey`: the header `admission` reads.
pub(super) fn idempotency_key() -> Value {
    json!({
        "name": "Idempotency-Key",
        "in": "header",
        "required": false,
        "description": IDEMPOTENCY,
        "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x21-\\x7e]+$"},
    })
}

/// Every operation.
pub(super) fn operations(s: &mut Schemas) -> Vec<Operation> {
    let mut ops = completions(s);
    ops.push(events(s));
    ops.extend(admin(s));
    ops.extend(ops_routes(s));
    ops
}

/// Responses by status.
fn responses(entries: Vec<(u16, Value)>) -> Value {
    let map: Map<String, Value> = entries
        .into_iter()
        .map(|(status, r)| (status.to_string(), r))
        .collect();
    Value::Object(map)
}

/// `text/event-stream` of `chunks`: the schema of each event (OpenAPI 3.2's `itemSchema`,
/// which schemathesis reads `schema` as before 3.2), its `data` a JSON chunk or error body,
/// or `[DONE]`.
fn event_stream(s: &mut Schemas, chunks: Vec<Value>) -> Value {
    let mut payloads = chunks;
    payloads.push(s.response::<ErrorBody<'static>>());
    json!({
        "schema": {
            "type": "object",
            "description": "One server-sent event.",
            "required": ["data"],
            "properties": {
                "id": {
                    "type": "string",
                    "pattern": "^[0-9]+$",
                    "description": "The response event's sequence number (`Last-Event-ID` or `after` of a reattach).",
                },
                "data": {
                    "type": "string",
                    "description": "A chunk, an error (then `[DONE]`), or `[DONE]`: the end.",
                    "if": {"const": "[DONE]"},
                    "else": {
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": payloads},
                    },
                },
            },
        },
    })
}

fn completion_op(
    s: &mut Schemas,
    id: &str,
    summary: &str,
    description: &str,
    request: Value,
    response: Value,
    chunk: Value,
) -> Value {
    let mut ok = json_response(STREAM, response);
    ok["headers"] = request_id_header();
    ok["content"]["text/event-stream"] = event_stream(s, vec![chunk]);
    json!({
        "summary": summary,
        "description": description,
        "operationId": id,
        "security": security("apiKey"),
        "parameters": [{"$ref": "#/components/parameters/IdempotencyKey"}],
        "requestBody": body(request, true),
        "responses": responses(vec![
            (200, ok),
            (400, error(s, "Malformed JSON, a field of the wrong type, or a value out of range (`param` names it); a malformed `Idempotency-Key`.")),
            (401, error(s, "Missing, unknown or revoked API key (checked before the body is read).")),
            (402, error(s, "The tenant's monthly budget is spent (`insufficient_quota`).")),
            (404, error(s, "No such model (`model_not_found`).")),
            (408, error(s, "The body did not arrive within 30 s.")),
            (409, error(s, "`Idempotency-Key` was already used for a request whose answer was delivered (`idempotency_key_reused`); the message names that request.")),
            (413, error(s, &format!("Body larger than 4 MiB ({COMPLETION_BODY_BYTES} bytes), the cap of completion routes: a prompt filling a 128k-token context is about 1 MiB of JSON."))),
            (422, error(s, "`Idempotency-Key` was first used with a different body or endpoint (`idempotency_key_mismatch`).")),
            (429, retry(s, "Over the tenant's requests/min or tokens/min limit (`rate_limit_exceeded`).")),
            (503, retry(s, UNAVAILABLE)),
            (504, error(s, "A started request's worker stopped responding (`worker_timeout`).")),
        ]),
    })
}

fn completions(s: &mut Schemas) -> Vec<Operation> {
    let (request, response, chunk) = (
        s.request::<ChatCompletionRequest>(),
        s.response::<ChatCompletion>(),
        s.response::<ChatCompletionChunk>(),
    );
    let chat = completion_op(
        s,
        "create_chat_completion",
        "Create chat completion",
        "Queues the request for the model's workers and answers when it has produced its first tokens (non-streaming: when it is done).",
        request,
        response,
        chunk,
    );
    let (request, response) = (s.request::<CompletionRequest>(), s.response::<Completion>());
    let chunk = response.clone();
    let completion = completion_op(
        s,
        "create_completion",
        "Create completion",
        "Legacy text completion; same lifecycle as chat completions.",
        request,
        response,
        chunk,
    );
    let models = json!({
        "summary": "List models",
        "operationId": "list_models",
        "security": security("apiKey"),
        "responses": responses(vec![
            (200, json_response("Every model with its serving state and per-million-token prices.", s.response::<ModelList>())),
            (401, error(s, "Missing, unknown or revoked API key.")),
            (503, retry(s, "The ledger (which holds the models' price history) or the queue is unreachable (`service_unavailable`).")),
        ]),
    });
    vec![
        Operation::new("/v1/chat/completions", Method::POST, chat),
        Operation::new("/v1/completions", Method::POST, completion),
        Operation::new("/v1/models", Method::GET, models),
    ]
}

/// An event id, as `after` and `Last-Event-ID` take it.
fn event_id(name: &str, place: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": place,
        "required": false,
        "schema": {"type": "integer", "minimum": 0, "maximum": u64::MAX},
        "description": description,
    })
}

fn events(s: &mut Schemas) -> Operation {
    let chunks = vec![
        s.response::<ChatCompletionChunk>(),
        s.response::<Completion>(),
    ];
    let mut ok = json!({
        "description": "SSE stream as for `stream: true`, of the original endpoint's chunks.",
        "content": {"text/event-stream": event_stream(s, chunks)},
    });
    ok["headers"] = request_id_header();
    let spec = json!({
        "summary": "Reattach to a request",
        "description": "Resumes the response of a request sent earlier by the same tenant, e.g. after the connection to a gateway broke (a restart). Answers an SSE stream in the shape of the original endpoint's chunks (whether or not the original asked for a stream), starting after the event named by `Last-Event-ID` or `after`. A request is reattachable until it was delivered in full or cancelled (its client went away) and while its response stream lives (10 minutes after its last event by default).",
        "operationId": "request_events",
        "security": security("apiKey"),
        "parameters": [
            {
                "name": "id",
                "in": "path",
                "required": true,
                "schema": {"type": "string", "format": "uuid"},
                "description": "The request id (`x-request-id`).",
            },
            event_id("after", "query", "Resume after this event id (wins over `Last-Event-ID`)."),
            event_id("Last-Event-ID", "header", "The `id:` of the last SSE event received."),
        ],
        "responses": responses(vec![
            (200, ok),
            (400, error(s, "`after` or `Last-Event-ID` is not a non-negative integer.")),
            (401, error(s, "Missing, unknown or revoked API key.")),
            (404, error(s, "No such request of this tenant (unknown, another tenant's, or already delivered): `request_not_found`.")),
            (503, retry(s, "The request was still queued at its deadline and was withdrawn, or (code `request_lost`) the queue lost it and it will not complete; it may be retried; or the queue is unreachable.")),
            (504, error(s, "The worker stopped responding.")),
        ]),
    });
    Operation::new("/v1/requests/{id}/events", Method::GET, spec)
}

/// An admin operation.
struct Admin<'a> {
    id: &'a str,
    summary: &'a str,
    description: Option<&'a str>,
    /// Path parameters.
    params: Value,
    /// The request body's schema and whether the body is required, if it takes one.
    body: Option<(Value, bool)>,
    /// The success: status and response.
    ok: (u16, Value),
    /// Responses besides the ones every admin operation has.
    extra: Vec<(u16, Value)>,
}

impl Admin<'_> {
    fn spec(self, s: &mut Schemas) -> Value {
        let mut list = vec![
            self.ok,
            (400, error(s, "Malformed body (not a JSON object, unknown or missing field, wrong type), or an invalid value (e.g. a tenant id not matching the pattern, a control character in a name).")),
            (401, error(s, "Missing or wrong admin token.")),
            (403, error(s, "The admin API is disabled (no admin token configured).")),
            (404, error(s, "No such tenant or key.")),
            (503, retry(s, "The ledger is unreachable.")),
        ];
        list.extend(self.extra);
        if self.body.is_some() {
            list.push((408, error(s, "The body did not arrive within 30 s.")));
            let cap = format!(
                "Body larger than 64 KiB ({ADMIN_BODY_BYTES} bytes), the cap of admin routes."
            );
            list.push((413, error(s, &cap)));
        }
        let mut spec = json!({
            "summary": self.summary,
            "operationId": self.id,
            "security": security("adminToken"),
            "parameters": self.params,
            "responses": responses(list),
        });
        if let Some(d) = self.description {
            spec["description"] = d.into();
        }
        if let Some((schema, required)) = self.body {
            spec["requestBody"] = body(schema, required);
        }
        spec
    }
}

fn admin(s: &mut Schemas) -> Vec<Operation> {
    let tenant = json!([{
        "name": "tenant",
        "in": "path",
        "required": true,
        "schema": {"type": "string", "pattern": TENANT_ID_PATTERN},
    }]);
    let key_id =
        json!([{"name": "key_id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    let done = |schema: Value| json_response("Done.", schema);
    let specs = [
        ("/v1/admin/tenants", Method::GET, Admin {
            id: "list_tenants",
            summary: "List tenants",
            description: None,
            params: json!([]),
            body: None,
            ok: (200, done(s.response::<TenantList>())),
            extra: vec![],
        }),
        ("/v1/admin/tenants", Method::POST, Admin {
            id: "create_tenant",
            summary: "Create tenant",
            description: None,
            params: json!([]),
            body: Some((s.request::<NewTenant>(), true)),
            ok: (201, done(s.response::<Tenant>())),
            extra: vec![(409, error(s, "A tenant with this id exists already (`conflict`)."))],
        }),
        ("/v1/admin/tenants/{tenant}", Method::GET, Admin {
            id: "show_tenant",
            summary: "Show tenant",
            description: Some("The tenant, its limits, its budget status this month and its keys."),
            params: tenant.clone(),
            body: None,
            ok: (200, done(s.response::<TenantView>())),
            extra: vec![],
        }),
        ("/v1/admin/tenants/{tenant}/keys", Method::POST, Admin {
            id: "issue_key",
            summary: "Issue key",
            description: Some("Issues a new API key. Its `secret` is in this response only; the ledger stores its SHA-256."),
            params: tenant.clone(),
            body: Some((s.request::<NewKey>(), false)),
            ok: (201, done(s.response::<IssuedKey>())),
            extra: vec![],
        }),
        ("/v1/admin/tenants/{tenant}/limits", Method::PUT, Admin {
            id: "set_rate_limits",
            summary: "Set rate limits",
            description: Some("Replaces the tenant's limits. Both fields are required; `null` makes a limit unlimited (an empty body is a 400, so nothing is removed by accident). Gateways pick the change up within their cache time (2 s by default)."),
            params: tenant.clone(),
            body: Some((s.request::<LimitsBody>(), true)),
            ok: (200, done(s.response::<TenantLimits>())),
            extra: vec![],
        }),
        ("/v1/admin/tenants/{tenant}/budget", Method::PUT, Admin {
            id: "set_budget",
            summary: "Set budget",
            description: Some("Sets or, with an explicit `{\"monthly_budget_micros\": null}`, removes the tenant's monthly budget."),
            params: tenant,
            body: Some((s.request::<BudgetBody>(), true)),
            ok: (200, done(s.response::<TenantBudget>())),
            extra: vec![],
        }),
        ("/v1/admin/keys/{key_id}", Method::DELETE, Admin {
            id: "revoke_key",
            summary: "Revoke key",
            description: Some("Revokes a key (idempotent). Immediate on this gateway; other replicas within their cache time."),
            params: key_id,
            body: None,
            ok: (200, done(s.response::<RevokedKey>())),
            extra: vec![],
        }),
    ];
    specs
        .into_iter()
        .map(|(path, method, op)| Operation::new(path, method, op.spec(s)))
        .collect()
}

fn ops_routes(s: &mut Schemas) -> Vec<Operation> {
    let health = json!({
        "summary": "Liveness",
        "operationId": "health",
        "responses": {"200": json_response("Serving.", s.response::<Health>())},
    });
    let metrics = json!({
        "summary": "Prometheus metrics",
        "operationId": "metrics",
        "responses": responses(vec![
            (200, json!({
                "description": "Prometheus text format: tidal_gateway_requests_total, tidal_gateway_request_duration_seconds, tidal_gateway_queue_wait_seconds, tidal_gateway_errors_total, tidal_gateway_in_flight and more.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            })),
            (404, error(s, "Metrics are not enabled in this process.")),
        ]),
    });
    let openapi = json!({
        "summary": "This document",
        "operationId": "openapi",
        "responses": responses(vec![
            (200, json_response("OpenAPI 3.1.", json!({"type": "object"}))),
            (500, error(s, "The document could not be generated (a defect of the gateway).")),
        ]),
    });
    vec![
        Operation::new("/health", Method::GET, health),
        Operation::new("/metrics", Method::GET, metrics),
        Operation::new("/openapi.json", Method::GET, openapi),
    ]
}
