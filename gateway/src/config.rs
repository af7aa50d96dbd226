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
    /// most while the ledger is up; a budget that runs out admits requests this long.
    pub cache_ttl: Duration,
    /// While the ledger cannot be asked, a key (or a tenant's limits and budget state) is
    /// still used if its last successful check began less than this long ago; older ones get
    /// 503. Bounds how long a key revoked elsewhere just before an outage keeps working.
    /// A key the ledger refused once is never used again, whatever this is.
    pub max_stale: Duration,
    /// Longest wait for one ledger read on the request path (key, limits, budget); past it
    /// the read counts as failed. Also the ledger pool's acquire timeout in `tidal gateway`.
    pub ledger_timeout: Duration,
    /// After a failed ledger read, how long the request path skips the ledger and answers
    /// from the bounded caches before one request probes it again.
    pub breaker_open: Duration,
    /// Request bodies read at once (the rest wait for a turn): with the per-route caps,
    /// bounds the memory held by bodies. Bodies are read only after the caller is
    /// authenticated.
    pub body_reads: usize,
    /// Longest time to receive a request body (408 beyond), so slow senders cannot hold a
    /// turn to read forever.
    pub body_timeout: Duration,
    /// Longest single blocking read of a response stream (bounded so a lost connection is
    /// noticed; reads repeat).
    pub read_block: Duration,
    /// A started request with no response event for this long is cancelled and answered
    /// with 504 (every worker that could resume it is gone).
    pub idle_timeout: Duration,
    /// How long broker failures are retried while serving a request before giving up (503).
    pub broker_retry: Duration,
    /// How long a request's budget hold counts if this gateway never settles it (it died
    /// first): longer than any request runs.
    pub hold_ttl: Duration,
    /// How long the hold of a request stopped without a final usage (cancelled, failed
    /// mid-stream) keeps counting: its upper bound (the prompt's worst case and the tokens
    /// delivered) stays above the real cost, and its worker bills it within seconds.
    pub stopped_hold_ttl: Duration,
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
            max_stale: Duration::from_secs(60),
            ledger_timeout: Duration::from_secs(1),
            breaker_open: Duration::from_secs(5),
            body_reads: 64,
            body_timeout: Duration::from_secs(30),
            read_block: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            broker_retry: Duration::from_secs(30),
            hold_ttl: Duration::from_secs(3600),
            stopped_hold_ttl: Duration::from_secs(120),
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
            .field("max_stale", &self.max_stale)
            .field("ledger_timeout", &self.ledger_timeout)
            .field("breaker_open", &self.breaker_open)
            .field("body_reads", &self.body_reads)
            .field("body_timeout", &self.body_timeout)
            .field("read_block", &self.read_block)
            .field("idle_timeout", &self.idle_timeout)
            .field("broker_retry", &self.broker_retry)
            .field("hold_ttl", &self.hold_ttl)
            .field("stopped_hold_ttl", &self.stopped_hold_ttl)
            .field("prometheus", &self.prometheus.is_some())
            .field("clock", &self.clock)
            .finish()
    }
}
