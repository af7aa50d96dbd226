//! One harness per broker: the broker, its notion of now, and a way to let time pass
//! (the in-process broker's clock is moved; Redis's is waited for).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tidal_queue::{
    clock::system_now_ms, Broker, BrokerConfig, ManualClock, MemoryBroker, RedisBroker,
};
use uuid::Uuid;

/// A broker under test.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The broker.
    fn broker(&self) -> Arc<dyn Broker>;
    /// Now, as the broker sees it (ms since the epoch).
    fn now_ms(&self) -> u64;
    /// Lets `d` pass for the broker.
    async fn advance(&self, d: Duration);
}

/// Response streams in the suite expire this long after their last event.
pub const RESPONSE_TTL: Duration = Duration::from_millis(1500);
/// Request records, gates and cancel flags in the suite expire after this (longer than any
/// case's total advance of time).
pub const REQUEST_TTL: Duration = Duration::from_secs(4);

fn config(prefix: String) -> BrokerConfig {
    BrokerConfig {
        prefix,
        response_ttl: RESPONSE_TTL,
        request_ttl: REQUEST_TTL,
    }
}

/// The in-process broker on a manual clock.
pub struct MemoryHarness {
    broker: Arc<MemoryBroker>,
    clock: Arc<ManualClock>,
}

impl MemoryHarness {
    pub fn new() -> Self {
        let clock = Arc::new(ManualClock::new(system_now_ms()));
        let broker = Arc::new(MemoryBroker::new(
            config("tidal-test:".into()),
            clock.clone(),
        ));
        MemoryHarness { broker, clock }
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn broker(&self) -> Arc<dyn Broker> {
        self.broker.clone()
    }
    fn now_ms(&self) -> u64 {
        use tidal_queue::Clock;
        self.clock.now_ms()
    }
    async fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }
}

/// Makes sure the shared test Redis answers, starting it (never restarting it) if it is down.
pub async fn ensure_redis() -> String {
    tidal_queue::testing::ensure_redis()
        .await
        .expect("test Redis")
}

pub use tidal_queue::testing::delete_prefix;

/// The Redis broker under a prefix unique to this test.
pub struct RedisHarness {
    broker: Arc<RedisBroker>,
    url: String,
    prefix: String,
}

impl RedisHarness {
    pub async fn new() -> Self {
        let url = ensure_redis().await;
        let prefix = format!("tidal-test-{}:", Uuid::now_v7());
        let broker = Arc::new(
            RedisBroker::connect(&url, config(prefix.clone()))
                .await
                .unwrap(),
        );
        RedisHarness {
            broker,
            url,
            prefix,
        }
    }
}

impl Drop for RedisHarness {
    /// Deletes this test's keys, also when the test failed.
    fn drop(&mut self) {
        delete_prefix(&self.url, &self.prefix);
    }
}

#[async_trait]
impl Harness for RedisHarness {
    fn broker(&self) -> Arc<dyn Broker> {
        self.broker.clone()
    }
    fn now_ms(&self) -> u64 {
        system_now_ms()
    }
    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}
