//! A `tidal gateway` process over Redis and a SQLite ledger, for the root package's
//! platform tests: a fresh Redis prefix and ledger per test, the default model's record
//! published, tenants and keys made with `tidal keys`.

#![allow(dead_code)]

use tidal_queue::{Broker, ModelRecord, ModelState, Prices};

use crate::process::{tidal_json, KillOnDrop};
use crate::worker_common::{Queue, MODEL_ID};

pub struct Platform {
    pub queue: Queue,
    pub base: String,
    pub db: String,
    _dir: tempfile::TempDir,
    pub gateway: KillOnDrop,
}

/// [`try_publish`], which must succeed.
pub async fn publish(broker: &dyn Broker, max_queue_wait_ms: u64) {
    try_publish(broker, max_queue_wait_ms).await.unwrap();
}

/// Publishes the default model's record (prices, max queue wait) in the broker.
pub async fn try_publish(broker: &dyn Broker, max_queue_wait_ms: u64) -> tidal_queue::Result<()> {
    broker
        .put_model(&ModelRecord {
            id: MODEL_ID.into(),
            state: ModelState::Ready,
            prices: Prices {
                currency: "USD".into(),
                input_per_mtok_micros: 100_000,
                cached_input_per_mtok_micros: 50_000,
                output_per_mtok_micros: 400_000,
            },
            max_queue_wait_ms,
            backlog_cap: 1000,
            context_length: 8192,
        })
        .await
}

/// A gateway process over `queue` and ledger `db`, once healthy: its base URL.
pub async fn start_gateway(queue: &Queue, db: &str) -> (KillOnDrop, String) {
    crate::process::start_gateway(&queue.url, &queue.prefix, db).await
}

/// A gateway process on a fresh Redis prefix and ledger, with the model's record published.
pub async fn platform(test: &str, max_queue_wait_ms: u64) -> Platform {
    let queue = Queue::new(test).await;
    publish(&*queue.broker, max_queue_wait_ms).await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}?mode=rwc", dir.path().join("ledger.db").display());
    let (gateway, base) = start_gateway(&queue, &db).await;
    Platform {
        queue,
        base,
        db,
        _dir: dir,
        gateway,
    }
}

/// A new tenant `tenant` in ledger `db` and a key for it (made with `tidal keys`).
pub fn key_for(db: &str, tenant: &str) -> String {
    tidal_json(&["keys", "--database", db, "create-tenant", tenant]);
    tidal_json(&["keys", "--database", db, "issue", tenant])["secret"]
        .as_str()
        .unwrap()
        .to_owned()
}
