//! Budget holds on real PostgreSQL and on SQLite: concurrent admissions never hold past the
//! budget, ingest moves each request's cost from its hold to the spend, settling and expiry.

mod common;

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use common::Kind;
use tidal_billing::scratch::ScratchDb;
use tidal_billing::{
    CapacityType, Error, HoldOutcome, HoldRequest, Ledger, Prices, Principal, UsageRecord,
};

/// A micro a prompt token, two a completion token.
const PRICES: Prices = Prices {
    input_per_m: 1_000_000,
    cached_input_per_m: 1_000_000,
    output_per_m: 2_000_000,
};
const PICO: i64 = 1_000_000;

fn at(d: u32, h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, d, h, m, 0).unwrap()
}

fn usage(req: &str, seg: u32, prompt: u64, completion: u64, end: DateTime<Utc>) -> UsageRecord {
    UsageRecord {
        request_id: req.into(),
        segment: seg,
        tenant: "acme".into(),
        model: "llama".into(),
        prompt_tokens: prompt,
        cached_prompt_tokens: 0,
        completion_tokens: completion,
        worker: "w1".into(),
        capacity: CapacityType::OnDemand,
        started_at: end - Duration::seconds(1),
        ended_at: end,
        last: false,
    }
}

async fn setup(kind: Kind, tag: &str, budget: Option<i64>) -> (ScratchDb, Ledger) {
    let (db, ledger) = common::ledger(kind, tag).await;
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    ledger.set_budget("acme", budget).await.unwrap();
    ledger
        .set_price("llama", at(1, 0, 0), PRICES, at(1, 0, 0))
        .await
        .unwrap();
    (db, ledger)
}

fn hold(id: &str, micros: i64) -> HoldRequest<'_> {
    HoldRequest {
        request_id: id,
        tenant: "acme",
        amount_pico: micros * PICO,
        expires_at: at(2, 11, 0),
    }
}

async fn open_micros(ledger: &Ledger, now: DateTime<Utc>) -> i64 {
    ledger.open_holds_pico("acme", now).await.unwrap() / PICO
}

async fn spent_micros(ledger: &Ledger, now: DateTime<Utc>) -> i64 {
    ledger
        .budget_status(&Principal::operator(), "acme", now)
        .await
        .unwrap()
        .spent_micros
}

/// 20 requests of 10 micros each race for a 50-micro budget: exactly five are held, and
/// the spend they can reach stays within the budget.
async fn concurrent_holds_never_pass_the_budget(kind: Kind) {
    let (_db, ledger) = setup(kind, "holdrace", Some(50)).await;
    let ledger = Arc::new(ledger);
    let now = at(2, 10, 0);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let id = format!("r{i}");
                ledger.hold_budget(&hold(&id, 10), now).await.unwrap()
            })
        })
        .collect();
    let mut held = 0;
    for t in tasks {
        match t.await.unwrap() {
            HoldOutcome::Held { .. } => held += 1,
            HoldOutcome::Refused {
                budget_micros,
                committed_micros,
                asked_micros,
            } => {
                assert_eq!((budget_micros, asked_micros), (50, 10));
                assert!(
                    committed_micros > 40,
                    "refused with room: {committed_micros}"
                );
            }
            HoldOutcome::Unlimited => panic!("the tenant has a budget"),
        }
    }
    assert_eq!(
        held, 5,
        "50 micros hold five 10-micro requests, whatever the race"
    );
    assert_eq!(open_micros(&ledger, now).await, 50);
}

/// Ingest counts a request's billed cost against its hold (never twice with the spend);
/// settling lowers it to the real cost; a hold billing caught up with is gone.
async fn ingest_moves_cost_from_hold_to_spend(kind: Kind) {
    let (_db, ledger) = setup(kind, "holdingest", Some(100)).await;
    let now = at(2, 10, 0);
    assert!(matches!(
        ledger.hold_budget(&hold("a", 30), now).await.unwrap(),
        HoldOutcome::Held {
            remaining_micros: 70
        }
    ));
    // First segment: 4 prompt + 3 completion tokens = 10 micros billed of 30 held.
    ledger
        .record_batch(&[usage("a", 0, 4, 3, now)])
        .await
        .unwrap();
    assert_eq!(spent_micros(&ledger, now).await, 10);
    assert_eq!(open_micros(&ledger, now).await, 20);
    // A replayed segment changes nothing.
    ledger
        .record_batch(&[usage("a", 0, 4, 3, now)])
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, now).await, 20);
    // The request ended at 14 micros: 4 more to come from billing.
    ledger.settle_hold("a", 14 * PICO, None).await.unwrap();
    assert_eq!(open_micros(&ledger, now).await, 4);
    ledger
        .record_batch(&[usage("a", 1, 0, 2, now)])
        .await
        .unwrap();
    assert_eq!(spent_micros(&ledger, now).await, 14);
    assert_eq!(open_micros(&ledger, now).await, 0);
    // 86 micros are left for new holds: 86 fits, 87 does not.
    assert!(matches!(
        ledger.hold_budget(&hold("b", 87), now).await.unwrap(),
        HoldOutcome::Refused { .. }
    ));
    assert!(matches!(
        ledger.hold_budget(&hold("b", 86), now).await.unwrap(),
        HoldOutcome::Held {
            remaining_micros: 0
        }
    ));
    // A request that never ran releases its hold.
    ledger.settle_hold("b", 0, None).await.unwrap();
    assert_eq!(open_micros(&ledger, now).await, 0);
    // Settling a request without a hold is harmless.
    ledger.settle_hold("nobody", 5 * PICO, None).await.unwrap();
}

