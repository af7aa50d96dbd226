//! `tidal billing`: the metering consumer (usage stream → ledger) and the usage HTTP API.
//!
//! Reads the broker's usage stream as consumer `--consumer` of group `billing`, writes
//! batches to the ledger and acks after commit (`tidal_billing::consumer`); serves
//! `/v1/usage`, `/v1/invoices/{month}`, `/v1/admin/platform`, `/health` and `/metrics`.
//! On Ctrl-C or SIGTERM it stops reading, finishes and acks the batch in hand, drains the
//! HTTP server and exits.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::routing::get;
use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_billing::consumer::{self, ConsumerConfig};
use tidal_billing::queue_source::{redis_broker, QueueSource, QueueSourceConfig};
use tidal_billing::Ledger;
use tokio::sync::watch;

use super::signals::terminated;

/// Flags of `tidal billing`.
#[derive(Args, Debug)]
pub struct BillingArgs {
    /// Ledger database: `postgres://...` or `sqlite:PATH` (migrated at start).
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub database: String,
    /// Redis holding the usage stream.
    #[arg(long, env = "TIDAL_REDIS_URL")]
    pub redis: String,
    /// Key prefix of the broker's keys.
    #[arg(long, default_value = "tidal:")]
    pub key_prefix: String,
    /// Consumer name in the `billing` group (default: hostname-pid).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Address of the usage API, `/health` and `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Most usage events per ledger transaction.
    #[arg(long, default_value_t = 1000)]
    pub max_batch: usize,
    /// Seconds an event may stay pending with another consumer before it is taken over.
    #[arg(long, default_value_t = 30)]
    pub claim_timeout_secs: u64,
}

fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "billing".into());
    format!("{host}-{}", std::process::id())
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Runs the consumer and the API until a signal.
pub fn run(args: BillingArgs) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async move {
        let ledger = Ledger::connect(&args.database)
            .await
            .with_context(|| format!("opening ledger {}", args.database))?;
        let broker = redis_broker(&args.redis, &args.key_prefix)
            .await
            .with_context(|| format!("connecting to {}", args.redis))?;
        let name = args.consumer.clone().unwrap_or_else(default_consumer);
        let (stop_tx, stop_rx) = watch::channel(false);

        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(addr = %listener.local_addr()?, consumer = %name, "billing listening");
        let app = tidal_billing::http::router(ledger.clone()).route(
            "/metrics",
            get(move || {
                let h = prometheus.clone();
                async move { h.render() }
            }),
        );
        let mut server = tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped(stop_rx.clone()))
                .into_future(),
        );

        let source_cfg = QueueSourceConfig {
            claim_timeout: Duration::from_secs(args.claim_timeout_secs),
            ..QueueSourceConfig::new(name)
        };
        let consumer_cfg = ConsumerConfig {
            max_batch: args.max_batch,
            ..ConsumerConfig::default()
        };
        let l = ledger.clone();
        let mut metering = tokio::spawn(async move {
            let mut source = QueueSource::new(broker, source_cfg);
            consumer::run(&l, &mut source, &consumer_cfg, stopped(stop_rx)).await
        });

        // Whichever ends first (a signal, or either task on its own) stops both.
        let (mut metering_done, mut server_done) = (None, None);
        tokio::select! {
            _ = terminated() => tracing::info!("shutting down: finishing the batch in hand"),
            r = &mut metering => metering_done = Some(r),
            r = &mut server => server_done = Some(r),
        }
        let _ = stop_tx.send(true);
        let metering = match metering_done {
            Some(r) => r,
            None => metering.await,
        };
        let server = match server_done {
            Some(r) => r,
            None => server.await,
        };
        let stats = metering.context("consumer task")??;
        tracing::info!(?stats, "consumer stopped");
        server.context("server task")?.context("serving HTTP")?;
        ledger.close().await;
        anyhow::Ok(())
    })
}
