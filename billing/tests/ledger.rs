//! Ledger behaviour on real PostgreSQL and on SQLite: idempotent ingest, prices, rounding,
//! keys, budgets, invoices, the platform view and tenant isolation on every read path.

mod common;

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use common::Kind;
use tidal_billing::usage::Totals;
use tidal_billing::{
    CapacityType, Error, FleetUsage, InvoiceStatus, Month, Period, Prices, Principal, Role,
    TokenKind, UsageRecord,
};

const P: Prices = Prices {
    input_per_m: 150_000,
    cached_input_per_m: 75_000,
    output_per_m: 600_000,
};
const P2: Prices = Prices {
    input_per_m: 300_000,
    cached_input_per_m: 150_000,
    output_per_m: 1_200_000,
};

fn at(d: u32, h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, d, h, m, 0).unwrap()
}

fn ev(
    req: &str,
    seg: u32,
    tenant: &str,
    end: DateTime<Utc>,
    tokens: (u64, u64, u64),
) -> UsageRecord {
    UsageRecord {
        request_id: req.into(),
        segment: seg,
        tenant: tenant.into(),
        model: "llama".into(),
        prompt_tokens: tokens.0,
        cached_prompt_tokens: tokens.1,
        completion_tokens: tokens.2,
        worker: "w1".into(),
        capacity: CapacityType::Spot,
        started_at: end - Duration::seconds(1),
        ended_at: end,
        last: false,
    }
}

fn nov() -> Month {
    Month::parse("2026-11").unwrap()
}

fn op() -> Principal {
    Principal::operator()
}