/// A hold nobody settles stops counting at its expiry; tenants without a budget hold
/// nothing; an unknown tenant is an error, not an admission.
async fn expiry_unlimited_and_unknown(kind: Kind) {
    let (_db, ledger) = setup(kind, "holdexpiry", Some(10)).await;
    let now = at(2, 10, 0);
    assert!(matches!(
        ledger.hold_budget(&hold("a", 10), now).await.unwrap(),
        HoldOutcome::Held { .. }
    ));
    assert!(matches!(
        ledger.hold_budget(&hold("b", 1), now).await.unwrap(),
        HoldOutcome::Refused { .. }
    ));
    // A settled expiry only ever moves earlier.
    ledger
        .settle_hold("a", 10 * PICO, Some(at(3, 0, 0)))
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, at(2, 10, 59)).await, 10);
    ledger
        .settle_hold("a", 10 * PICO, Some(at(2, 10, 30)))
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, at(2, 10, 29)).await, 10);
    assert_eq!(open_micros(&ledger, at(2, 10, 30)).await, 0);
    let later = at(2, 11, 0);
    assert_eq!(open_micros(&ledger, later).await, 0, "expired at 11:00");
    assert!(matches!(
        ledger.hold_budget(&hold("b", 10), later).await.unwrap(),
        HoldOutcome::Held { .. }
    ));

    ledger.set_budget("acme", None).await.unwrap();
    assert_eq!(
        ledger
            .hold_budget(&hold("c", 1_000_000), now)
            .await
            .unwrap(),
        HoldOutcome::Unlimited
    );
    let unknown = HoldRequest {
        tenant: "nobody",
        ..hold("d", 1)
    };
    assert!(matches!(
        ledger.hold_budget(&unknown, now).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        ledger.hold_budget(&hold("e", -1), now).await,
        Err(Error::Invalid(_))
    ));
}

/// A request's last segment releases its hold whole, whatever is left of it: a stopped
/// request's upper bound does not outlive its final bill, and a settle that comes after the
/// last segment does not bring the hold back.
async fn the_last_segment_releases_the_hold(kind: Kind) {
    let (_db, ledger) = setup(kind, "holdlast", Some(100)).await;
    let now = at(2, 10, 0);
    let later = now + Duration::minutes(2);
    // Stopped by its client: the gateway keeps an upper bound of 25 micros for two minutes.
    ledger.hold_budget(&hold("a", 60), now).await.unwrap();
    ledger
        .settle_hold("a", 25 * PICO, Some(later))
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, now).await, 25);
    // A resumable segment (the worker drained) leaves the rest held.
    ledger
        .record_batch(&[usage("a", 0, 4, 1, now)])
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, now).await, 19);
    // The last segment bills 4 micros of the 19 still held: nothing stays held.
    let last = UsageRecord {
        last: true,
        ..usage("a", 1, 0, 2, now)
    };
    ledger
        .record_batch(std::slice::from_ref(&last))
        .await
        .unwrap();
    assert_eq!(spent_micros(&ledger, now).await, 10);
    assert_eq!(open_micros(&ledger, now).await, 0);
    // Replayed, it changes nothing.
    ledger.record_batch(&[last]).await.unwrap();
    assert_eq!(spent_micros(&ledger, now).await, 10);
    // The last segment recorded before the gateway settles: the late settle is a no-op.
    ledger.hold_budget(&hold("b", 40), now).await.unwrap();
    let last = UsageRecord {
        last: true,
        ..usage("b", 0, 2, 1, now)
    };
    ledger.record_batch(&[last]).await.unwrap();
    assert_eq!(open_micros(&ledger, now).await, 0);
    ledger
        .settle_hold("b", 30 * PICO, Some(later))
        .await
        .unwrap();
    assert_eq!(open_micros(&ledger, now).await, 0);
    assert_eq!(spent_micros(&ledger, now).await, 14);
}

on_both!(
    concurrent_holds_never_pass_the_budget,
    ingest_moves_cost_from_hold_to_spend,
    the_last_segment_releases_the_hold,
    expiry_unlimited_and_unknown,
);
