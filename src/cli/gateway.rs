//! `tidal gateway`: the public API over Redis (broker and rate-limit counters) and the ledger
//! (keys, budgets, limits, request owners). On Ctrl-C or SIGTERM it stops accepting, leaves
//! requests still in flight running (their clients reattach through another replica or after
//! the restart) and exits once connections close or `--drain-timeout` passes.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_billing::ledger::LedgerOptions;
use tidal_billing::Ledger;
use tidal_gateway::{Gateway, GatewayConfig, RedisLimiter};
use tidal_queue::{Broker, BrokerConfig, RedisBroker};

use super::signals::terminated;

/// Flags of `tidal gateway`.
#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Address of the API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Redis holding the queue and the rate-limit counters.
    #[arg(long, env = "TIDAL_REDIS_URL")]
    pub redis: String,
    /// Ledger database: `postgres://...` or `sqlite:PATH` (migrated at start).
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub database: String,
    /// Key prefix of the broker's and the limiter's keys.
    #[arg(long, default_value = "tidal:")]
    pub key_prefix: String,
    /// Bearer token of the admin API; without it the admin API answers 403.
    #[arg(long, env = "TIDAL_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Milliseconds a verified key and a tenant's limits/budget state are reused.
    #[arg(long, default_value_t = 2000)]
    pub cache_ttl_ms: u64,
    /// While the ledger cannot be asked: milliseconds after its last successful check that
    /// a key (or a tenant's limits/budget state) is still used; older ones get 503.
    #[arg(long, default_value_t = 60_000)]
    pub max_stale_ms: u64,
    /// Longest wait for a ledger read on the request path, and for a pooled connection.
    #[arg(long, default_value_t = 1000)]
    pub ledger_timeout_ms: u64,
    /// After a failed ledger read, milliseconds requests skip the ledger (answering from the
    /// bounded cache) before one probes it again.
    #[arg(long, default_value_t = 5000)]
    pub breaker_open_ms: u64,
    /// Seconds a started request may go without a response event before it gets 504.
    #[arg(long, default_value_t = 300)]
    pub idle_timeout_secs: u64,
    /// Seconds to wait for open connections after a stop signal.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_secs: u64,
}

/// Serves until a signal.
pub fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 120.0,
        ])
        .context("configuring metrics")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async move {
        let ledger_timeout = Duration::from_millis(args.ledger_timeout_ms);
        // A short acquire timeout: while PostgreSQL is down, a read fails in this time
        // instead of sqlx's default, and the gateway's cache answers.
        let ledger_opts = LedgerOptions {
            acquire_timeout: ledger_timeout,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::connect_with(&args.database, &ledger_opts)
            .await
            .with_context(|| format!("opening ledger {}", args.database))?;
        let broker_cfg = BrokerConfig {
            prefix: args.key_prefix.clone(),
            ..BrokerConfig::default()
        };
        let broker: Arc<dyn Broker> = Arc::new(
            RedisBroker::connect(&args.redis, broker_cfg)
                .await
                .with_context(|| format!("connecting to {}", args.redis))?,
        );
        let limiter = Arc::new(
            RedisLimiter::connect(&args.redis, &args.key_prefix)
                .await
                .with_context(|| format!("connecting the rate limiter to {}", args.redis))?,
        );
        let config = GatewayConfig {
            admin_token: args.admin_token.clone().filter(|t| !t.is_empty()),
            cache_ttl: Duration::from_millis(args.cache_ttl_ms),
            max_stale: Duration::from_millis(args.max_stale_ms),
            ledger_timeout,
            breaker_open: Duration::from_millis(args.breaker_open_ms),
            idle_timeout: Duration::from_secs(args.idle_timeout_secs),
            prometheus: Some(prometheus),
            ..GatewayConfig::default()
        };
        let gateway = Gateway::new(broker, ledger.clone(), limiter, config);
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "gateway listening");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut server = tokio::spawn(
            axum::serve(listener, gateway.router())
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .into_future(),
        );
        tokio::select! {
            r = &mut server => {
                return r.context("server task")?.context("serving HTTP");
            }
            _ = terminated() => {}
        }
        tracing::info!("stopping: in-flight requests are left running for reattachment");
        gateway.detach_in_flight();
        let _ = stop_tx.send(());
        let drain = Duration::from_secs(args.drain_timeout_secs);
        match tokio::time::timeout(drain, &mut server).await {
            Ok(r) => r.context("server task")?.context("serving HTTP")?,
            Err(_) => {
                tracing::warn!("drain timeout: closing remaining connections");
                server.abort();
            }
        }
        ledger.close().await;
        anyhow::Ok(())
    })
}
