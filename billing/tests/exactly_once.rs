//! Exactly-once metering: 100,000 usage events with 10% duplicates in shuffled order, fed
//! through the consumer while it is killed at random points (between commit and ack, and
//! mid-transaction) and restarted; the ledger must equal the expected sums exactly.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::Kind;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tidal_billing::consumer::{self, ConsumerConfig};
use tidal_billing::memory_source::MemoryStream;
use tidal_billing::money::round_picos;
use tidal_billing::usage::{aggregate, price_records, DailyKey, Totals};
use tidal_billing::{CapacityType, Month, Period, Prices, Principal, UsageRecord};

const EVENTS: usize = 100_000;
const DUPLICATES: usize = 10_000;

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 28, 0, 0, 0).unwrap()
}

fn events(rng: &mut StdRng) -> Vec<UsageRecord> {
    (0..EVENTS)
        .map(|i| {
            // Spread over 4 days across the month boundary, 3 models, 10 tenants.
            let end = start() + chrono::Duration::seconds(rng.random_range(0..4 * 86_400));
            let prompt = rng.random_range(0..4000);
            UsageRecord {
                request_id: format!("req-{:06}", i / 3),
                segment: (i % 3) as u32,
                tenant: format!("t{}", rng.random_range(0..10)),
                model: format!("m{}", rng.random_range(0..3)),
                prompt_tokens: prompt,
                cached_prompt_tokens: rng.random_range(0..=prompt),
                completion_tokens: rng.random_range(0..2000),
                worker: format!("w{}", rng.random_range(0..16)),
                capacity: if rng.random_bool(0.7) {
                    CapacityType::Spot
                } else {
                    CapacityType::OnDemand
                },
                started_at: end - chrono::Duration::seconds(rng.random_range(0..60)),
                ended_at: end,
                last: false,
            }
        })
        .collect()
}

async fn exactly_once_with_crashes(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "exactly_once").await;
    let mut rng = StdRng::seed_from_u64(0x71da1);
    // Prices change in the middle of a day for m0.
    let p = |i, c, o| Prices {
        input_per_m: i,
        cached_input_per_m: c,
        output_per_m: o,
    };
    for m in 0..3 {
        ledger
            .set_price(
                &format!("m{m}"),
                start() - chrono::Duration::days(1),
                p(150_000 + m, 75_000, 600_000 + 7 * m),
                start(),
            )
            .await
            .unwrap();
    }
    let mid_day = ledger
        .set_price(
            "m0",
            start() + chrono::Duration::hours(36),
            p(333_333, 111_111, 999_999),
            start(),
        )
        .await
        .unwrap();
    for t in 0..10 {
        ledger
            .create_tenant(&format!("t{t}"), "tenant", start())
            .await
            .unwrap();
    }

    let unique = events(&mut rng);
    let mut feed = unique.clone();
    for _ in 0..DUPLICATES {
        feed.push(unique[rng.random_range(0..EVENTS)].clone());
    }
    feed.shuffle(&mut rng);
    let stream = MemoryStream::new();
    for e in feed {
        stream.push(e);
    }

    let cfg = ConsumerConfig {
        max_batch: 1000,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
    };
    let (mut crashes, mut aborts) = (0, 0);
    while !stream.is_drained() {
        // Crash after a random number of source operations (a crash between commit and
        // ack when it lands on an ack), and sometimes abort the task mid-flight as well.
        let mut source = stream.consumer_crashing_after(rng.random_range(1..30));
        let l = ledger.clone();
        let c = cfg.clone();
        let task = tokio::spawn(async move {
            consumer::run(&l, &mut source, &c, std::future::pending()).await
        });
        if rng.random_bool(0.4) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
            task.abort();
            aborts += 1;
        }
        match task.await {
            Ok(r) => {
                r.unwrap();
                crashes += 1;
            }
            Err(e) => assert!(e.is_cancelled()),
        }
    }
    assert!(
        crashes > 5 && aborts > 2,
        "crashes {crashes}, aborts {aborts}"
    );

    // Expected: the unique events, priced by the ledger's own versions, summed exactly.
    let op = Principal::operator();
    let versions = ledger.price_versions(None).await.unwrap();
    let expected = aggregate(&price_records(unique, &versions)).unwrap();
    let period = Period::new(
        start().date_naive(),
        start().date_naive() + chrono::Duration::days(5),
    )
    .unwrap();
    let rows = ledger.usage_rows(&op, None, period).await.unwrap();
    let actual: BTreeMap<DailyKey, Totals> = rows
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
    assert_eq!(ledger.event_count(&op).await.unwrap(), EVENTS as i64);
    assert_eq!(actual, expected.daily);
    assert!(
        expected
            .daily
            .keys()
            .any(|k| k.model == "m0" && k.price_version_id == mid_day),
        "mid-day price was used"
    );
    for ((tenant, month), picos) in &expected.spend {
        let at = month.first_day().and_hms_opt(12, 0, 0).unwrap().and_utc();
        let status = ledger.budget_status(&op, tenant, at).await.unwrap();
        assert_eq!(
            status.spent_micros,
            round_picos(*picos).unwrap(),
            "{tenant} {month}"
        );
    }
    // Invoices equal a recomputation from the expected sums (rounded once per line).
    for t in 0..10 {
        let tenant = format!("t{t}");
        for month in [
            Month::parse("2026-11").unwrap(),
            Month::parse("2026-12").unwrap(),
        ] {
            let inv = ledger.invoice(&op, &tenant, month).await.unwrap();
            let mut exp_rows = Vec::new();
            for (k, tot) in expected.daily.iter().filter(|(k, _)| k.tenant == tenant) {
                let v = versions
                    .iter()
                    .find(|v| v.id == k.price_version_id)
                    .unwrap();
                exp_rows.push(tidal_billing::UsageRow {
                    tenant: k.tenant.clone(),
                    model: k.model.clone(),
                    day: k.day,
                    capacity: k.capacity,
                    price_version_id: k.price_version_id,
                    prices: v.prices,
                    totals: *tot,
                });
            }
            let exp = tidal_billing::invoice::build_invoice(
                &tenant,
                month,
                &exp_rows,
                &[],
                &Default::default(),
            )
            .unwrap();
            assert_eq!(inv.total_micros, exp.total_micros, "{tenant} {month}");
            assert!(inv.total_micros > 0);
        }
    }
    ledger.close().await;
    db.drop_db().await.unwrap();
}

