//! Budgets under concurrency: each admitted request holds its worst case in the ledger, so
//! twenty requests racing for a small budget cannot spend past it, and the holds are gone
//! once billing has the requests' usage.

mod common;

use std::time::Duration;

use common::{eventually, Harness};
use serde_json::{json, Value};
use tidal_billing::queue_source::to_record;
use tidal_billing::Principal;
use tidal_queue::{ModelRecord, ModelState, Prices};

const PRICED: &str = "priced";

/// 0.01 micros a prompt token, one micro a completion token.
fn priced() -> ModelRecord {
    ModelRecord {
        id: PRICED.into(),
        state: ModelState::Ready,
        prices: Prices {
            currency: "USD".into(),
            input_per_mtok_micros: 10_000,
            cached_input_per_mtok_micros: 10_000,
            output_per_mtok_micros: 1_000_000,
        },
        max_queue_wait_ms: 30_000,
        backlog_cap: 0,
        context_length: 8192,
    }
}

/// Publishes the priced model to the broker and its prices to the ledger, as the controller
/// and the local fleet do.
async fn publish_priced(h: &Harness) {
    let record = priced();
    h.broker.put_model(&record).await.unwrap();
    let prices = tidal_billing::Prices::from(&record.prices);
    let since = chrono::Utc::now() - chrono::Duration::days(1);
    h.ledger
        .set_price(PRICED, since, prices, since)
        .await
        .unwrap();
}

/// Moves every usage event in the broker into the ledger, as the billing consumer does.
async fn ingest(h: &Harness) -> usize {
    let mut n = 0;
    loop {
        let batch = h
            .broker
            .read_usage("billing-test", 256, Duration::from_millis(10))
            .await
            .unwrap();
        if batch.is_empty() {
            return n;
        }
        let records: Vec<_> = batch.iter().map(|d| to_record(&d.event).unwrap()).collect();
        // SQLite refuses a batch whose read snapshot a hold's commit made stale ("database
        // is locked"); the billing consumer retries such a batch, and so does this.
        let mut tries = 0;
        while let Err(e) = h.ledger.record_batch(&records).await {
            tries += 1;
            assert!(e.is_transient() && tries < 50, "ingest failed: {e}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ids: Vec<_> = batch.into_iter().map(|d| d.entry_id).collect();
        h.broker.ack_usage(&ids).await.unwrap();
        n += records.len();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_cannot_spend_past_the_budget() {
    let h = Harness::start().await;
    publish_priced(&h).await;
    h.ledger.set_budget("acme", Some(50)).await.unwrap();
    // Slow enough that the twenty requests overlap.
    let w = h.worker(PRICED, 40);
    // Worst case: (9 bytes + 256 template + 16 message) prompt tokens at 0.01 micros and 5
    // completion tokens at 1 micro = 7.81 micros. Real cost: 5 prompt tokens and 5
    // completion tokens = 5.05 micros.
    let body = json!({"model": PRICED, "max_tokens": 5,
        "messages": [{"role": "user", "content": "a b c d e"}]})
    .to_string();
    let sends: Vec<_> = (0..20)
        .map(|_| h.post("/v1/chat/completions", Some(&h.key), &body))
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for r in futures::future::join_all(sends).await {
        match r.status().as_u16() {
            200 => {
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["usage"]["completion_tokens"], 5);
                ok += 1;
            }
            402 => {
                let v: Value = r.json().await.unwrap();
                let msg = v["error"]["message"].as_str().unwrap().to_owned();
                assert!(msg.contains("max_tokens") && msg.contains("50"), "{msg}");
                refused += 1;
            }
            s => panic!("unexpected status {s}: {}", r.text().await.unwrap()),
        }
    }
    println!("admitted {ok}, refused {refused} of 20 on a 50-micro budget");
    assert!(ok >= 6, "six worst cases fit in 50 micros, admitted {ok}");
    assert!(
        refused > 0,
        "twenty requests of 5.05 micros cannot all fit in 50"
    );

    // The worker publishes usage after the answer: ingest until every request's is in.
    let mut events = 0;
    for _ in 0..200 {
        events += ingest(&h).await;
        if events >= ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(events, ok, "one usage event per admitted request");
    let now = chrono::Utc::now();
    let status = h
        .ledger
        .budget_status(&Principal::operator(), "acme", now)
        .await
        .unwrap();
    assert!(
        status.spent_micros <= 50,
        "spent {} micros of a 50-micro budget",
        status.spent_micros
    );
    // Holds of finished requests are gone once billing has their usage.
    let ledger = h.ledger.clone();
    eventually("every hold settled and billed", || {
        let ledger = ledger.clone();
        async move { ledger.open_holds_pico("acme", now).await.unwrap() == 0 }
    })
    .await;
    w.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn a_request_whose_worst_case_does_not_fit_is_refused_before_it_runs() {
    let h = Harness::start().await;
    publish_priced(&h).await;
    h.ledger.set_budget("acme", Some(100)).await.unwrap();
    // No max_tokens on chat: the worst case is the whole context, 8192 micros.
    let body = json!({"model": PRICED, "messages": [{"role": "user", "content": "hi"}]});
    let r = h
        .post("/v1/chat/completions", Some(&h.key), &body.to_string())
        .await;
    let e = common::error(r, 402).await;
    assert_eq!(e["error"]["code"], "insufficient_quota");
    assert_eq!(
        h.broker.depth(PRICED).await.unwrap().backlog,
        0,
        "nothing enqueued"
    );
    // With max_tokens it fits, and its hold is released when it is answered.
    let w = h.worker(PRICED, 0);
    let body = json!({"model": PRICED, "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = h
        .post("/v1/chat/completions", Some(&h.key), &body.to_string())
        .await;
    assert_eq!(r.status(), 200);
    // A tenant without a budget holds nothing.
    let r = h
        .post("/v1/chat/completions", Some(&h.key_b), &body.to_string())
        .await;
    assert_eq!(r.status(), 200);
    let now = chrono::Utc::now();
    let ledger = h.ledger.clone();
    let harness = &h;
    eventually("the hold is billed and gone", || {
        let ledger = ledger.clone();
        async move {
            ingest(harness).await;
            ledger.open_holds_pico("acme", now).await.unwrap() == 0
        }
    })
    .await;
    assert_eq!(h.ledger.open_holds_pico("beta", now).await.unwrap(), 0);
    w.stop().await;
    h.stop().await;
}
