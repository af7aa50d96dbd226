//! The OpenAPI document: the gateway serves the one generated from its handlers' types, and
//! `gateway/openapi.json`, the copy for readers, is that document (`TIDAL_BLESS=1` rewrites
//! a stale copy instead of failing).

mod common;

use common::*;
use serde_json::Value;

const COPY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");

#[test]
fn the_checked_in_copy_is_current() {
    let generated = tidal_gateway::openapi::document().unwrap();
    let on_disk: Option<Value> = std::fs::read_to_string(COPY)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    if on_disk.as_ref() == Some(&generated) {
        return;
    }
    if std::env::var_os("TIDAL_BLESS").is_some_and(|v| v == "1") {
        let text = serde_json::to_string_pretty(&generated).unwrap();
        std::fs::write(COPY, text + "\n").unwrap();
        return;
    }
    panic!(
        "gateway/openapi.json differs from the generated document; rewrite it with \
         TIDAL_BLESS=1 cargo test -p tidal-gateway --test openapi"
    );
}

#[tokio::test]
async fn the_served_document_is_the_generated_one() {
    let h = Harness::start().await;
    let r = h.get("/openapi.json", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let served: Value = r.json().await.unwrap();
    assert_eq!(served, tidal_gateway::openapi::document().unwrap());
    h.stop().await;
}
