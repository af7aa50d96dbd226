//! `tidal models`: publishes, lists and removes the model records the gateway routes by (the
//! broker's `{prefix}models` hash), for a platform run without the Kubernetes controller or
//! `tidal up`, which otherwise publish them. `put` also writes the prices to the ledger as a
//! price version, as those publishers do, so billing never depends on Redis state. Prints
//! JSON.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use tidal_billing::Ledger;
use tidal_queue::{Broker, BrokerConfig, ModelRecord, ModelState, Prices, RedisBroker};
use tidal_runtime::model::{ModelConfig, ModelFile};

use super::engine_args::parse_duration;

/// Highest price accepted, micro-units per million tokens (the `Model` CRD's bound).
const MAX_PRICE_MICROS: i64 = 1_000_000_000_000;
/// Longest context accepted, in tokens (the `Model` CRD's bound).
const MAX_CONTEXT_LENGTH: u32 = 10_485_760;
/// Longest queue wait accepted.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(3600);
/// Most queued requests accepted as a backlog cap (the `Model` CRD's bound).
const MAX_BACKLOG_CAP: u64 = 10_000_000;
/// Longest model id accepted, in bytes.
const MAX_NAME_LEN: usize = 256;

/// Flags of `tidal models`.
#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Redis holding the queue (the gateway's `--redis`).
    #[arg(long, env = "TIDAL_REDIS_URL", value_parser = parse_redis_url)]
    pub redis: String,
    /// Key prefix of the broker's keys (the gateway's `--key-prefix`).
    #[arg(
        long,
        visible_alias = "prefix",
        default_value = "tidal:",
        global = true
    )]
    pub key_prefix: String,
    /// Ledger database, `postgres://...` or `sqlite:PATH` (migrated if needed); `put` writes
    /// the prices there.
    #[arg(
        long,
        env = "TIDAL_DATABASE_URL",
        value_parser = parse_database_url,
        global = true
    )]
    pub database: Option<String>,
    #[command(subcommand)]
    pub command: ModelsCommand,
}

/// The operations.
#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Publish a model (or replace its record): the gateway serves it from then on to the
    /// workers started with the same `--model-id`; its prices become the ledger's price
    /// version from now on unless they are already in effect.
    Put(Box<PutArgs>),
    /// List the published model records.
    List,
    /// Withdraw a model: the gateway answers 404 for it. Its price versions stay in the
    /// ledger, which bills the usage already served.
    Remove {
        /// Model id.
        #[arg(value_parser = parse_model_name)]
        name: String,
    },
}

/// Flags of `tidal models put`.
#[derive(Args, Debug)]
pub struct PutArgs {
    /// Model id, as clients name it and as the workers' `--model-id` (default there: the
    /// runtime's `--model-name`, else the GGUF file name).
    #[arg(value_parser = parse_model_name)]
    pub name: String,
    /// Context length in tokens advertised in `/v1/models` and bounding the gateway's budget
    /// holds.
    #[arg(long, value_name = "TOKENS", required_unless_present = "gguf",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONTEXT_LENGTH)),
          allow_negative_numbers = true)]
    pub context_length: Option<u32>,
    /// Read the context length from this GGUF file (its metadata only) instead.
    #[arg(long, value_name = "PATH", conflicts_with = "context_length")]
    pub gguf: Option<PathBuf>,
    /// Price per million computed prompt tokens, in micro-units of the currency.
    #[arg(long, value_name = "MICROS", value_parser = parse_price, allow_negative_numbers = true)]
    pub input_price: i64,
    /// Price per million prompt tokens served from the prefix cache, in micro-units.
    #[arg(long, value_name = "MICROS", value_parser = parse_price, allow_negative_numbers = true)]
    pub cached_input_price: i64,
    /// Price per million completion tokens, in micro-units.
    #[arg(long, value_name = "MICROS", value_parser = parse_price, allow_negative_numbers = true)]
    pub output_price: i64,
    /// ISO 4217 currency of the prices.
    #[arg(long, default_value = "USD", value_parser = parse_currency)]
    pub currency: String,
    /// Longest a request waits for a worker before a 503 (1ms to 1h).
    #[arg(long, default_value = "2m", value_parser = parse_queue_wait)]
    pub max_queue_wait: Duration,
    /// Most queued requests before the gateway answers 503.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_BACKLOG_CAP),
          allow_negative_numbers = true)]
    pub backlog_cap: u64,
    /// Serving state shown in `/v1/models`.
    #[arg(long, value_enum, default_value = "ready")]
    pub state: StateArg,
}

