//! The controller process: clients, leader election, caches, the kube-runtime `Controller`,
//! and the HTTP endpoints. Only the leader reconciles; a replica that loses the lease stops
//! reconciling and returns [`RunError::LostLeadership`] so its pod restarts as a candidate.
//! A replica that stops leading drops its per-Model series from `/metrics`: the new leader
//! reports them.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Client, Resource};
use thiserror::Error;
use tidal_autoscaler::schedule::TZ_DATABASE;
use tidal_billing::Ledger;
use tidal_crds::{Model, ModelPool};
use tidal_queue::{BrokerConfig, RedisBroker};
use tokio::sync::watch;

use crate::context::{system_clock, Context, Settings};
use crate::http::{router, Render};
use crate::leader::{LeaderElector, LeaseConfig};
use crate::model_metrics::ModelMetrics;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, MODEL_LABEL, POOL_LABEL};
use crate::pool_reconcile::{pool_error_policy, reconcile_pool};
use crate::reconcile::{error_policy, reconcile};
use crate::watch_mode;

/// Settings of `tidal controller`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Redis of the queue (the controller's connection).
    pub redis: String,
    /// Redis URL the workers get (`--queue`); defaults to `redis`.
    pub worker_redis: Option<String>,
    /// Broker key prefix.
    pub key_prefix: String,
    /// Ledger database URL.
    pub ledger: String,
    /// Watch only this namespace (default: all).
    pub namespace: Option<String>,
    /// Namespace of the election Lease (default: `namespace`, else the client's default).
    pub lease_namespace: Option<String>,
    /// Lease name.
    pub lease_name: String,
    /// This replica's identity (default: `POD_NAME`, else hostname-pid).
    pub identity: Option<String>,
    /// Address of `/health` and `/metrics`.
    pub metrics_listen: SocketAddr,
    /// Reconcile interval of each Model, and decision interval of each pool's worker count.
    pub tick: Duration,
    /// Placement interval of each ModelPool.
    pub pool_tick: Duration,
}

/// Why the controller stopped.
#[derive(Debug, Error)]
pub enum RunError {
    /// Kubernetes client setup failed.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    /// The queue could not be reached.
    #[error("queue: {0}")]
    Queue(#[from] tidal_queue::QueueError),
    /// The ledger could not be reached.
    #[error("ledger: {0}")]
    Ledger(#[from] tidal_billing::Error),
    /// The HTTP listener failed.
    #[error("http {addr}: {source}")]
    Http {
        /// Listen address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// Another replica took the lease.
    #[error("lost leadership of lease {0}")]
    LostLeadership(String),
}

fn default_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "tidal-controller".into());
            format!("{host}-{}", std::process::id())
        })
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Spawns a reflector that keeps `store` in sync; returns its reader.
fn cache<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::warn!(error = %e, "watch failed; retrying");
            }
        }
    });
    reader
}

