//! `tidal controller`: the Kubernetes controller (one leader among its replicas reconciles
//! every `Model`; see `tidal_controller`). Exits non-zero when it loses leadership so its
//! pod restarts as a candidate; exits 0 on Ctrl-C or SIGTERM after giving the lease up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_controller::RunConfig;

use super::signals::terminated;

/// Flags of `tidal controller`.
#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Redis of the queue.
    #[arg(long, env = "TIDAL_REDIS_URL")]
    pub redis: String,
    /// Redis URL the workers are given (`--queue`), when it differs from `--redis`.
    #[arg(long, env = "TIDAL_WORKER_REDIS_URL")]
    pub worker_redis: Option<String>,
    /// Ledger database: `postgres://...` or `sqlite:PATH` (migrated at start).
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub ledger: String,
    /// Key prefix of the broker's keys.
    #[arg(long, default_value = "tidal:")]
    pub key_prefix: String,
    /// Watch Models in this namespace only (default: all namespaces).
    #[arg(long, env = "TIDAL_NAMESPACE")]
    pub namespace: Option<String>,
    /// Namespace of the leader-election Lease (default: --namespace, else the client's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "tidal-controller")]
    pub lease_name: String,
    /// Address of `/health` and `/metrics`.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Seconds between two autoscaling decisions of a Model.
    #[arg(long, default_value_t = 2.0)]
    pub tick_secs: f64,
    /// Seconds between two placements of a ModelPool's models: a model with queued work and
    /// no worker holding it waits up to this long before one is told to load it (the pool's
    /// worker count is still decided every --tick-secs).
    #[arg(long, default_value_t = 0.25)]
    pub pool_tick_secs: f64,
}

/// Runs the controller.
pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let tick = Duration::try_from_secs_f64(args.tick_secs)
        .ok()
        .filter(|t| !t.is_zero())
        .context("--tick-secs must be a positive number of seconds")?;
    let pool_tick = Duration::try_from_secs_f64(args.pool_tick_secs)
        .ok()
        .filter(|t| !t.is_zero())
        .context("--pool-tick-secs must be a positive number of seconds")?;
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let render: tidal_controller::http::Render = Arc::new(move || prometheus.render());
    let cfg = RunConfig {
        redis: args.redis,
        worker_redis: args.worker_redis,
        key_prefix: args.key_prefix,
        ledger: args.ledger,
        namespace: args.namespace,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity: None,
        metrics_listen: args.metrics_listen,
        tick,
        pool_tick,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime
        .block_on(tidal_controller::run(cfg, render, terminated()))
        .context("tidal controller")
}