/// Serving state of a published model.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    /// At least one worker serving.
    Ready,
    /// Workers requested, none ready yet.
    Starting,
    /// No workers; the first request starts one.
    #[value(alias = "scaled_to_zero")]
    ScaledToZero,
}

impl From<StateArg> for ModelState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Ready => ModelState::Ready,
            StateArg::Starting => ModelState::Starting,
            StateArg::ScaledToZero => ModelState::ScaledToZero,
        }
    }
}

fn parse_redis_url(s: &str) -> Result<String, String> {
    const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
    if SCHEMES
        .iter()
        .any(|p| s.starts_with(p) && s.len() > p.len())
    {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "`{s}` is not a Redis URL (redis://HOST[:PORT][/DB])"
        ))
    }
}

fn parse_database_url(s: &str) -> Result<String, String> {
    let ok = ["postgres://", "postgresql://", "sqlite:"]
        .iter()
        .any(|p| s.starts_with(p) && s.len() > p.len());
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "`{s}` is not a ledger URL (postgres://... or sqlite:PATH)"
        ))
    }
}

fn parse_model_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the model id is empty".into());
    }
    if s.len() > MAX_NAME_LEN {
        return Err(format!(
            "the model id is {} bytes long, more than {MAX_NAME_LEN}",
            s.len()
        ));
    }
    // Clients must be able to type it into `"model"`, and the queue's key names embed it.
    if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("the model id `{s}` contains {c:?}"));
    }
    Ok(s.to_owned())
}

fn parse_price(s: &str) -> Result<i64, String> {
    let bound = || format!("a price is 0 to {MAX_PRICE_MICROS} micro-units per million tokens");
    let v: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number; {}", bound()))?;
    if (0..=MAX_PRICE_MICROS).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is out of range; {}", bound()))
    }
}

fn parse_currency(s: &str) -> Result<String, String> {
    if s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(s.to_owned())
    } else {
        Err(format!("`{s}` is not an ISO 4217 code such as USD"))
    }
}

fn parse_queue_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) || d > MAX_QUEUE_WAIT {
        return Err(format!("`{s}` is out of range (1ms to 1h)"));
    }
    Ok(d)
}

/// The context length in `path`'s GGUF metadata.
fn gguf_context_length(path: &Path) -> anyhow::Result<u32> {
    let file = ModelFile::open(path)?;
    let config = ModelConfig::from_file(&file)?;
    let n = u32::try_from(config.context_length).unwrap_or(u32::MAX);
    anyhow::ensure!(
        (1..=MAX_CONTEXT_LENGTH).contains(&n),
        "its context length {n} is outside 1..={MAX_CONTEXT_LENGTH}; give --context-length"
    );
    Ok(n)
}

/// The record `put` publishes.
fn record(args: &PutArgs) -> anyhow::Result<ModelRecord> {
    let context_length = match (&args.gguf, args.context_length) {
        (Some(path), _) => gguf_context_length(path)
            .with_context(|| format!("--gguf {}: reading the context length", path.display()))?,
        (None, Some(n)) => n,
        (None, None) => anyhow::bail!("give --context-length or --gguf"),
    };
    Ok(ModelRecord {
        id: args.name.clone(),
        state: args.state.into(),
        prices: Prices {
            currency: args.currency.clone(),
            // parse_price keeps them non-negative.
            input_per_mtok_micros: args.input_price as u64,
            cached_input_per_mtok_micros: args.cached_input_price as u64,
            output_per_mtok_micros: args.output_price as u64,
        },
        max_queue_wait_ms: u64::try_from(args.max_queue_wait.as_millis()).unwrap_or(u64::MAX),
        backlog_cap: args.backlog_cap,
        context_length,
    })
}

