//! The usage API over real HTTP (a bound socket, raw HTTP/1.1), on PostgreSQL and SQLite:
//! tenant isolation on every route with every tenant parameter, admin access, revoked keys,
//! error bodies and CSV content types.

mod common;

use std::net::SocketAddr;

use chrono::{DateTime, TimeZone, Utc};
use common::Kind;
use tidal_billing::{CapacityType, Ledger, Month, Prices, Principal, Role, UsageRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// Checks an OpenAI-style error body with `status`.
    fn assert_error(&self, status: u16, what: &str) {
        assert_eq!(self.status, status, "{what}: {}", self.body);
        assert!(self.content_type.starts_with("application/json"), "{what}");
        let e = &self.json()["error"];
        assert!(e["message"].is_string(), "{what}: {}", self.body);
        assert!(e["type"].is_string(), "{what}: {}", self.body);
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{what}: {}",
            self.body
        );
    }
}

/// One `GET` over a fresh connection (`Connection: close`, so the body ends at EOF).
async fn get(addr: SocketAddr, path: &str, auth: Option<&str>) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut content_type = String::new();
    for l in lines {
        let (k, v) = l.split_once(':').unwrap();
        assert!(
            !k.eq_ignore_ascii_case("transfer-encoding"),
            "test client reads plain bodies"
        );
        if k.eq_ignore_ascii_case("content-type") {
            content_type = v.trim().to_string();
        }
    }
    Reply {
        status,
        content_type,
        body: body.to_string(),
    }
}

fn at(d: u32, h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, d, h, 0, 0).unwrap()
}

fn record(id: &str, tenant: &str, model: &str, end: DateTime<Utc>) -> UsageRecord {
    UsageRecord {
        request_id: id.into(),
        segment: 0,
        tenant: tenant.into(),
        model: model.into(),
        prompt_tokens: 1000,
        cached_prompt_tokens: 200,
        completion_tokens: 500,
        worker: "w".into(),
        capacity: CapacityType::Spot,
        started_at: end - chrono::Duration::seconds(3),
        ended_at: end,
        last: false,
    }
}

struct Fixture {
    addr: SocketAddr,
    ledger: Ledger,
    key_a: String,
    key_a_id: String,
    key_b: String,
    admin: String,
}

async fn serve(ledger: &Ledger) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = tidal_billing::http::router(ledger.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Tenants `alpha` and `beta` with usage in 2026-11 (alpha's invoice issued), and `ops`
/// holding the admin key.
async fn fixture(ledger: Ledger) -> Fixture {
    let t0 = at(1, 0);
    ledger
        .set_price(
            "m",
            t0,
            Prices {
                input_per_m: 1_000_000,
                cached_input_per_m: 500_000,
                output_per_m: 2_000_000,
            },
            t0,
        )
        .await
        .unwrap();
    for t in ["alpha", "beta", "ops"] {
        ledger.create_tenant(t, t, t0).await.unwrap();
    }
    ledger
        .record_batch(&[
            record("ra1", "alpha", "m", at(3, 10)),
            record("ra2", "alpha", "m", at(4, 10)),
            record("rb1", "beta", "m", at(3, 11)),
        ])
        .await
        .unwrap();
    let op = Principal::operator();
    let dec = Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap();
    ledger
        .issue_invoice(&op, "alpha", Month::parse("2026-11").unwrap(), dec)
        .await
        .unwrap();
    let a = ledger.issue_key("alpha", Role::Tenant, t0).await.unwrap();
    let b = ledger.issue_key("beta", Role::Tenant, t0).await.unwrap();
    let admin = ledger.issue_key("ops", Role::Admin, t0).await.unwrap();
    Fixture {
        addr: serve(&ledger).await,
        ledger,
        key_a: format!("Bearer {}", a.secret),
        key_a_id: a.key_id,
        key_b: format!("Bearer {}", b.secret),
        admin: format!("Bearer {}", admin.secret),
    }
}

/// Every read path, with every way of naming another tenant.
async fn tenant_isolation(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "http_isolation").await;
    let f = fixture(ledger).await;
    let a = Some(f.key_a.as_str());

    // Own data: default tenant and explicit.
    for path in [
        "/v1/usage?month=2026-11",
        "/v1/usage?month=2026-11&tenant=alpha",
    ] {
        let r = get(f.addr, path, a).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(r.content_type.starts_with("application/json"));
        let j = r.json();
        assert_eq!(j["tenant"], "alpha");
        assert_eq!(j["totals"]["segments"], 2);
        assert!(!r.body.contains("beta"));
    }
    let r = get(f.addr, "/v1/invoices/2026-11", a).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.json()["tenant"].as_str(), r.json()["status"].as_str()),
        (Some("alpha"), Some("issued"))
    );

    // Someone else's: refused with 403 whatever the spelling; a repeated parameter is a 400.
    let others = ["beta", "BETA", "beta%20", "%62eta", "", "ops", "nobody"];
    for t in others {
        for path in [
            format!("/v1/usage?month=2026-11&tenant={t}"),
            format!("/v1/usage?month=2026-11&tenant={t}&format=csv"),
            format!("/v1/invoices/2026-11?tenant={t}"),
            format!("/v1/invoices/2026-11?tenant={t}&format=csv"),
        ] {
            let r = get(f.addr, &path, a).await;
            r.assert_error(403, &path);
            assert!(!r.body.contains("rb1"));
        }
    }
    for path in [
        "/v1/usage?month=2026-11&tenant=alpha&tenant=beta",
        "/v1/usage?month=2026-11&tenant=beta&tenant=alpha",
        "/v1/invoices/2026-11?tenant=alpha&tenant=beta",
    ] {
        get(f.addr, path, a).await.assert_error(400, path);
    }
    // The admin route is refused to tenant keys.
    for path in [
        "/v1/admin/platform?month=2026-11",
        "/v1/admin/platform?month=2026-11&tenant=alpha",
    ] {
        get(f.addr, path, a).await.assert_error(403, path);
    }
    // B sees only B.
    let r = get(f.addr, "/v1/usage?month=2026-11", Some(&f.key_b)).await;
    assert_eq!((r.status, r.json()["tenant"].as_str()), (200, Some("beta")));
    assert_eq!(r.json()["totals"]["segments"], 1);
    get(f.addr, "/v1/invoices/2026-11?tenant=alpha", Some(&f.key_b))
        .await
        .assert_error(403, "b reads a");

    // Admin reads anyone, and the platform view.
    let admin = Some(f.admin.as_str());
    for (t, segments) in [("alpha", 2), ("beta", 1)] {
        let r = get(
            f.addr,
            &format!("/v1/usage?month=2026-11&tenant={t}"),
            admin,
        )
        .await;
        assert_eq!(
            (r.status, r.json()["totals"]["segments"].as_i64()),
            (200, Some(segments))
        );
        let r = get(f.addr, &format!("/v1/invoices/2026-11?tenant={t}"), admin).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["tenant"], t);
    }
    assert_eq!(
        get(f.addr, "/v1/invoices/2026-11?tenant=beta", admin)
            .await
            .json()["status"],
        "draft"
    );
    let r = get(f.addr, "/v1/admin/platform?month=2026-11", admin).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["revenue_micros"].as_i64().unwrap() > 0);

    f.ledger.close().await;
    db.drop_db().await.unwrap();
}

