//! The gateway while its PostgreSQL ledger is unreachable: it fails fast (breaker, bounded
//! ledger reads), answers recently verified keys from its cache for a bounded time, and
//! never lets a key it saw refused work again.
//!
//! The outage is a TCP proxy between the gateway's ledger and the shared PostgreSQL that
//! stops forwarding but keeps connections open (a hung server: clients wait for their own
//! timeouts); the server itself stays up for other tests.

mod common;
mod proxy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use proxy::{authority, Proxy};
use tidal_billing::ledger::LedgerOptions;
use tidal_billing::scratch::{ScratchDb, DEFAULT_SERVER_URL};
use tidal_billing::{Ledger, Role};
use tidal_gateway::fake_worker::{FakeWorker, FakeWorkerConfig};
use tidal_gateway::{Gateway, MemoryLimiter, RateLimiter};
use tidal_queue::{Broker, MemoryBroker};
use tokio::task::JoinHandle;

struct Outage {
    base: String,
    proxy: Proxy,
    /// The ledger as another replica or the CLI sees it (directly, never cut off).
    direct: Ledger,
    gateway_ledger: Ledger,
    server: JoinHandle<()>,
    worker: FakeWorker,
    db: ScratchDb,
}

const TTL: Duration = Duration::from_millis(200);
const MAX_STALE: Duration = Duration::from_secs(3);

async fn start() -> Outage {
    let server_url =
        std::env::var("TIDAL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.into());
    let db = ScratchDb::postgres(&server_url, "gw_outage").await.unwrap();
    let direct = Ledger::connect(&db.url).await.unwrap();
    let target = authority(&db.url);
    let proxy = Proxy::start(target.clone()).await;
    let via_proxy = db.url.replacen(&target, &proxy.addr, 1);
    // sqlx's usual 5 s acquire timeout, as `tidal gateway` had: the gateway's own ledger
    // timeout and breaker must keep an outage from costing requests that long.
    let gateway_ledger = Ledger::connect_with(&via_proxy, &LedgerOptions::default())
        .await
        .unwrap();
    let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::default());
    let cfg = tidal_gateway::GatewayConfig {
        cache_ttl: TTL,
        max_stale: MAX_STALE,
        ledger_timeout: Duration::from_millis(300),
        breaker_open: Duration::from_millis(300),
        ..config()
    };
    let gateway = Gateway::new(broker.clone(), gateway_ledger.clone(), limiter, cfg);
    let (base, server) = serve(&gateway).await;
    let worker = FakeWorker::spawn(broker.clone(), FakeWorkerConfig::new(MODEL, "w"));
    let h = Outage {
        base,
        proxy,
        direct,
        gateway_ledger,
        server,
        worker,
        db,
    };
    h.direct
        .create_tenant("acme", "Acme", chrono::Utc::now())
        .await
        .unwrap();
    broker
        .put_model(&tidal_queue::ModelRecord {
            id: MODEL.into(),
            state: tidal_queue::ModelState::Ready,
            prices: tidal_queue::Prices {
                currency: "USD".into(),
                input_per_mtok_micros: 1,
                cached_input_per_mtok_micros: 1,
                output_per_mtok_micros: 1,
            },
            max_queue_wait_ms: 30_000,
            backlog_cap: 0,
            context_length: 8192,
        })
        .await
        .unwrap();
    h
}

impl Outage {
    async fn key(&self) -> (String, String) {
        let k = self
            .direct
            .issue_key("acme", Role::Tenant, chrono::Utc::now())
            .await
            .unwrap();
        (k.secret, k.key_id)
    }

    /// Status of one chat request with `key`, and how long it took.
    async fn chat(&self, key: &str) -> (u16, Duration) {
        let start = Instant::now();
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.base))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(chat("hello there", false))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        (status, start.elapsed())
    }

    async fn stop(self) {
        self.worker.stop().await;
        self.server.abort();
        self.proxy.accept.abort();
        self.gateway_ledger.close().await;
        self.direct.close().await;
        let _ = self.db.drop_db().await;
    }
}

/// Requests until `key` gets `status` (at most 5 s).
async fn until_status(h: &Outage, key: &str, status: u16) {
    eventually(&format!("{status} for the key"), || async {
        h.chat(key).await.0 == status
    })
    .await;
}

#[tokio::test]
async fn a_revoked_key_stays_revoked_through_an_outage() {
    let h = start().await;
    let (revoked, revoked_id) = h.key().await;
    let (good, _) = h.key().await;
    assert_eq!(h.chat(&revoked).await.0, 200);
    assert_eq!(h.chat(&good).await.0, 200);
    // Revoked elsewhere (the CLI, another replica): refused here once the cache entry ages.
    h.direct
        .revoke_key(&revoked_id, chrono::Utc::now())
        .await
        .unwrap();
    until_status(&h, &revoked, 401).await;
    assert_eq!(h.chat(&good).await.0, 200);

    h.proxy.down();
    for _ in 0..3 {
        let (status, _) = h.chat(&revoked).await;
        assert_eq!(
            status, 503,
            "a refused key never works again, outage or not"
        );
        let (status, took) = h.chat(&good).await;
        assert_eq!(
            status, 200,
            "a key checked {MAX_STALE:?} ago at most still works"
        );
        assert!(
            took < Duration::from_secs(1),
            "answered from cache, took {took:?}"
        );
    }
    // Past the bounded window, the good key stops working too: nothing is served unchecked
    // for longer than `max_stale`.
    eventually(
        "503 once the last check is older than max_stale",
        || async { h.chat(&good).await.0 == 503 },
    )
    .await;

    h.proxy.up();
    until_status(&h, &good, 200).await;
    assert_eq!(h.chat(&revoked).await.0, 401);
    h.stop().await;
}

#[tokio::test]
async fn an_outage_costs_milliseconds_not_seconds() {
    let h = start().await;
    let (key, _) = h.key().await;
    let (other, _) = h.key().await;
    assert_eq!(h.chat(&key).await.0, 200);
    h.proxy.down();
    // Let the cache entries age past their ttl, so every request below needs the ledger.
    tokio::time::sleep(TTL).await;
    // Every request of the outage, the first included, answers from cache well under the
    // ledger pool's acquire timeout (5 s per ledger read before).
    for _ in 0..5 {
        let (status, took) = h.chat(&key).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
    // A key never seen cannot be checked: 503 (never 200), fast too.
    let (status, took) = h.chat(&other).await;
    assert_eq!(status, 503);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    h.proxy.up();
    until_status(&h, &other, 200).await;
    h.stop().await;
}