async fn idempotent_ingest(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "idem").await;
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    let a = ev("r1", 0, "acme", at(2, 10, 0), (10, 4, 7));
    let b = ev("r1", 1, "acme", at(2, 10, 1), (0, 0, 3));
    let bad = UsageRecord {
        cached_prompt_tokens: 99,
        ..ev("r2", 0, "acme", at(2, 10, 0), (10, 0, 0))
    };

    let o = ledger
        .record_batch(&[a.clone(), b.clone(), a.clone(), bad.clone()])
        .await
        .unwrap();
    assert_eq!(
        (o.received, o.inserted, o.duplicates, o.rejected, o.unpriced),
        (4, 2, 1, 1, 0)
    );
    // Replays, in another order, with a changed copy of a stored key: nothing changes.
    let changed = UsageRecord {
        completion_tokens: 1000,
        ..b.clone()
    };
    let o = ledger
        .record_batch(&[changed, a.clone(), bad])
        .await
        .unwrap();
    assert_eq!((o.inserted, o.duplicates, o.rejected), (0, 2, 1));
    assert_eq!(ledger.record_batch(&[]).await.unwrap().inserted, 0);

    assert_eq!(ledger.event_count(&op()).await.unwrap(), 2);
    let rows = ledger
        .usage_rows(&op(), Some("acme"), nov().period())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].totals,
        Totals {
            segments: 2,
            input_tokens: 6,
            cached_input_tokens: 4,
            output_tokens: 10
        }
    );
    // 6 * 0.15 + 4 * 0.075 + 10 * 0.6 = 7.2 micros.
    let status = ledger
        .budget_status(&op(), "acme", at(15, 0, 0))
        .await
        .unwrap();
    assert_eq!(status.spent_micros, 7);
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn price_change_mid_day(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "price").await;
    let v1 = ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    let v2 = ledger
        .set_price("llama", at(3, 12, 0), P2, at(1, 0, 0))
        .await
        .unwrap();
    assert_ne!(v1, v2);
    // Same prices again: idempotent. Other prices at the same time: conflict.
    assert_eq!(
        ledger
            .set_price("llama", at(3, 12, 0), P2, at(2, 0, 0))
            .await
            .unwrap(),
        v2
    );
    assert!(matches!(
        ledger
            .set_price("llama", at(3, 12, 0), P, at(2, 0, 0))
            .await,
        Err(Error::PriceConflict(_))
    ));

    let before = ev("a", 0, "acme", at(3, 11, 59), (1_000_000, 0, 1_000_000));
    let boundary = ev("b", 0, "acme", at(3, 12, 0), (1_000_000, 0, 0));
    let after = ev("c", 0, "acme", at(3, 18, 0), (1_000_000, 1_000_000, 0));
    // A segment that started before the change but ended after it: the end time decides.
    let straddles = UsageRecord {
        started_at: at(3, 11, 0),
        ..ev("d", 0, "acme", at(3, 12, 30), (0, 0, 1_000_000))
    };
    let o = ledger
        .record_batch(&[after, straddles, before, boundary])
        .await
        .unwrap();
    assert_eq!(o.inserted, 4);

    let mut rows = ledger
        .usage_rows(&op(), Some("acme"), nov().period())
        .await
        .unwrap();
    rows.sort_by_key(|r| r.price_version_id);
    assert_eq!(rows.len(), 2, "one day, two price versions");
    assert_eq!(
        (
            rows[0].price_version_id,
            rows[0].totals.input_tokens,
            rows[0].totals.output_tokens
        ),
        (v1, 1_000_000, 1_000_000)
    );
    assert_eq!(
        (
            rows[1].price_version_id,
            rows[1].totals.input_tokens,
            rows[1].totals.cached_input_tokens,
            rows[1].totals.output_tokens
        ),
        (v2, 1_000_000, 1_000_000, 1_000_000)
    );
    let inv = ledger.invoice(&op(), "acme", nov()).await.unwrap();
    // v1: 0.15 + 0.60; v2: 0.30 + 0.15 + 1.20 (dollars).
    assert_eq!(
        inv.total_micros,
        150_000 + 600_000 + 300_000 + 150_000 + 1_200_000
    );
    let report = ledger.report(&op(), "acme", nov().period()).await.unwrap();
    assert_eq!(report.cost_micros, inv.total_micros);
    assert_eq!(report.lines.len(), 1);

    // No price yet for another model: stored, counted, flagged, and not invoiceable.
    let unpriced = UsageRecord {
        model: "new-model".into(),
        ..ev("e", 0, "acme", at(3, 1, 0), (5, 0, 5))
    };
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    assert_eq!(ledger.record_batch(&[unpriced]).await.unwrap().unpriced, 1);
    assert_eq!(
        ledger
            .report(&op(), "acme", nov().period())
            .await
            .unwrap()
            .unpriced_tokens,
        10
    );
    assert!(matches!(
        ledger
            .issue_invoice(&op(), "acme", nov(), at(30, 0, 0) + Duration::days(1))
            .await,
        Err(Error::Unpriced(_))
    ));
    // Its price arrives (effective before the event): the event is priced, once.
    let v3 = ledger
        .set_price("new-model", at(3, 0, 0), P2, at(4, 0, 0))
        .await
        .unwrap();
    assert_eq!(
        ledger.reprice_unpriced(None).await.unwrap(),
        tidal_billing::ledger::RepriceOutcome {
            unpriced: 0,
            priced: 0
        }
    );
    let report = ledger.report(&op(), "acme", nov().period()).await.unwrap();
    assert_eq!(report.unpriced_tokens, 0);
    let rows = ledger
        .usage_rows(&op(), Some("acme"), nov().period())
        .await
        .unwrap();
    assert!(rows.iter().all(|r| r.price_version_id != 0));
    let new_row = rows.iter().find(|r| r.model == "new-model").unwrap();
    assert_eq!(
        (
            new_row.price_version_id,
            new_row.totals.segments,
            new_row.totals.input_tokens
        ),
        (v3, 1, 5)
    );
    // 5 * 0.3 + 5 * 1.2 = 7.5 micros more.
    assert_eq!(report.cost_micros, 2_400_000 + 8);
    let spent = ledger
        .budget_status(&op(), "acme", at(20, 0, 0))
        .await
        .unwrap()
        .spent_micros;
    assert_eq!(spent, 2_400_000 + 8);
    let issued = ledger
        .issue_invoice(&op(), "acme", nov(), at(30, 0, 0) + Duration::days(1))
        .await
        .unwrap();
    assert_eq!(
        issued.total_micros,
        2_400_000 + 2 + 6,
        "lines rounded once each: 1.5 -> 2, 6.0 -> 6"
    );
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn month_of_tiny_events_rounds_to_the_invoice(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "tiny").await;
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    // $0.15 per million input tokens, $0.60 per million output: one token is 0.15 micro.
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    let events: Vec<UsageRecord> = (0..30 * 2000)
        .map(|i| {
            ev(
                &format!("r{i}"),
                0,
                "acme",
                at(1 + i / 2000, 0, 0) + Duration::seconds(i as i64 % 2000),
                (1, 0, 1),
            )
        })
        .collect();
    for chunk in events.chunks(1000) {
        ledger.record_batch(chunk).await.unwrap();
    }
    let inv = ledger.invoice(&op(), "acme", nov()).await.unwrap();
    assert_eq!(inv.status, InvoiceStatus::Draft);
    // 60,000 tokens * 0.15 = 9,000 micros; * 0.60 = 36,000 micros. Per-event rounding: 0 + 60,000.
    let amounts: Vec<_> = inv
        .lines
        .iter()
        .map(|l| (l.kind, l.tokens, l.amount_micros))
        .collect();
    assert_eq!(
        amounts,
        vec![
            (TokenKind::Input, 60_000, 9_000),
            (TokenKind::Output, 60_000, 36_000)
        ]
    );
    assert_eq!(inv.total_micros, 45_000);
    let report = ledger.report(&op(), "acme", nov().period()).await.unwrap();
    assert_eq!(report.cost_micros, 45_000);
    assert_eq!(report.lines.len(), 30);
    assert!(report.lines.iter().all(|l| l.cost_micros == 1_500));
    let status = ledger
        .budget_status(&op(), "acme", at(30, 0, 0))
        .await
        .unwrap();
    assert_eq!(status.spent_micros, 45_000, "running spend is exact too");
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn issued_invoices_never_change(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "invoice").await;
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .record_batch(&[ev("a", 0, "acme", at(20, 0, 0), (1_000_000, 0, 0))])
        .await
        .unwrap();
    let dec1 = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
    assert!(matches!(
        ledger
            .issue_invoice(&op(), "acme", nov(), dec1 - Duration::seconds(1))
            .await,
        Err(Error::MonthNotClosed(_))
    ));
    let issued = ledger
        .issue_invoice(&op(), "acme", nov(), dec1)
        .await
        .unwrap();
    assert_eq!(issued.status, InvoiceStatus::Issued);
    assert_eq!(issued.total_micros, 150_000);
    assert!(issued.id.is_some());
    // Issuing again returns the same invoice.
    assert_eq!(
        ledger
            .issue_invoice(&op(), "acme", nov(), dec1 + Duration::days(1))
            .await
            .unwrap(),
        issued
    );

    // Late November usage arrives after issue: November's invoice does not change...
    ledger
        .record_batch(&[ev("late", 0, "acme", at(30, 23, 0), (2_000_000, 0, 0))])
        .await
        .unwrap();
    assert_eq!(ledger.invoice(&op(), "acme", nov()).await.unwrap(), issued);
    // ...the report does, and December's invoice carries the adjustment.
    assert_eq!(
        ledger
            .report(&op(), "acme", nov().period())
            .await
            .unwrap()
            .cost_micros,
        450_000
    );
    ledger
        .record_batch(&[UsageRecord {
            ended_at: dec1 + Duration::hours(1),
            ..ev("dec", 0, "acme", dec1, (0, 0, 1_000_000))
        }])
        .await
        .unwrap();
    let dec = ledger.invoice(&op(), "acme", nov().next()).await.unwrap();
    let adj: Vec<_> = dec.lines.iter().filter(|l| l.adjustment).collect();
    assert_eq!(adj.len(), 1);
    assert_eq!(
        (adj[0].service_month, adj[0].tokens, adj[0].amount_micros),
        (nov(), 2_000_000, 300_000)
    );
    assert_eq!(dec.total_micros, 300_000 + 600_000);
    let jan1 = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
    let dec_issued = ledger
        .issue_invoice(&op(), "acme", nov().next(), jan1)
        .await
        .unwrap();
    assert_eq!(dec_issued.lines, dec.lines);
    // Nothing more is late: January adjusts nothing.
    let jan = ledger
        .invoice(&op(), "acme", nov().next().next())
        .await
        .unwrap();
    assert!(jan.lines.is_empty());
    // Rendering works on stored invoices.
    let csv = tidal_billing::invoice(
        &ledger,
        &op(),
        "acme",
        nov(),
        None,
        tidal_billing::Format::Csv,
    )
    .await
    .unwrap();
    assert!(csv
        .lines()
        .last()
        .unwrap()
        .contains(",total,,,150000,0.150000,"));
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn keys_and_budgets(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "keys").await;
    let t = ledger
        .create_tenant("acme", "Acme Inc", at(1, 0, 0))
        .await
        .unwrap();
    assert_eq!(t.monthly_budget_micros, None);
    assert!(matches!(
        ledger.create_tenant("acme", "again", at(1, 0, 0)).await,
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        ledger.create_tenant("Bad Id", "x", at(1, 0, 0)).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        ledger.issue_key("ghost", Role::Tenant, at(1, 0, 0)).await,
        Err(Error::NotFound(_))
    ));

    let k1 = ledger
        .issue_key("acme", Role::Tenant, at(1, 0, 0))
        .await
        .unwrap();
    let k2 = ledger
        .issue_key("acme", Role::Admin, at(1, 1, 0))
        .await
        .unwrap();
    assert!(k1.secret.starts_with(&k1.prefix) && k1.secret.starts_with("tidal_"));
    let p1 = ledger.authenticate(&k1.secret).await.unwrap().unwrap();
    assert_eq!(
        (p1.tenant.as_str(), p1.role, p1.key_id.as_str()),
        ("acme", Role::Tenant, k1.key_id.as_str())
    );
    assert_eq!(
        ledger.authenticate(&k2.secret).await.unwrap().unwrap().role,
        Role::Admin
    );
    // Wrong secret with the right prefix, garbage, empty: no principal.
    let mut forged = k1.secret.clone();
    let last = if forged.ends_with('a') { "b" } else { "a" };
    forged.replace_range(forged.len() - 1.., last);
    assert_eq!(ledger.authenticate(&forged).await.unwrap(), None);
    assert_eq!(ledger.authenticate("tidal_nope").await.unwrap(), None);
    assert_eq!(ledger.authenticate("").await.unwrap(), None);

    // Only hashes are stored: the secret appears nowhere in the key listing.
    let keys = ledger.list_keys(&p1, "acme").await.unwrap();
    assert_eq!(keys.len(), 2);
    assert!(keys
        .iter()
        .all(|k| !format!("{k:?}").contains(&k1.secret[k1.prefix.len()..])));

    ledger.revoke_key(&k1.key_id, at(2, 0, 0)).await.unwrap();
    ledger.revoke_key(&k1.key_id, at(3, 0, 0)).await.unwrap();
    assert_eq!(ledger.authenticate(&k1.secret).await.unwrap(), None);
    let keys = ledger.list_keys(&op(), "acme").await.unwrap();
    assert_eq!(
        keys.iter()
            .find(|k| k.key_id == k1.key_id)
            .unwrap()
            .revoked_at,
        Some(at(2, 0, 0))
    );
    assert!(matches!(
        ledger.revoke_key("missing", at(2, 0, 0)).await,
        Err(Error::NotFound(_))
    ));

    // Budget: $1.00; spend 0.999999 then 0.000001 more.
    ledger.set_budget("acme", Some(1_000_000)).await.unwrap();
    assert!(matches!(
        ledger.set_budget("acme", Some(-1)).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        ledger.set_budget("ghost", None).await,
        Err(Error::NotFound(_))
    ));
    ledger
        .set_price(
            "llama",
            at(1, 0, 0),
            Prices {
                input_per_m: 1_000_000,
                cached_input_per_m: 0,
                output_per_m: 0,
            },
            at(1, 0, 0),
        )
        .await
        .unwrap();
    ledger
        .record_batch(&[ev("a", 0, "acme", at(2, 0, 0), (999_999, 0, 0))])
        .await
        .unwrap();
    let s = ledger
        .budget_status(&p1, "acme", at(2, 1, 0))
        .await
        .unwrap();
    assert_eq!(
        (s.spent_micros, s.remaining_micros, s.exhausted),
        (999_999, Some(1), false)
    );
    ledger
        .record_batch(&[ev("b", 0, "acme", at(2, 0, 0), (1, 0, 0))])
        .await
        .unwrap();
    assert!(
        ledger
            .budget_status(&p1, "acme", at(2, 1, 0))
            .await
            .unwrap()
            .exhausted
    );
    // A new month starts from zero.
    let dec = ledger
        .budget_status(
            &p1,
            "acme",
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!((dec.spent_micros, dec.exhausted), (0, false));
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn tenant_isolation_on_every_read_path(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "iso").await;
    for t in ["a", "b"] {
        ledger.create_tenant(t, t, at(1, 0, 0)).await.unwrap();
    }
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .record_batch(&[
            ev("ra", 0, "a", at(2, 0, 0), (10, 0, 10)),
            ev("rb", 0, "b", at(2, 0, 0), (20, 0, 20)),
        ])
        .await
        .unwrap();
    let ka = ledger
        .issue_key("a", Role::Tenant, at(1, 0, 0))
        .await
        .unwrap();
    let admin = ledger
        .issue_key("b", Role::Admin, at(1, 0, 0))
        .await
        .unwrap();
    let a = ledger.authenticate(&ka.secret).await.unwrap().unwrap();
    let admin = ledger.authenticate(&admin.secret).await.unwrap().unwrap();
    let period = nov().period();
    let forbidden = |r: Result<(), Error>| assert!(matches!(r, Err(Error::Forbidden(_))), "{r:?}");

    // Own data: allowed, and contains only a's usage.
    let own = ledger.report(&a, "a", period).await.unwrap();
    assert_eq!(own.totals.output_tokens, 10);
    let rows = ledger.usage_rows(&a, Some("a"), period).await.unwrap();
    assert!(rows.iter().all(|r| r.tenant == "a"));
    assert_eq!(ledger.invoice(&a, "a", nov()).await.unwrap().tenant, "a");
    ledger.budget_status(&a, "a", at(3, 0, 0)).await.unwrap();
    ledger.list_keys(&a, "a").await.unwrap();
    ledger.tenant(&a, "a").await.unwrap();

    // Another tenant's data, or everything: forbidden on every path.
    forbidden(ledger.report(&a, "b", period).await.map(drop));
    forbidden(ledger.usage_rows(&a, Some("b"), period).await.map(drop));
    forbidden(ledger.usage_rows(&a, None, period).await.map(drop));
    forbidden(ledger.invoice(&a, "b", nov()).await.map(drop));
    forbidden(ledger.budget_status(&a, "b", at(3, 0, 0)).await.map(drop));
    forbidden(ledger.list_keys(&a, "b").await.map(drop));
    forbidden(ledger.tenant(&a, "b").await.map(drop));
    forbidden(ledger.platform_report(&a, period).await.map(drop));
    forbidden(ledger.fleet_usage(&a, period).await.map(drop));
    forbidden(ledger.event_count(&a).await.map(drop));
    forbidden(
        ledger
            .issue_invoice(&a, "a", nov(), at(30, 0, 0) + Duration::days(2))
            .await
            .map(drop),
    );
    forbidden(
        tidal_billing::report(&ledger, &a, "b", nov(), tidal_billing::Format::Json)
            .await
            .map(drop),
    );

    // Admin reads all.
    assert_eq!(ledger.report(&admin, "a", period).await.unwrap(), own);
    assert_eq!(
        ledger.usage_rows(&admin, None, period).await.unwrap().len(),
        2
    );
    ledger.platform_report(&admin, period).await.unwrap();
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn platform_view(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "platform").await;
    ledger
        .set_price(
            "llama",
            at(1, 0, 0),
            Prices {
                input_per_m: 0,
                cached_input_per_m: 0,
                output_per_m: 2_000_000,
            },
            at(1, 0, 0),
        )
        .await
        .unwrap();
    let on_demand = UsageRecord {
        capacity: CapacityType::OnDemand,
        ..ev("b", 0, "y", at(2, 0, 0), (0, 0, 1_000_000))
    };
    ledger
        .record_batch(&[ev("a", 0, "x", at(2, 0, 0), (0, 0, 3_000_000)), on_demand])
        .await
        .unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 11, 2).unwrap();
    for (capacity, hours, per_hour) in [
        (CapacityType::Spot, 2, 1_000_000),
        (CapacityType::OnDemand, 1, 3_000_000),
    ] {
        let f = FleetUsage {
            model: "llama".into(),
            capacity,
            day,
            price_per_hour_micros: per_hour,
            replica_ms: hours * 1_800_000,
        };
        // Recorded in two half intervals; each reported twice (a controller retry).
        for half in ["first", "second"] {
            let id = format!("llama/{}/{half}", capacity.as_str());
            assert!(ledger.record_fleet_usage(&id, &f).await.unwrap());
            assert!(!ledger.record_fleet_usage(&id, &f).await.unwrap());
        }
    }
    let r = ledger
        .platform_report(&op(), Period::new(day, day.succ_opt().unwrap()).unwrap())
        .await
        .unwrap();
    let m = &r.models[0];
    assert_eq!(
        (
            m.tokens_served,
            m.revenue_micros,
            m.fleet_cost_micros,
            m.margin_micros
        ),
        (4_000_000, 8_000_000, 5_000_000, 3_000_000)
    );
    assert_eq!(m.cost_per_million_tokens_micros, Some(1_250_000));
    let spot = m
        .by_capacity
        .iter()
        .find(|c| c.capacity == CapacityType::Spot)
        .unwrap();
    assert_eq!(
        (spot.replica_ms, spot.cost_per_million_tokens_micros),
        (7_200_000, Some(666_667))
    );
    ledger.close().await;
    db.drop_db().await.unwrap();
}

