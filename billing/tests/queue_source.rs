//! The metering consumer over the broker's usage stream ([`QueueSource`]), on real Redis and
//! on the in-process broker: usage events with duplicates are published, consumers are killed
//! mid-way (their task dropped) and restarted under new names, and at the end the ledger
//! equals the expected sums exactly and no event is left pending or in the stream.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use common::Kind;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tidal_billing::consumer::{self, ConsumerConfig};
use tidal_billing::queue_source::{to_record, QueueSource, QueueSourceConfig};
use tidal_billing::usage::{aggregate, price_records, DailyKey, Totals};
use tidal_billing::{Period, Prices, Principal};
use tidal_queue::{
    Broker, BrokerConfig, CapacityType, MemoryBroker, RedisBroker, SystemClock, UsageEvent,
};
use tokio::time::Instant;
use uuid::Uuid;

const UNIQUE: usize = 3_000;
const DUPLICATES: usize = 300;
const CLAIM_TIMEOUT: Duration = Duration::from_millis(300);
const TAKEOVER_EVERY: Duration = Duration::from_millis(100);

fn source_cfg(name: &str) -> QueueSourceConfig {
    QueueSourceConfig {
        consumer: name.into(),
        block: Duration::from_millis(50),
        claim_timeout: CLAIM_TIMEOUT,
        takeover_every: TAKEOVER_EVERY,
    }
}

fn consumer_cfg() -> ConsumerConfig {
    ConsumerConfig {
        max_batch: 100,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
    }
}

fn start_ms() -> u64 {
    Utc.with_ymd_and_hms(2026, 11, 10, 0, 0, 0)
        .unwrap()
        .timestamp_millis() as u64
}

fn events(rng: &mut StdRng) -> Vec<UsageEvent> {
    let base = Uuid::now_v7().as_u128();
    (0..UNIQUE)
        .map(|i| {
            let end = start_ms() + rng.random_range(0..3 * 86_400_000);
            let prompt = rng.random_range(0..3000);
            UsageEvent {
                request_id: Uuid::from_u128(base + (i / 2) as u128),
                segment: (i % 2) as u32,
                tenant: format!("t{}", rng.random_range(0..4)),
                model: format!("m{}", rng.random_range(0..2)),
                prompt_tokens: prompt,
                cached_prompt_tokens: rng.random_range(0..=prompt),
                completion_tokens: rng.random_range(0..1500),
                worker: format!("w{}", rng.random_range(0..8)),
                capacity_type: if rng.random_bool(0.6) {
                    CapacityType::Spot
                } else {
                    CapacityType::OnDemand
                },
                started_at_ms: end - rng.random_range(0..30_000),
                ended_at_ms: end,
                last: false,
            }
        })
        .collect()
}

/// Runs a consumer named `name` until `shutdown`; returns nothing (a killed one returns early).
fn spawn_consumer(
    ledger: &tidal_billing::Ledger,
    broker: &Arc<dyn Broker>,
    name: &str,
) -> tokio::task::JoinHandle<()> {
    let (l, b, name) = (ledger.clone(), broker.clone(), name.to_string());
    tokio::spawn(async move {
        let mut src = QueueSource::new(b, source_cfg(&name));
        consumer::run(&l, &mut src, &consumer_cfg(), std::future::pending())
            .await
            .unwrap();
    })
}

async fn assert_nothing_pending(broker: &Arc<dyn Broker>) {
    let taken = broker
        .take_over_usage("checker", Duration::ZERO, 100_000)
        .await
        .unwrap();
    assert!(taken.is_empty(), "{} events left pending", taken.len());
    let new = broker
        .read_usage("checker", 100_000, Duration::ZERO)
        .await
        .unwrap();
    assert!(new.is_empty(), "{} events never read", new.len());
}

