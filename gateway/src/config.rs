//! Settings of a [`crate::Gateway`].

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tidal_queue::{Clock, SystemClock};

/// How a gateway behaves; `Default` is what `tidal gateway` uses without flags.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Bearer token of the admin API (`/v1/admin/...`); `None` disables that API (403).
    pub admin_token: Option<String>,
    /// How long an authenticated key, a tenant's limits and budget state, and a model's
    /// record (max queue wait, backlog cap) are reused before the ledger or broker is asked
    /// again. A key revoked through another replica or the CLI keeps working this long at
    /// most; a budget that runs out admits requests this long.
    pub cache_ttl: Duration,
    /// Longest single blocking read of a response stream (bounded so a lost connection is
    /// noticed; reads repeat).
    pub read_block: Duration,
    /// A started request with no response event for this long is cancelled and answered
    /// with 504 (every worker that could resume it is gone).
    pub idle_timeout: Duration,
    /// How long broker failures are retried while serving a request before giving up (503).
    pub broker_retry: Duration,
    /// Renders `/metrics`; `None` answers 404 there.
    pub prometheus: Option<PrometheusHandle>,
    /// Source of wall-clock time (deadlines, rate-limit windows).
    pub clock: Arc<dyn Clock>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            admin_token: None,
            cache_ttl: Duration::from_secs(2),
            read_block: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            broker_retry: Duration::from_secs(30),
            prometheus: None,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("cache_ttl", &self.cache_ttl)
            .field("read_block", &self.read_block)
            .field("idle_timeout", &self.idle_timeout)
            .field("broker_retry", &self.broker_retry)
            .field("prometheus", &self.prometheus.is_some())
            .field("clock", &self.clock)
            .finish()
    }
}