async fn reports_render(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "render").await;
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .record_batch(&[
            ev("a", 0, "acme", at(2, 0, 0), (1_000_000, 0, 0)),
            ev("b", 0, "acme", at(3, 0, 0), (0, 0, 1_000_000)),
        ])
        .await
        .unwrap();
    let csv = tidal_billing::report(&ledger, &op(), "acme", nov(), tidal_billing::Format::Csv)
        .await
        .unwrap();
    let lines: Vec<_> = csv.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[1],
        "acme,2026-11-02,llama,1,1000000,0,0,150000,0.150000"
    );
    assert_eq!(
        lines[2],
        "acme,2026-11-03,llama,1,0,0,1000000,600000,0.600000"
    );
    let json = tidal_billing::report(&ledger, &op(), "acme", nov(), tidal_billing::Format::Json)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["cost_micros"], 750_000);
    assert_eq!(v["models"][0]["model"], "llama");
    ledger.close().await;
    db.drop_db().await.unwrap();
}

/// The embedded default may also run fully in memory: the pool's connections share it.
#[tokio::test]
async fn sqlite_in_memory_is_shared_by_the_pool() {
    let ledger = tidal_billing::Ledger::connect("sqlite::memory:")
        .await
        .unwrap();
    ledger
        .set_price("llama", at(1, 0, 0), P, at(1, 0, 0))
        .await
        .unwrap();
    ledger
        .create_tenant("acme", "Acme", at(1, 0, 0))
        .await
        .unwrap();
    // Hold connections so that later queries must use others.
    let writes = (0..8).map(|i| {
        let l = ledger.clone();
        async move {
            l.record_batch(&[ev(&format!("r{i}"), 0, "acme", at(2, 0, 0), (1, 0, 1))])
                .await
                .unwrap()
        }
    });
    futures::future::join_all(writes).await;
    assert_eq!(ledger.event_count(&op()).await.unwrap(), 8);
    assert_eq!(ledger.tenant(&op(), "acme").await.unwrap().name, "Acme");
}