/// Missing, malformed, unknown and revoked keys get 401 on every route, before anything else
/// is looked at.
async fn authentication(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "http_auth").await;
    let f = fixture(ledger).await;
    let routes = [
        "/v1/usage?month=2026-11",
        "/v1/usage?month=bad",
        "/v1/invoices/2026-11",
        "/v1/admin/platform?month=2026-11",
    ];
    let wrong = format!("{}x", f.key_a);
    let basic = f.key_a.replacen("Bearer", "Basic", 1);
    for path in routes {
        for auth in [
            None,
            Some("Bearer"),
            Some("Bearer tidal-nope"),
            Some(wrong.as_str()),
            Some(basic.as_str()),
        ] {
            get(f.addr, path, auth)
                .await
                .assert_error(401, &format!("{path} {auth:?}"));
        }
    }
    assert_eq!(get(f.addr, routes[0], Some(&f.key_a)).await.status, 200);
    f.ledger.revoke_key(&f.key_a_id, at(20, 0)).await.unwrap();
    for path in routes {
        get(f.addr, path, Some(&f.key_a))
            .await
            .assert_error(401, &format!("revoked {path}"));
    }
    // Other keys are unaffected.
    assert_eq!(get(f.addr, routes[0], Some(&f.key_b)).await.status, 200);
    let health = get(f.addr, "/health", None).await;
    assert_eq!(health.status, 200);
    f.ledger.close().await;
    db.drop_db().await.unwrap();
}

/// Bad months and formats are 400s naming the parameter; CSV has its content type.
async fn formats_and_bad_input(kind: Kind) {
    let (db, ledger) = common::ledger(kind, "http_formats").await;
    let f = fixture(ledger).await;
    let a = Some(f.key_a.as_str());
    for (path, param) in [
        ("/v1/usage", "month"),
        ("/v1/usage?month=2026-13", "month"),
        ("/v1/usage?month=26-11", "month"),
        ("/v1/usage?month=2026-11&format=xml", "format"),
        ("/v1/invoices/november", "month"),
        ("/v1/invoices/2026-11?format=pdf", "format"),
    ] {
        let r = get(f.addr, path, a).await;
        r.assert_error(400, path);
        assert_eq!(r.json()["error"]["param"], param, "{path}");
    }
    let admin = Some(f.admin.as_str());
    get(f.addr, "/v1/admin/platform?month=2026-11&format=csv", admin)
        .await
        .assert_error(400, "platform csv");
    get(f.addr, "/v1/admin/platform", admin)
        .await
        .assert_error(400, "platform month");

    let r = get(f.addr, "/v1/usage?month=2026-11&format=csv", a).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "text/csv; charset=utf-8");
    let mut lines = r.body.lines();
    assert!(lines.next().unwrap().starts_with("tenant,date,model,"));
    assert_eq!(
        lines.filter(|l| l.starts_with("alpha,2026-11-0")).count(),
        2
    );
    let r = get(f.addr, "/v1/invoices/2026-11?format=csv", a).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "text/csv; charset=utf-8");
    assert!(r.body.lines().count() > 1, "{}", r.body);
    // The same report as `tidal report` prints.
    let cli = tidal_billing::report(
        &f.ledger,
        &Principal::operator(),
        "alpha",
        Month::parse("2026-11").unwrap(),
        tidal_billing::Format::Csv,
    )
    .await
    .unwrap();
    let usage_csv = get(f.addr, "/v1/usage?month=2026-11&format=csv", a).await;
    assert_eq!(usage_csv.body, cli);
    f.ledger.close().await;
    db.drop_db().await.unwrap();
}

on_both!(tenant_isolation, authentication, formats_and_bad_input);
