//! The ledger's gateway table (rate limits) on PostgreSQL and SQLite.

use chrono::Utc;
use tidal_billing::ledger::RateLimits;
use tidal_billing::scratch::{ScratchDb, DEFAULT_SERVER_URL};
use tidal_billing::{Error, Ledger};

async fn exercise(ledger: &Ledger) {
    let now = Utc::now();
    ledger.create_tenant("acme", "Acme", now).await.unwrap();
    ledger.create_tenant("beta", "Beta", now).await.unwrap();
    assert_eq!(
        ledger.rate_limits("acme").await.unwrap(),
        RateLimits::default()
    );
    let l = RateLimits {
        requests_per_min: Some(60),
        tokens_per_min: Some(100_000),
    };
    ledger.set_rate_limits("acme", l).await.unwrap();
    assert_eq!(ledger.rate_limits("acme").await.unwrap(), l);
    let l2 = RateLimits {
        requests_per_min: None,
        tokens_per_min: Some(5),
    };
    ledger.set_rate_limits("acme", l2).await.unwrap();
    assert_eq!(ledger.rate_limits("acme").await.unwrap(), l2);
    assert!(matches!(
        ledger.set_rate_limits("nobody", l).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        ledger.rate_limits("nobody").await,
        Err(Error::NotFound(_))
    ));
    let bad = RateLimits {
        requests_per_min: Some(0),
        tokens_per_min: None,
    };
    assert!(matches!(
        ledger.set_rate_limits("acme", bad).await,
        Err(Error::Invalid(_))
    ));
    // Malformed ids and names are refused before the database sees them (PostgreSQL
    // would fail on a NUL byte as a database error, a 503 at the API).
    let op = tidal_billing::Principal::operator();
    for bad in ["a\0b", "Acme", ""] {
        let invalid = |r: Result<(), Error>| matches!(r, Err(Error::Invalid(_)));
        assert!(invalid(ledger.tenant(&op, bad).await.map(drop)), "{bad:?}");
        assert!(invalid(ledger.rate_limits(bad).await.map(drop)), "{bad:?}");
        assert!(invalid(ledger.set_budget(bad, Some(1)).await), "{bad:?}");
        assert!(invalid(ledger.set_rate_limits(bad, l).await), "{bad:?}");
        let key = ledger
            .issue_key(bad, tidal_billing::Role::Tenant, now)
            .await;
        assert!(invalid(key.map(drop)), "{bad:?}");
        assert!(
            invalid(ledger.list_keys(&op, bad).await.map(drop)),
            "{bad:?}"
        );
        let status = ledger.budget_status(&op, bad, now).await;
        assert!(invalid(status.map(drop)), "{bad:?}");
    }
    for name in ["a\0b", "line\nbreak", ""] {
        let r = ledger.create_tenant("named", name, now).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{name:?}");
    }
    assert!(matches!(
        ledger.revoke_key("a\0b", now).await,
        Err(Error::NotFound(_))
    ));
    let all = ledger.tenant_settings().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!((all[0].tenant.id.as_str(), all[0].limits), ("acme", l2));
    assert_eq!(all[1].limits, RateLimits::default());
}

#[tokio::test]
async fn gateway_tables_on_sqlite() {
    let db = ScratchDb::sqlite("gw-ledger");
    let ledger = Ledger::connect(&db.url).await.unwrap();
    exercise(&ledger).await;
    ledger.close().await;
    db.drop_db().await.unwrap();
}

#[tokio::test]
async fn gateway_tables_on_postgres() {
    let server =
        std::env::var("TIDAL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.to_string());
    let db = ScratchDb::postgres(&server, "gw_ledger").await.unwrap();
    let ledger = Ledger::connect(&db.url).await.unwrap();
    exercise(&ledger).await;
    ledger.close().await;
    db.drop_db().await.unwrap();
}