/// A stream outage (reads fail) only delays ingest; nothing is lost or doubled.
async fn stream_outage_only_delays(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "stream_outage").await;
    let mut rng = StdRng::seed_from_u64(7);
    let unique: Vec<UsageRecord> = events(&mut rng).into_iter().take(5_000).collect();
    let stream = MemoryStream::new();
    stream.set_available(false);
    for e in &unique {
        stream.push(e.clone());
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (l, s) = (ledger.clone(), stream.clone());
    let task = tokio::spawn(async move {
        let cfg = ConsumerConfig {
            max_batch: 700,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        };
        consumer::run(&l, &mut s.consumer(), &cfg, async {
            let _ = stop_rx.await;
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ledger.event_count(&Principal::operator()).await.unwrap(), 0);
    stream.set_available(true);
    while !stream.is_drained() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(());
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.inserted, stats.duplicates), (5_000, 0));
    assert_eq!(
        ledger.event_count(&Principal::operator()).await.unwrap(),
        5_000
    );
    ledger.close().await;
    db.drop_db().await.unwrap();
}

/// Two consumers (two billing replicas) write the same events concurrently, in different
/// orders: each event is still counted once.
async fn concurrent_consumers_count_once(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "concurrent").await;
    let mut rng = StdRng::seed_from_u64(11);
    ledger
        .set_price(
            "m0",
            start() - chrono::Duration::days(1),
            Prices {
                input_per_m: 1,
                cached_input_per_m: 1,
                output_per_m: 1,
            },
            start(),
        )
        .await
        .unwrap();
    let unique: Vec<UsageRecord> = events(&mut rng).into_iter().take(20_000).collect();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut order = unique.clone();
        order.shuffle(&mut rng);
        let stream = MemoryStream::new();
        for e in order {
            stream.push(e);
        }
        let l = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let cfg = ConsumerConfig {
                max_batch: 500,
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(50),
            };
            let mut source = stream.consumer();
            let s = stream.clone();
            consumer::run(&l, &mut source, &cfg, async move {
                while !s.is_drained() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
        }));
    }
    let mut inserted = 0;
    for t in tasks {
        inserted += t.await.unwrap().unwrap().inserted;
    }
    assert_eq!(
        inserted, 20_000,
        "each event inserted by exactly one of the two"
    );
    let op = Principal::operator();
    assert_eq!(ledger.event_count(&op).await.unwrap(), 20_000);
    let versions = ledger.price_versions(None).await.unwrap();
    let expected = aggregate(&price_records(unique, &versions)).unwrap();
    let period = Period::new(
        start().date_naive(),
        start().date_naive() + chrono::Duration::days(5),
    )
    .unwrap();
    let segments: i64 = ledger
        .usage_rows(&op, None, period)
        .await
        .unwrap()
        .iter()
        .map(|r| r.totals.segments)
        .sum();
    assert_eq!(segments, 20_000);
    let out: i64 = ledger
        .usage_rows(&op, None, period)
        .await
        .unwrap()
        .iter()
        .map(|r| r.totals.output_tokens)
        .sum();
    assert_eq!(
        out,
        expected
            .daily
            .values()
            .map(|t| t.output_tokens)
            .sum::<i64>()
    );
    ledger.close().await;
    db.drop_db().await.unwrap();
}

on_both!(
    exactly_once_with_crashes,
    stream_outage_only_delays,
    concurrent_consumers_count_once
);