async fn wait_until(rx: &mut watch::Receiver<bool>, want: bool) {
    while *rx.borrow_and_update() != want {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Runs the controller until `shutdown` resolves (Ok) or leadership is lost (Err).
pub async fn run(
    cfg: RunConfig,
    render: Render,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let client = Client::try_default().await?;
    let broker = RedisBroker::connect(
        &cfg.redis,
        BrokerConfig {
            prefix: cfg.key_prefix.clone(),
            ..BrokerConfig::default()
        },
    )
    .await?;
    let ledger = Ledger::connect(&cfg.ledger).await?;
    let identity = cfg.identity.clone().unwrap_or_else(default_identity);
    let lease_ns = cfg
        .lease_namespace
        .clone()
        .or_else(|| cfg.namespace.clone())
        .unwrap_or_else(|| client.default_namespace().to_string());

    let (leading_tx, mut leading) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let elector = LeaderElector::new(
        client.clone(),
        LeaseConfig::new(&cfg.lease_name, &lease_ns, &identity),
    );
    let election = tokio::spawn(elector.run(leading_tx, stop_rx));

    let listener = tokio::net::TcpListener::bind(cfg.metrics_listen)
        .await
        .map_err(|source| RunError::Http {
            addr: cfg.metrics_listen,
            source,
        })?;
    tracing::info!(addr = %cfg.metrics_listen, %identity, lease = %cfg.lease_name, tz_database = TZ_DATABASE, "controller listening; waiting for leadership");
    let model_metrics = Arc::new(ModelMetrics::new());
    let render = model_metrics.clone().appended_to(render);
    tokio::spawn(axum::serve(listener, router(leading.clone(), render)).into_future());

    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    tokio::select! {
        _ = wait_until(&mut leading, true) => {}
        _ = shutdown.clone() => {
            let _ = stop_tx.send(true);
            let _ = election.await;
            return Ok(());
        }
    }
    tracing::info!("leading: starting the reconciler");

    let ns = cfg.namespace.as_deref();
    let models: Api<Model> = api(&client, ns);
    let streaming = watch_mode::supports_streaming_lists(&models).await;
    let wc = watch_mode::config(streaming);
    let pods = cache::<Pod>(api(&client, ns), wc.clone().labels(MODEL_LABEL));
    let nodes = cache::<Node>(Api::all(client.clone()), wc.clone());
    let owned = wc
        .clone()
        .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let deployments = cache::<Deployment>(api(&client, ns), owned.clone());
    let mut ctx = Context::new(
        client.clone(),
        Arc::new(broker),
        ledger,
        pods,
        nodes,
        deployments,
        Settings {
            tick: cfg.tick,
            pool_tick: cfg.pool_tick,
            worker: crate::deployment::WorkerConfig {
                queue_url: cfg
                    .worker_redis
                    .clone()
                    .unwrap_or_else(|| cfg.redis.clone()),
                key_prefix: (cfg.key_prefix != tidal_queue::keys::DEFAULT_PREFIX)
                    .then(|| cfg.key_prefix.clone()),
            },
            consumer: format!("tidal-controller-{identity}"),
            delete_grace: Duration::from_secs(30),
        },
        system_clock(),
    );
    ctx.model_metrics = model_metrics.clone();
    ctx.pools = cache::<ModelPool>(api(&client, ns), wc.clone());
    ctx.pool_pods = cache::<Pod>(api(&client, ns), wc.clone().labels(POOL_LABEL));
    ctx.models = cache::<Model>(api(&client, ns), wc.clone());
    let ctx = Arc::new(ctx);

    let mut lost = leading.clone();
    let (ctl_stop_tx, ctl_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = Controller::new(models, wc.clone())
        .owns(api::<Deployment>(&client, ns), owned.clone())
        .graceful_shutdown_on(async move {
            let _ = ctl_stop_rx.await;
        })
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(model = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        });
    // A pool's pods download its Models: a Model joining, leaving or changing its source
    // reconciles the pool it names.
    let (pool_stop_tx, pool_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pools = Controller::new(api::<ModelPool>(&client, ns), wc.clone())
        .owns(api::<Deployment>(&client, ns), owned.clone())
        .watches(api::<Model>(&client, ns), wc.clone(), |m: Model| {
            let ns = m.metadata.namespace.clone()?;
            Some(ObjectRef::<ModelPool>::new(m.spec.pool.as_deref()?).within(&ns))
        })
        .graceful_shutdown_on(async move {
            let _ = pool_stop_rx.await;
        })
        .run(reconcile_pool, pool_error_policy, ctx.clone())
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(pool = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "pool reconcile error"),
            }
        });
    let controller = futures::future::join(controller, pools);
    let mut controller = Box::pin(controller);
    let outcome = tokio::select! {
        _ = &mut controller => Ok(()),
        _ = wait_until(&mut lost, false) => Err(RunError::LostLeadership(cfg.lease_name.clone())),
        _ = shutdown => Ok(()),
    };
    let _ = ctl_stop_tx.send(());
    let _ = pool_stop_tx.send(());
    if outcome.is_ok() {
        // finish in-flight reconciles before giving the lease up
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut controller).await;
    }
    // no reconcile records anything after this
    drop(controller);
    model_metrics.clear();
    let _ = stop_tx.send(true);
    let _ = election.await;
    outcome
}
