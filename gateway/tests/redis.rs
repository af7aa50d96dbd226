//! Against a real Redis: the Redis rate limiter behaves exactly like the in-process one
//! (same scenarios, same clock), replicas sharing counters never over-admit, and the whole
//! gateway works over the Redis broker and limiter.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidal_billing::ledger::RateLimits;
use tidal_gateway::limits::{Admission, LimitKind};
use tidal_gateway::{MemoryLimiter, RateLimiter, RedisLimiter};
use tidal_queue::testing::ensure_redis;
use tidal_queue::{Broker, BrokerConfig, ManualClock, RedisBroker};

fn prefix() -> String {
    format!("tidal-test-gw-{}:", uuid::Uuid::now_v7().simple())
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

fn limits(rpm: Option<u64>, tpm: Option<u64>) -> RateLimits {
    RateLimits {
        requests_per_min: rpm,
        tokens_per_min: tpm,
    }
}

fn wait_of(a: Admission) -> Option<(LimitKind, Duration)> {
    match a {
        Admission::Admitted => None,
        Admission::Limited { kind, retry_after } => Some((kind, retry_after)),
    }
}

/// The scenario both limiters must pass, with time driven by `clock`. Starts 20 s into a
/// window.
async fn scenario(l: &dyn RateLimiter, clock: &ManualClock) -> Vec<Option<(LimitKind, Duration)>> {
    let mut out = Vec::new();
    let rpm = limits(Some(3), None);
    for _ in 0..4 {
        out.push(wait_of(l.admit("t", &rpm).await.unwrap()));
    }
    // Into the next window: 3 requests of the previous one still weigh.
    clock.advance(Duration::from_secs(45)); // 5 s into the next window
    out.push(wait_of(l.admit("t", &rpm).await.unwrap()));
    clock.advance(Duration::from_secs(20)); // 25 s in: 3 * 35/60 = 1.75 → 1.75 + 1 <= 3
    out.push(wait_of(l.admit("t", &rpm).await.unwrap()));
    // Tokens: counted after the fact, admitted while under the limit.
    let tpm = limits(None, Some(100));
    out.push(wait_of(l.admit("u", &tpm).await.unwrap()));
    l.record_tokens("u", 250).await.unwrap();
    out.push(wait_of(l.admit("u", &tpm).await.unwrap()));
    // Other tenants are separate; no limits admit always.
    out.push(wait_of(l.admit("v", &rpm).await.unwrap()));
    out.push(wait_of(l.admit("t", &limits(None, None)).await.unwrap()));
    // Two windows later everything is forgotten.
    clock.advance(Duration::from_secs(130));
    out.push(wait_of(l.admit("u", &tpm).await.unwrap()));
    out
}

#[tokio::test]
async fn redis_limiter_matches_the_in_process_one() {
    let url = ensure_redis().await.unwrap();
    let start = 30_000_000 * 60_000 + 20_000; // 20 s into a minute
    let mem_clock = Arc::new(ManualClock::new(start));
    let mem = MemoryLimiter::new(mem_clock.clone());
    let expected = scenario(&mem, &mem_clock).await;

    let p = prefix();
    let redis_clock = Arc::new(ManualClock::new(start));
    let red = RedisLimiter::connect_with_clock(&url, &p, redis_clock.clone())
        .await
        .unwrap();
    let got = scenario(&red, &redis_clock).await;
    cleanup(&url, &p).await;
    assert_eq!(got, expected);

    // And the expectations themselves.
    assert!(expected[..3].iter().all(Option::is_none));
    // 4th at 20 s: curr 3 = limit → next window, where prev 3 must decay to 2: 20 s in.
    assert_eq!(
        expected[3],
        Some((LimitKind::Requests, Duration::from_secs(60)))
    );
    // 5 s into the next window: 3 * 55/60 + 1 > 3 → wait until 20 s in.
    assert_eq!(
        expected[4],
        Some((LimitKind::Requests, Duration::from_secs(15)))
    );
    assert_eq!(expected[5], None);
    assert_eq!(expected[6], None);
    assert!(matches!(expected[7], Some((LimitKind::Tokens, _))));
    assert_eq!(expected[8], None);
    assert_eq!(expected[9], None);
    assert_eq!(expected[10], None);
}

#[tokio::test]
async fn replicas_sharing_redis_never_over_admit() {
    let url = ensure_redis().await.unwrap();
    let p = prefix();
    let a = Arc::new(RedisLimiter::connect(&url, &p).await.unwrap());
    let b = Arc::new(RedisLimiter::connect(&url, &p).await.unwrap());
    let l = limits(Some(10), None);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let lim = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move { lim.admit("shared", &l).await.unwrap() });
    }
    let mut admitted = 0;
    while let Some(r) = tasks.join_next().await {
        if r.unwrap() == Admission::Admitted {
            admitted += 1;
        }
    }
    cleanup(&url, &p).await;
    // Within one window exactly the limit (the test may straddle a minute boundary, where
    // the previous window's weight still keeps it at or below the limit).
    assert!((1..=10).contains(&admitted), "{admitted}");
}

#[tokio::test]
async fn gateway_over_redis_broker_and_limiter() {
    let url = ensure_redis().await.unwrap();
    let p = prefix();
    let broker: Arc<dyn Broker> = Arc::new(
        RedisBroker::connect(
            &url,
            BrokerConfig {
                prefix: p.clone(),
                ..BrokerConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    let limiter: Arc<dyn RateLimiter> = Arc::new(RedisLimiter::connect(&url, &p).await.unwrap());
    let h = Harness::with(config(), Some(limiter)).await;
    // Swap in a gateway over Redis (the harness's ledger and keys).
    let g = tidal_gateway::Gateway::new(
        broker.clone(),
        h.ledger.clone(),
        h.limiter.clone(),
        config(),
    );
    let (base, server) = serve(&g).await;
    let rec = h.broker.model(MODEL).await.unwrap().unwrap();
    broker.put_model(&rec).await.unwrap();
    let worker = tidal_gateway::fake_worker::FakeWorker::spawn(
        broker.clone(),
        tidal_gateway::fake_worker::FakeWorkerConfig::new(MODEL, "redis-w"),
    );
    let post = |body: String| {
        h.http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&h.key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = post(chat("over redis", false)).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "over redis");
    let r = post(chat("streamed over redis", true)).await.unwrap();
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await.unwrap());
    assert_eq!(chunk_text(&events), "streamed over redis");
    assert_eq!(events.last().unwrap().data, "[DONE]");

    h.ledger
        .set_rate_limits("acme", limits(Some(3), None))
        .await
        .unwrap();
    // Limits are cached for `cache_ttl`; wait it out.
    tokio::time::sleep(config().cache_ttl + Duration::from_millis(100)).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(post(chat("x", false)).await.unwrap().status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(
        statuses.iter().filter(|s| **s == 200).count() <= 3,
        "{statuses:?}"
    );

    worker.stop().await;
    server.abort();
    h.stop().await;
    cleanup(&url, &p).await;
}
