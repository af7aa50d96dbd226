//! `tidal models` against the real services: a fresh Redis prefix, a scratch PostgreSQL
//! ledger and a `tidal gateway` process on them. `put` writes the record to the broker and a
//! price version to the ledger, the gateway lists the model, `list` shows it and `remove`
//! withdraws it; bad values are refused before anything is written.

mod process;

use std::process::Command;
use std::time::Duration;

use process::{default_model, eventually, start_gateway, tidal_json};
use serde_json::Value;
use tidal_billing::scratch::{ScratchDb, DEFAULT_SERVER_URL};
use tidal_billing::Ledger;
use tidal_queue::{Broker, BrokerConfig, ModelRecord, ModelState, Prices, RedisBroker};

const MODEL: &str = "ns/smol";

/// A fresh key prefix on the test Redis, deleted on drop (passing or not).
struct Prefix {
    url: String,
    prefix: String,
}

impl Prefix {
    async fn new(test: &str) -> Prefix {
        let url = tidal_queue::testing::ensure_redis()
            .await
            .expect("test Redis");
        let prefix = format!("tidal-{test}-{}:", uuid::Uuid::now_v7().simple());
        Prefix { url, prefix }
    }

    async fn broker(&self) -> RedisBroker {
        let config = BrokerConfig {
            prefix: self.prefix.clone(),
            ..BrokerConfig::default()
        };
        RedisBroker::connect(&self.url, config).await.unwrap()
    }

    /// `tidal models --redis URL --prefix P [--database DB] ARGS`.
    fn command(&self, db: Option<&str>, args: &[&str]) -> Vec<String> {
        let mut argv = vec!["models", "--redis", &self.url, "--prefix", &self.prefix];
        if let Some(db) = db {
            argv.extend(["--database", db]);
        }
        argv.extend(args);
        argv.into_iter().map(String::from).collect()
    }