async fn kill_and_restart(broker: Arc<dyn Broker>, kind: Kind) {
    let (db, ledger) = common::ledger(kind, "queue_source").await;
    let mut rng = StdRng::seed_from_u64(0xb111);
    let t0 = Utc.timestamp_millis_opt(start_ms() as i64).unwrap();
    for m in 0..2 {
        ledger
            .set_price(
                &format!("m{m}"),
                t0 - chrono::Duration::days(1),
                Prices {
                    input_per_m: 150_000 + m,
                    cached_input_per_m: 75_000,
                    output_per_m: 600_000,
                },
                t0,
            )
            .await
            .unwrap();
    }
    for t in 0..4 {
        ledger
            .create_tenant(&format!("t{t}"), "tenant", t0)
            .await
            .unwrap();
    }
    let unique = events(&mut rng);
    let mut feed = unique.clone();
    for _ in 0..DUPLICATES {
        feed.push(unique[rng.random_range(0..UNIQUE)].clone());
    }
    feed.shuffle(&mut rng);
    for e in &feed {
        broker.publish_usage(e).await.unwrap();
    }

    // Kill consumers mid-way: each is dropped once the ledger has grown past a mark (or
    // after a while), holding whatever it had read (and possibly committed) but not acked.
    let op = Principal::operator();
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let task = spawn_consumer(&ledger, &broker, &format!("billing-{round}"));
        let mark = (UNIQUE * (round + 1) / (ROUNDS + 2)) as i64 + rng.random_range(0..100);
        let until = Instant::now() + Duration::from_secs(5);
        while ledger.event_count(&op).await.unwrap() < mark && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    let killed_at = Instant::now();
    let partial = ledger.event_count(&op).await.unwrap();
    assert!(
        (partial as usize) < UNIQUE,
        "the kills happened mid-way ({partial} recorded)"
    );

    // Restart under a new name (a new pid): the dead consumers' pending events come back
    // through the takeover once they are idle for the claim timeout.
    let mut src = QueueSource::new(broker.clone(), source_cfg("billing-final"));
    let progress = src.progress();
    let stop = async move {
        // Wait until a takeover sweep that began after every dead entry was claimable
        // found nothing, and the read after it found nothing either.
        tokio::time::sleep_until(killed_at + CLAIM_TIMEOUT + TAKEOVER_EVERY).await;
        let seen = progress.idle_sweeps();
        while progress.idle_sweeps() < seen + 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let stats = tokio::time::timeout(
        Duration::from_secs(120),
        consumer::run(&ledger, &mut src, &consumer_cfg(), stop),
    )
    .await
    .expect("the restarted consumer caught up")
    .unwrap();
    assert!(stats.delivered > 0);
    assert_nothing_pending(&broker).await;

    assert_eq!(ledger.event_count(&op).await.unwrap(), UNIQUE as i64);
    let versions = ledger.price_versions(None).await.unwrap();
    let records = unique.iter().map(|e| to_record(e).unwrap()).collect();
    let expected = aggregate(&price_records(records, &versions)).unwrap();
    let period = Period::new(t0.date_naive(), t0.date_naive() + chrono::Duration::days(4)).unwrap();
    let actual: BTreeMap<DailyKey, Totals> = ledger
        .usage_rows(&op, None, period)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                DailyKey {
                    tenant: r.tenant,
                    model: r.model,
                    day: r.day,
                    capacity: r.capacity,
                    price_version_id: r.price_version_id,
                },
                r.totals,
            )
        })
        .collect();
    assert_eq!(actual, expected.daily);
    for ((tenant, month), picos) in &expected.spend {
        let at = month.first_day().and_hms_opt(12, 0, 0).unwrap().and_utc();
        let status = ledger.budget_status(&op, tenant, at).await.unwrap();
        assert_eq!(
            status.spent_micros,
            tidal_billing::money::round_picos(*picos).unwrap(),
            "{tenant} {month}"
        );
    }
    ledger.close().await;
    db.drop_db().await.unwrap();
}

fn memory_broker() -> Arc<dyn Broker> {
    Arc::new(MemoryBroker::new(
        BrokerConfig::default(),
        Arc::new(SystemClock),
    ))
}

// --- Redis ---

async fn redis_conn(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    client.get_multiplexed_async_connection().await.ok()
}

/// The shared test Redis (started if down, never restarted), as the queue crate's tests use it.
async fn ensure_redis() -> redis::aio::MultiplexedConnection {
    let url = tidal_queue::testing::ensure_redis()
        .await
        .expect("test Redis");
    redis_conn(&url).await.expect("connect to test Redis")
}

async fn delete_prefix(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<i64>(conn)
            .await
            .unwrap();
    }
}

async fn on_redis(kind: Kind) {
    let mut conn = ensure_redis().await;
    let prefix = format!("tidal-billing-test:{}:", Uuid::now_v7());
    let broker = RedisBroker::connect(
        &tidal_queue::testing::redis_url(),
        BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        },
    )
    .await
    .unwrap();
    let broker: Arc<dyn Broker> = Arc::new(broker);
    kill_and_restart(broker, kind).await;
    // Acked entries are deleted from the stream, too.
    let len: i64 = redis::cmd("XLEN")
        .arg(format!("{prefix}usage"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 0);
    delete_prefix(&mut conn, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_kill_and_restart_sqlite() {
    on_redis(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_kill_and_restart_postgres() {
    on_redis(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_kill_and_restart_sqlite() {
    kill_and_restart(memory_broker(), Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_kill_and_restart_postgres() {
    kill_and_restart(memory_broker(), Kind::Postgres).await
}

/// An event whose time cannot be represented is acked and dropped (logged), instead of
/// coming back first on every read and stalling the consumer; the others are recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_event_does_not_stall_the_consumer() {
    let (db, ledger) = common::ledger(Kind::Sqlite, "queue_poison").await;
    let broker = memory_broker();
    let mut rng = StdRng::seed_from_u64(3);
    let good: Vec<UsageEvent> = events(&mut rng).into_iter().take(50).collect();
    let bad = UsageEvent {
        ended_at_ms: u64::MAX,
        ..good[0].clone()
    };
    broker.publish_usage(&bad).await.unwrap();
    for e in &good {
        broker.publish_usage(e).await.unwrap();
    }
    let mut src = QueueSource::new(broker.clone(), source_cfg("billing-0"));
    let progress = src.progress();
    let stats = consumer::run(&ledger, &mut src, &consumer_cfg(), async move {
        while progress.idle_sweeps() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(stats.inserted, 50);
    assert_nothing_pending(&broker).await;
    ledger.close().await;
    db.drop_db().await.unwrap();
}

/// The end-to-end benchmark drains what it publishes, in full batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_benchmark_consumes_everything() {
    let broker = memory_broker();
    let r = tidal_billing::bench_stream::bench_stream_ingest("sqlite:", broker.clone(), 2_000, 500)
        .await
        .unwrap();
    assert_eq!((r.events, r.batch_size, r.batches), (2_000, 500, 4));
    assert!(r.consume_events_per_sec > 0.0 && r.publish_events_per_sec > 0.0);
    assert_nothing_pending(&broker).await;
}
