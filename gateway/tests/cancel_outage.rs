//! A client that goes away while the gateway cannot reach Redis is still billed only for
//! what it was handed: the gateway retries the cancel through the outage, so the worker
//! (which still reaches Redis) stops at the cancel instead of billing the whole answer.
//!
//! The gateway talks to the shared Redis through a TCP proxy that the test switches off; the
//! fake worker talks to it directly.

mod common;
mod proxy;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use proxy::{authority, Proxy};
use tidal_queue::testing::{drain_usage, ensure_redis};
use tidal_queue::{Broker, BrokerConfig, RedisBroker};
use uuid::Uuid;

async fn broker(url: &str, prefix: &str) -> Arc<dyn Broker> {
    let config = BrokerConfig {
        prefix: prefix.to_owned(),
        ..BrokerConfig::default()
    };
    Arc::new(RedisBroker::connect(url, config).await.unwrap())
}

async fn cleanup(url: &str, prefix: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await
        .unwrap();
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<i64>(&mut c)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_cancel_lands_after_a_redis_outage() {
    let url = ensure_redis().await.unwrap();
    let prefix = format!("tidal-test-gwcancel-{}:", Uuid::now_v7().simple());
    let proxy = Proxy::start(authority(&url)).await;
    let via_proxy = url.replacen(&authority(&url), &proxy.addr, 1);
    let direct = broker(&url, &prefix).await;
    let gateway_broker = broker(&via_proxy, &prefix).await;

    let h = Harness::start().await;
    let record = h.broker.model(MODEL).await.unwrap().unwrap();
    direct.put_model(&record).await.unwrap();
    let gateway = tidal_gateway::Gateway::new(
        gateway_broker,
        h.ledger.clone(),
        h.limiter.clone(),
        config(),
    );
    let (base, server) = serve(&gateway).await;
    // 60 words at 100 ms each: the answer would take 6 s in full.
    let worker = tidal_gateway::fake_worker::FakeWorker::spawn(
        direct.clone(),
        tidal_gateway::fake_worker::FakeWorkerConfig {
            token_delay: Duration::from_millis(100),
            ..tidal_gateway::fake_worker::FakeWorkerConfig::new(MODEL, "cancel-w")
        },
    );
    let words: Vec<String> = (0..60).map(|i| format!("w{i}")).collect();
    let r = h
        .http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&h.key)
        .header("content-type", "application/json")
        .body(chat(&words.join(" "), true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = Uuid::parse_str(r.headers()["x-request-id"].to_str().unwrap()).unwrap();
    let (events, stream) = read_events(r, 3).await;
    assert_eq!(chunk_text(&events), "w0 w1");

    // Redis goes away for the gateway, then its client does.
    proxy.down();
    drop(stream);
    // The outage lasts a second: the gateway's first cancel attempts fail meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(direct.cancelled(&[id]).await.unwrap(), vec![None]);
    proxy.up();

    let b = direct.clone();
    eventually("the cancel to land after the outage", || {
        let b = b.clone();
        async move { b.cancelled(&[id]).await.unwrap()[0].is_some() }
    })
    .await;
    let handed = direct.cancelled(&[id]).await.unwrap()[0].unwrap();
    let b = direct.clone();
    eventually("the worker to bill the request", || {
        let b = b.clone();
        async move { b.depth(MODEL).await.unwrap().in_flight == 0 }
    })
    .await;
    worker.stop().await;
    let usage = drain_usage(&*direct).await;
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert!(usage[0].last, "a cancelled request's bill ends it");
    // One token per word handed to the client (at least the two it read), not the 60 made.
    assert!(handed >= 2, "{handed}");
    assert_eq!(usage[0].completion_tokens, handed, "{usage:?}");
    assert!(handed < 60, "the cancel landed before the answer ended");

    server.abort();
    proxy.accept.abort();
    h.stop().await;
    cleanup(&url, &prefix).await;
}