/// Restating the prices in effect adds nothing; new prices add a version from `now`.
async fn ensure_price_adds_versions_only_for_changes(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "ensure").await;
    assert!(ledger.ensure_price("llama", P, at(1, 0, 0)).await.unwrap());
    assert!(!ledger.ensure_price("llama", P, at(2, 0, 0)).await.unwrap());
    let dearer = Prices {
        output_per_m: P.output_per_m * 2,
        ..P
    };
    assert!(ledger
        .ensure_price("llama", dearer, at(3, 0, 0))
        .await
        .unwrap());
    assert!(!ledger
        .ensure_price("llama", dearer, at(4, 0, 0))
        .await
        .unwrap());
    // Back to the first prices: the version in effect differs, so a new one is added.
    assert!(ledger.ensure_price("llama", P, at(5, 0, 0)).await.unwrap());
    let versions = ledger.price_versions(Some("llama")).await.unwrap();
    let starts: Vec<_> = versions.iter().map(|v| v.effective_from).collect();
    assert_eq!(starts, vec![at(1, 0, 0), at(3, 0, 0), at(5, 0, 0)]);
    db.drop_db().await.unwrap();
}

on_both!(
    ensure_price_adds_versions_only_for_changes,
    idempotent_ingest,
    price_change_mid_day,
    month_of_tiny_events_rounds_to_the_invoice,
    issued_invoices_never_change,
    keys_and_budgets,
    tenant_isolation_on_every_read_path,
    platform_view,
    reports_render,
);