/// An operation with its values checked, ready to run against the services.
enum Op {
    Put {
        record: ModelRecord,
        database: String,
    },
    List,
    Remove {
        name: String,
    },
}

/// Runs one operation.
pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    // Everything that needs no service is checked before connecting to one.
    let op = match &args.command {
        ModelsCommand::Put(put) => Op::Put {
            database: args.database.clone().context(
                "`tidal models put` needs --database (or TIDAL_DATABASE_URL): the prices are \
                 written to the ledger too",
            )?,
            record: record(put)?,
        },
        ModelsCommand::List => Op::List,
        ModelsCommand::Remove { name } => Op::Remove { name: name.clone() },
    };
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async move {
        let config = BrokerConfig {
            prefix: args.key_prefix.clone(),
            ..BrokerConfig::default()
        };
        let broker = RedisBroker::connect(&args.redis, config)
            .await
            .with_context(|| format!("connecting to --redis {}", args.redis))?;
        let out = match op {
            Op::Put { record, database } => publish(&broker, &database, record).await?,
            Op::List => json!(broker.models().await.context("reading the model records")?),
            Op::Remove { name } => {
                let removed = broker
                    .remove_model(&name)
                    .await
                    .with_context(|| format!("removing model `{name}`"))?;
                anyhow::ensure!(
                    removed,
                    "no model `{name}` is published under key prefix `{}`",
                    args.key_prefix
                );
                json!({"id": name, "removed": true})
            }
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        anyhow::Ok(())
    })
}