    fn json(&self, db: Option<&str>, args: &[&str]) -> Value {
        let argv = self.command(db, args);
        tidal_json(&argv.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Runs a `tidal models` command that must fail; its stderr.
    fn fails(&self, db: Option<&str>, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args(self.command(db, args))
            .output()
            .unwrap();
        assert!(!out.status.success(), "tidal models {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        tidal_queue::testing::delete_prefix(&self.url, &self.prefix);
    }
}

async fn scratch_ledger(tag: &str) -> ScratchDb {
    let server =
        std::env::var("TIDAL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.into());
    ScratchDb::postgres(&server, tag)
        .await
        .expect("PostgreSQL (scripts/services.sh starts it)")
}

/// `GET /v1/models` of the gateway at `base` with `key`.
async fn gateway_models(base: &str, key: &str) -> Vec<Value> {
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let body: Value = r.json().await.unwrap();
    body["data"].as_array().unwrap().clone()
}

/// The price flags, with `output` as the output price.
fn prices(output: &str) -> [&str; 6] {
    [
        "--input-price",
        "100000",
        "--cached-input-price",
        "50000",
        "--output-price",
        output,
    ]
}

#[tokio::test]
async fn put_publishes_to_broker_and_ledger_and_the_gateway_serves_the_list() {
    let redis = Prefix::new("models-cli").await;
    let db = scratch_ledger("models_cli").await;
    let broker = redis.broker().await;
    let (_gateway, base) = start_gateway(&redis.url, &redis.prefix, &db.url).await;
    tidal_json(&["keys", "--database", &db.url, "create-tenant", "acme"]);
    let key = tidal_json(&["keys", "--database", &db.url, "issue", "acme"])["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(gateway_models(&base, &key).await.is_empty());

    // Published after the gateway started: it needs no restart to see the model.
    let mut put = vec![MODEL, "--context-length", "4096", "--max-queue-wait", "30s"];
    put.extend(["--backlog-cap", "50"]);
    put.extend(prices("400000"));
    let out = redis.json(Some(&db.url), &[&["put"], &put[..]].concat());
    assert_eq!(out["price_version_added"], true, "{out}");
    let mut expected = ModelRecord {
        id: MODEL.into(),
        state: ModelState::Ready,
        prices: Prices {
            currency: "USD".into(),
            input_per_mtok_micros: 100_000,
            cached_input_per_mtok_micros: 50_000,
            output_per_mtok_micros: 400_000,
        },
        max_queue_wait_ms: 30_000,
        backlog_cap: 50,
        context_length: 4096,
    };
    assert_eq!(broker.model(MODEL).await.unwrap().as_ref(), Some(&expected));
    let ledger = Ledger::connect(&db.url).await.unwrap();
    let versions = ledger.price_versions(Some(MODEL)).await.unwrap();
    assert_eq!(versions.len(), 1, "{versions:?}");
    let billed = tidal_billing::Prices {
        input_per_m: 100_000,
        cached_input_per_m: 50_000,
        output_per_m: 400_000,
    };
    assert_eq!(versions[0].prices, billed);
    assert_eq!(out["price_version"]["id"], versions[0].id, "{out}");

    let listed = redis.json(None, &["list"]);
    let records: Vec<ModelRecord> = serde_json::from_value(listed).unwrap();
    assert_eq!(records, vec![expected.clone()]);

    let served = gateway_models(&base, &key).await;
    assert_eq!(served.len(), 1, "{served:?}");
    let m = &served[0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["context_length"], 4096);
    assert_eq!(m["state"], "ready");
    assert_eq!(m["max_queue_wait_ms"], 30_000);
    assert_eq!(m["pricing"]["output_per_mtok_micros"], 400_000);
    assert_eq!(
        m["created"],
        versions[0].effective_from.timestamp(),
        "created comes from the ledger's price version"
    );

    // The same prices again add no version; the context length read from the GGUF and the
    // state replace the record's.
    let model = default_model();
    let gguf_context = {
        let file = tidal_runtime::model::ModelFile::open(&model).unwrap();
        let config = tidal_runtime::model::ModelConfig::from_file(&file).unwrap();
        u32::try_from(config.context_length).unwrap()
    };
    let path = model.to_str().unwrap();
    let put = |output| {
        let mut argv = vec!["put", MODEL, "--gguf", path, "--state", "scaled-to-zero"];
        argv.extend(["--max-queue-wait", "30s", "--backlog-cap", "50"]);
        argv.extend(prices(output));
        argv
    };
    let out = redis.json(Some(&db.url), &put("400000"));
    assert_eq!(out["price_version_added"], false, "{out}");
    assert_eq!(ledger.price_versions(Some(MODEL)).await.unwrap().len(), 1);
    expected.context_length = gguf_context;
    expected.state = ModelState::ScaledToZero;
    assert_eq!(broker.model(MODEL).await.unwrap().as_ref(), Some(&expected));

    // New prices are a new version; the old one stays for the usage it priced.
    let out = redis.json(Some(&db.url), &put("500000"));
    assert_eq!(out["price_version_added"], true, "{out}");
    let versions = ledger.price_versions(Some(MODEL)).await.unwrap();
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert_eq!(versions[1].prices.output_per_m, 500_000);

    assert_eq!(
        redis.json(None, &["remove", MODEL]),
        serde_json::json!({"id": MODEL, "removed": true})
    );
    assert_eq!(broker.model(MODEL).await.unwrap(), None);
    assert_eq!(redis.json(None, &["list"]), serde_json::json!([]));
    eventually(
        "the gateway to drop the model",
        Duration::from_secs(10),
        || {
            let (base, key) = (base.clone(), key.clone());
            async move { gateway_models(&base, &key).await.is_empty().then_some(()) }
        },
    )
    .await;
    let e = redis.fails(None, &["remove", MODEL]);
    assert!(e.contains("no model `ns/smol` is published"), "{e}");
    assert_eq!(ledger.price_versions(Some(MODEL)).await.unwrap().len(), 2);

    ledger.close().await;
    drop(_gateway);
    db.drop_db().await.unwrap();
}

/// Bad values and a missing ledger are refused, naming the flag, and nothing is written.
#[tokio::test]
async fn put_refuses_bad_values_before_writing_anything() {
    let redis = Prefix::new("models-cli-bad").await;
    let db = scratch_ledger("models_cli_bad").await;
    let put = |extra: &[&'static str]| {
        let mut argv = vec!["put", MODEL, "--context-length", "4096"];
        argv.extend(["--cached-input-price", "1", "--output-price", "1"]);
        argv.extend(extra);
        argv
    };
    let e = redis.fails(Some(&db.url), &put(&["--input-price", "-5"]));
    assert!(
        e.contains("--input-price") && e.contains("out of range"),
        "{e}"
    );
    let e = redis.fails(
        Some(&db.url),
        &put(&["--input-price", "1", "--max-queue-wait", "soon"]),
    );
    assert!(e.contains("--max-queue-wait"), "{e}");
    let e = redis.fails(None, &put(&["--input-price", "1"]));
    assert!(e.contains("needs --database"), "{e}");
    let e = redis.fails(
        Some(&db.url),
        &["put", MODEL, "--gguf", "/nonexistent.gguf"],
    );
    assert!(e.contains("--input-price"), "{e}");
    let mut gguf = vec!["put", MODEL, "--gguf", "/nonexistent.gguf"];
    gguf.extend(prices("1"));
    let e = redis.fails(Some(&db.url), &gguf);
    assert!(e.contains("--gguf /nonexistent.gguf"), "{e}");

    assert_eq!(redis.broker().await.models().await.unwrap(), vec![]);
    let ledger = Ledger::connect(&db.url).await.unwrap();
    assert!(ledger.price_versions(None).await.unwrap().is_empty());
    ledger.close().await;
    db.drop_db().await.unwrap();
}
