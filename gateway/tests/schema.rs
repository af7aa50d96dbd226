//! The handlers accept exactly what the OpenAPI document allows: each body below is checked
//! against its schema in the document and sent to the gateway, and the two must agree
//! (schema-valid: not a 400; schema-invalid: a 400 with an OpenAI error body). Also the
//! admin API's strictness: explicit removal, no `null` where a value is required, tenant
//! names and ids validated before they reach the ledger.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

fn document() -> Value {
    tidal_gateway::openapi::document().unwrap()
}

/// A validator for `#/components/schemas/{name}` of the document.
fn component(doc: &Value, name: &str) -> jsonschema::Validator {
    let root = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&root).unwrap()
}

/// A validator for the request body of `method path`.
fn request_body(doc: &Value, path: &str, method: &str) -> jsonschema::Validator {
    let schema =
        &doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "{method} {path} has a body schema");
    let mut root = schema.clone();
    root["components"] = doc["components"].clone();
    jsonschema::validator_for(&root).unwrap()
}

/// Sends `body` and checks that the handler's verdict matches the schema's.
async fn agree(
    h: &Harness,
    validator: &jsonschema::Validator,
    method: Method,
    path: &str,
    token: &str,
    body: &Value,
) {
    let valid = validator.is_valid(body);
    let r = h
        .http
        .request(method.clone(), format!("{}{path}", h.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    if valid {
        assert!(
            (200..300).contains(&status),
            "{method} {path} {body}: the schema allows it, the gateway said {status} {text}"
        );
    } else {
        assert_eq!(
            status, 400,
            "{method} {path} {body}: the schema forbids it, the gateway said {status} {text}"
        );
        let e: Value = serde_json::from_str(&text).unwrap();
        assert!(e["error"]["message"].is_string(), "{text}");
    }
}

fn chat_with(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test]
async fn completion_bodies_match_the_schema() {
    let h = Harness::start().await;
    let w = h.worker(MODEL, 0);
    let doc = document();
    let chat_schema = component(&doc, "ChatCompletionRequest");
    let completion_schema = component(&doc, "CompletionRequest");
    for extra in [
        json!({}),
        json!({"top_p": 5e-324}),
        json!({"top_p": 1.0}),
        json!({"top_p": 0}),
        json!({"top_p": 1.0000001}),
        json!({"temperature": 2.0000000001}),
        json!({"temperature": null}),
        json!({"repetition_penalty": 1e-300}),
        json!({"max_tokens": 16.0}),
        json!({"max_tokens": 1.6e1}),
        json!({"max_tokens": 16.5}),
        json!({"max_tokens": 0}),
        json!({"max_tokens": null}),
        json!({"n": 1.0}),
        json!({"n": 2}),
        json!({"top_k": -1}),
        json!({"top_k": -2}),
        json!({"seed": -5}),
        json!({"seed": 18446744073709551615u64}),
        json!({"stop": null}),
        json!({"stop": ["a", "b"]}),
        json!({"stop": [""]}),
        json!({"stop_token_ids": [2.0, 7]}),
        json!({"stop_token_ids": [-1]}),
        json!({"stop_token_ids": [4294967296u64]}),
        json!({"logprobs": true, "top_logprobs": 3.0}),
        json!({"top_logprobs": 3}),
        json!({"top_logprobs": null}),
        json!({"logprobs": true, "top_logprobs": 21}),
        json!({"model": ""}),
        json!({"messages": []}),
        json!({"user": null, "ignore_eos": null, "stream_options": null}),
        json!({"seed": -9223372036854775807i64}),
        json!({"seed": -9223372036854775808i64}),
        json!({"seed": -9223372036854775809.0}),
        json!({"messages": [{"role": "robot", "content": "x"}]}),
        json!({"messages": [{"role": "user"}]}),
        json!({"messages": [{"role": "user", "content": null}]}),
        json!({"messages": [{"role": "user", "content": []}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url", "text": "a"}]}]}),
        json!({"stop": "x"}),
        json!({"stop": ["a", "b", "c", "d", "e"]}),
        json!({"logprobs": false, "top_logprobs": 2}),
    ] {
        let body = chat_with(extra);
        let v = &chat_schema;
        agree(&h, v, Method::POST, "/v1/chat/completions", &h.key, &body).await;
    }
    for body in [
        json!({"model": MODEL, "prompt": "a b"}),
        json!({"model": MODEL, "prompt": [1.0, 2]}),
        json!({"model": MODEL, "prompt": [[3]]}),
        json!({"model": MODEL, "prompt": [[]]}),
        json!({"model": MODEL, "prompt": [""]}),
        json!({"model": MODEL, "prompt": [-1]}),
        json!({"model": MODEL, "prompt": "x", "echo": null, "best_of": 1.0, "suffix": null}),
        json!({"model": MODEL, "prompt": "x", "echo": true}),
        json!({"model": MODEL, "prompt": "x", "best_of": 2}),
        json!({"model": MODEL, "prompt": "x", "logprobs": 2.0}),
    ] {
        let v = &completion_schema;
        agree(&h, v, Method::POST, "/v1/completions", &h.key, &body).await;
    }
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn admin_bodies_match_the_schema() {
    let h = Harness::start().await;
    let doc = document();
    let tenants = request_body(&doc, "/v1/admin/tenants", "post");
    for body in [
        json!({"id": "gamma"}),
        json!({"id": "delta", "name": "Delta GmbH & Co. KG"}),
        json!({"id": "nul", "name": "a\u{0}b"}),
        json!({"id": "tab", "name": "a\tb"}),
        json!({"id": "bidi", "name": "evil\u{202e}gnp"}),
        json!({"id": "empty", "name": ""}),
        json!({"id": "long", "name": "x".repeat(129)}),
        json!({"id": "nullname", "name": null}),
        json!({"id": "Bad Id"}),
        json!({"id": "x", "extra": 1}),
        json!(["x"]),
    ] {
        agree(
            &h,
            &tenants,
            Method::POST,
            "/v1/admin/tenants",
            ADMIN,
            &body,
        )
        .await;
    }
    let budget = request_body(&doc, "/v1/admin/tenants/{tenant}/budget", "put");
    let path = "/v1/admin/tenants/acme/budget";
    for body in [
        json!({"monthly_budget_micros": 4390.0}),
        json!({"monthly_budget_micros": 4390}),
        json!({"monthly_budget_micros": 4390.5}),
        json!({"monthly_budget_micros": -1}),
        json!({"monthly_budget_micros": 9223372036854775808u64}),
        json!({"monthly_budget_micros": "lots"}),
        json!({}),
        json!([4390]),
        json!({"monthly_budget_micros": null}),
    ] {
        agree(&h, &budget, Method::PUT, path, ADMIN, &body).await;
    }
    let limits = request_body(&doc, "/v1/admin/tenants/{tenant}/limits", "put");
    let path = "/v1/admin/tenants/acme/limits";
    for body in [
        json!({"requests_per_min": 5.0, "tokens_per_min": null}),
        json!({"requests_per_min": null, "tokens_per_min": null}),
        json!({"requests_per_min": 5}),
        json!({}),
        json!([null, null]),
        json!({"requests_per_min": 0, "tokens_per_min": null}),
        json!({"requests_per_min": 9223372036854775808u64, "tokens_per_min": null}),
    ] {
        agree(&h, &limits, Method::PUT, path, ADMIN, &body).await;
    }
    let keys = request_body(&doc, "/v1/admin/tenants/{tenant}/keys", "post");
    let path = "/v1/admin/tenants/acme/keys";
    for body in [
        json!({}),
        json!({"role": "admin"}),
        json!({"role": null}),
        json!({"role": "root"}),
        json!([]),
    ] {
        agree(&h, &keys, Method::POST, path, ADMIN, &body).await;
    }
    h.stop().await;
}

#[tokio::test]
async fn a_budget_is_removed_only_explicitly() {
    let h = Harness::start().await;
    let put = |body: Value| {
        h.admin(
            Method::PUT,
            "/v1/admin/tenants/acme/budget",
            Some(ADMIN),
            Some(body),
        )
    };
    let r = put(json!({"monthly_budget_micros": 4390.0})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["budget"]["budget_micros"], 4390);
    error(put(json!({})).await, 400).await;
    let op = tidal_billing::Principal::operator();
    let t = h.ledger.tenant(&op, "acme").await.unwrap();
    assert_eq!(
        t.monthly_budget_micros,
        Some(4390),
        "an empty body removes nothing"
    );
    let r = put(json!({"monthly_budget_micros": null})).await;
    assert_eq!(r.status(), 200);
    let t = h.ledger.tenant(&op, "acme").await.unwrap();
    assert_eq!(
        t.monthly_budget_micros, None,
        "an explicit null removes the budget"
    );
    h.stop().await;
}

#[tokio::test]
async fn malformed_names_in_paths_are_400_not_503() {
    let h = Harness::start().await;
    for path in [
        "/v1/admin/tenants/a%00b",
        "/v1/admin/tenants/Acme",
        "/v1/admin/tenants/a%0Ab/keys",
    ] {
        let method = if path.ends_with("/keys") {
            Method::POST
        } else {
            Method::GET
        };
        error(h.admin(method, path, Some(ADMIN), None).await, 400).await;
    }
    let r = h
        .admin(
            Method::PUT,
            "/v1/admin/tenants/a%00b/budget",
            Some(ADMIN),
            Some(json!({"monthly_budget_micros": 1})),
        )
        .await;
    error(r, 400).await;
    let r = h
        .admin(Method::DELETE, "/v1/admin/keys/a%00b", Some(ADMIN), None)
        .await;
    error(r, 404).await;
    h.stop().await;
}

#[tokio::test]
async fn event_ids_are_bounded_as_documented() {
    let h = Harness::start().await;
    let doc = document();
    let params = doc["paths"]["/v1/requests/{id}/events"]["get"]["parameters"]
        .as_array()
        .unwrap();
    for name in ["after", "Last-Event-ID"] {
        let p = params.iter().find(|p| p["name"] == name).unwrap();
        assert_eq!(p["schema"]["minimum"], 0, "{name}");
        assert_eq!(p["schema"]["maximum"], json!(u64::MAX), "{name}");
    }
    let id = uuid::Uuid::now_v7();
    let events = |after: &str| format!("/v1/requests/{id}/events?after={after}");
    // The largest documented value is taken (the request is unknown: 404)...
    let r = h.get(&events("18446744073709551615"), Some(&h.key)).await;
    error(r, 404).await;
    // ...one more is a 400 naming the parameter.
    for bad in ["18446744073709551616", "-1"] {
        let r = h.get(&events(bad), Some(&h.key)).await;
        let e = error(r, 400).await;
        assert_eq!(e["error"]["param"], "after", "after={bad}");
    }
    h.stop().await;
}