/// Writes the prices to the ledger, then the record to the broker: the gateway never routes
/// to a model whose prices billing lacks.
async fn publish(
    broker: &RedisBroker,
    database: &str,
    record: ModelRecord,
) -> anyhow::Result<serde_json::Value> {
    let ledger = Ledger::connect(database)
        .await
        .with_context(|| format!("opening ledger --database {database}"))?;
    let prices = tidal_billing::Prices::from(&record.prices);
    let now = chrono::Utc::now();
    let added = ledger
        .ensure_price(&record.id, prices, now)
        .await
        .with_context(|| format!("writing the prices of `{}` to the ledger", record.id))?;
    let version = ledger
        .price_versions(Some(&record.id))
        .await
        .context("reading the price versions back")?
        .into_iter()
        .filter(|v| v.effective_from <= now)
        .max_by_key(|v| v.effective_from);
    ledger.close().await;
    broker
        .put_model(&record)
        .await
        .with_context(|| format!("writing the record of `{}`", record.id))?;
    Ok(json!({
        "model": record,
        "price_version": version,
        "price_version_added": added,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ModelsArgs,
    }

    fn parse(extra: &[&str]) -> Result<ModelsArgs, String> {
        let base = ["tidal", "--redis", "redis://127.0.0.1:6379", "--database"];
        let argv = base.iter().chain(["sqlite:x.db"].iter()).chain(extra);
        Cli::try_parse_from(argv)
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    const PRICES: [&str; 6] = [
        "--input-price",
        "100000",
        "--cached-input-price",
        "50000",
        "--output-price",
        "400000",
    ];

    fn put(extra: &[&str]) -> Result<PutArgs, String> {
        let mut argv = vec!["put"];
        argv.extend(extra);
        match parse(&argv)?.command {
            ModelsCommand::Put(p) => Ok(*p),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn put_builds_the_record() {
        let mut argv = vec!["ns/smol", "--context-length", "8192", "--max-queue-wait"];
        argv.extend(["30s", "--backlog-cap", "7", "--state", "scaled_to_zero"]);
        argv.extend(PRICES);
        let r = record(&put(&argv).unwrap()).unwrap();
        assert_eq!(r.id, "ns/smol");
        assert_eq!(r.context_length, 8192);
        assert_eq!(r.max_queue_wait_ms, 30_000);
        assert_eq!(r.backlog_cap, 7);
        assert_eq!(r.state, ModelState::ScaledToZero);
        assert_eq!(r.prices.currency, "USD");
        assert_eq!(r.prices.input_per_mtok_micros, 100_000);
        assert_eq!(r.prices.cached_input_per_mtok_micros, 50_000);
        assert_eq!(r.prices.output_per_mtok_micros, 400_000);
    }

    /// Each bad value is refused, naming the flag (or the id) and why.
    #[test]
    fn put_refuses_bad_values() {
        let cases: [(&[&str], &str, &str); 11] = [
            (
                &["m", "--input-price", "-5"],
                "--input-price",
                "out of range",
            ),
            (
                &["m", "--output-price", "1e3"],
                "--output-price",
                "whole number",
            ),
            (
                &["m", "--cached-input-price", "1000000000001"],
                "--cached-input-price",
                "out of range",
            ),
            (&["m", "--context-length", "0"], "--context-length", "0"),
            (
                &["m", "--context-length", "99999999"],
                "--context-length",
                "10485760",
            ),
            (&["m", "--context-length", "-1"], "--context-length", "-1"),
            (&["m", "--max-queue-wait", "2h"], "--max-queue-wait", "1h"),
            (&["m", "--max-queue-wait", "0s"], "--max-queue-wait", "1ms"),
            (&["m", "--backlog-cap", "0"], "--backlog-cap", "0"),
            (&["m", "--currency", "usd"], "--currency", "ISO 4217"),
            (&["", "--context-length", "1"], "NAME", "empty"),
        ];
        for (args, flag, why) in cases {
            let mut argv = args.to_vec();
            if !argv.contains(&"--context-length") {
                argv.extend(["--context-length", "2048"]);
            }
            for pair in PRICES.chunks(2) {
                if !argv.contains(&pair[0]) {
                    argv.extend(pair);
                }
            }
            let e = put(&argv).unwrap_err();
            assert!(e.contains(flag) && e.contains(why), "{args:?}: {e}");
        }
        let e = put(&["a b", "--context-length", "1"]).unwrap_err();
        assert!(e.contains("contains ' '"), "{e}");
    }

    #[test]
    fn put_needs_a_context_length_or_a_gguf_but_not_both() {
        let e = put(&PRICES).unwrap_err();
        assert!(e.contains("--context-length"), "{e}");
        let mut argv = vec!["m"];
        argv.extend(PRICES);
        assert!(put(&argv).unwrap_err().contains("--context-length"));
        argv.extend(["--context-length", "8", "--gguf", "x.gguf"]);
        assert!(put(&argv).unwrap_err().contains("cannot be used with"));
    }

    #[test]
    fn a_gguf_that_cannot_be_read_is_named() {
        let mut argv = vec!["m", "--gguf", "/nonexistent/m.gguf"];
        argv.extend(PRICES);
        let e = format!("{:#}", record(&put(&argv).unwrap()).unwrap_err());
        assert!(e.contains("--gguf /nonexistent/m.gguf"), "{e}");
    }

    #[test]
    fn database_and_prefix_may_follow_the_operation() {
        let mut argv = vec!["tidal", "--redis", "redis://h", "put", "m", "--database"];
        argv.extend(["sqlite:y.db", "--prefix", "p:", "--context-length", "8"]);
        argv.extend(PRICES);
        let args = Cli::try_parse_from(argv).unwrap().args;
        assert_eq!(args.database.as_deref(), Some("sqlite:y.db"));
        assert_eq!(args.key_prefix, "p:");
    }

    #[test]
    fn service_urls_are_checked() {
        let e = Cli::try_parse_from(["tidal", "--redis", "localhost:6379", "list"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--redis") && e.contains("not a Redis URL"),
            "{e}"
        );
        let e = Cli::try_parse_from(["tidal", "--redis", "redis://h", "--database", "x", "list"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--database") && e.contains("not a ledger URL"),
            "{e}"
        );
    }

    #[test]
    fn put_without_a_database_says_so() {
        let mut argv = vec!["tidal", "--redis", "redis://127.0.0.1:1", "put", "m"];
        argv.extend(["--context-length", "8"]);
        argv.extend(PRICES);
        let args = Cli::try_parse_from(argv).unwrap().args;
        // Checked before any connection: the Redis port above is closed.
        let e = run(ModelsArgs {
            database: None,
            ..args
        })
        .unwrap_err();
        assert!(e.to_string().contains("needs --database"), "{e}");
    }
}
