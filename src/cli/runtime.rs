//! `tidal runtime`: one model behind the direct OpenAI-compatible HTTP server.

use std::net::SocketAddr;

use std::future::IntoFuture;

use anyhow::Context;
use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_runtime::server::{router, LoadedModel, ServerState};

use super::engine_args::EngineArgs;

/// Flags of `tidal runtime`.
#[derive(Args, Debug)]
pub struct RuntimeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address of the HTTP server.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Name clients pass as `model` (default: the file name without `.gguf`).
    #[arg(long)]
    pub model_name: Option<String>,
}

/// Starts listening at once (health says 503 while loading), loads the model, then serves.
pub fn run(args: RuntimeArgs) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ])
        .context("configuring metrics")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let name = args.model_name.clone().unwrap_or_else(|| {
        args.engine
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let state = ServerState::new(name.clone(), Some(prometheus));
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(addr = %listener.local_addr()?, model = %name, "listening");
        let server = tokio::spawn(axum::serve(listener, router(state.clone())).into_future());
        let engine_args = args.engine.clone();
        let loaded = tokio::task::spawn_blocking(move || engine_args.load()).await??;
        state.set_loaded(LoadedModel {
            engine: loaded.engine,
            chat_template: loaded.chat_template,
        });
        server.await.context("server task")?.context("serving HTTP")
    })
}
