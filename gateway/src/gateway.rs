//! The [`Gateway`]: shared state of every route, built from a broker, a ledger and a rate
//! limiter, so `tidal gateway` (Redis, Postgres) and `tidal up` (in process, SQLite) differ
//! only in what they pass in.

use std::sync::Arc;

use axum::Router;
use tidal_billing::ledger::RateLimits;
use tidal_billing::{Ledger, Principal};
use tidal_queue::{Broker, ModelRecord};
use tokio::sync::watch;

use crate::breaker::{guard, Breaker, LedgerFault};
use crate::cache::{KeyCache, TtlCache};
use crate::config::GatewayConfig;
use crate::error::Reject;
use crate::limits::RateLimiter;

/// What the gateway knows about a tenant for admission, cached for `cache_ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub limits: RateLimits,
    pub budget_exhausted: bool,
    /// Whether the tenant has a budget: its requests then hold their worst case.
    pub has_budget: bool,
}

/// State shared by all routes and in-flight requests.
pub(crate) struct Shared {
    pub broker: Arc<dyn Broker>,
    pub ledger: Ledger,
    pub limiter: Arc<dyn RateLimiter>,
    pub config: GatewayConfig,
    /// Verified keys by SHA-256 of the presented secret.
    pub keys: KeyCache,
    /// Tenant policies by tenant id.
    pub policies: TtlCache<String, Policy>,
    /// Model records by id (only models that exist: an unknown one is asked for each time).
    pub models: TtlCache<String, ModelRecord>,
    /// Skips the ledger on the request path while it is failing ([`crate::breaker`]).
    pub breaker: Breaker,
    /// Turns to read a request body ([`GatewayConfig::body_reads`]).
    pub body_reads: tokio::sync::Semaphore,
    /// Set when the process is stopping: requests still in flight are left running (their
    /// clients reattach through another replica) instead of being cancelled, and those still
    /// waiting for their first event are answered at once with their request id.
    pub detached: watch::Sender<bool>,
}

impl Shared {
    /// Now, in ms since the epoch, from the configured clock.
    pub fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    /// Now, from the configured clock.
    pub fn now_utc(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(self.now_ms() as i64)
            .unwrap_or_else(chrono::Utc::now)
    }

    /// The tenant's limits and budget state (cached; while the ledger cannot be asked, an
    /// entry younger than `max_stale` is used, else 503).
    pub async fn policy(&self, principal: &Principal) -> Result<Policy, Reject> {
        let tenant = &principal.tenant;
        if let Some(p) = self.policies.fresh(tenant) {
            return Ok(p);
        }
        let now = self.now_utc();
        let fetched = self
            .ask_ledger(async {
                let limits = self.ledger.rate_limits(tenant).await?;
                let budget = self.ledger.budget_status(principal, tenant, now).await?;
                Ok::<_, tidal_billing::Error>(Policy {
                    limits,
                    budget_exhausted: budget.exhausted,
                    has_budget: budget.budget_micros.is_some(),
                })
            })
            .await;
        match fetched {
            Ok(p) => {
                self.policies.put(tenant.clone(), p);
                Ok(p)
            }
            Err(LedgerFault::Unavailable) => self
                .policies
                .stale(tenant)
                .ok_or_else(crate::error::ledger_unavailable),
            Err(LedgerFault::Failed(e)) => Err(e.into()),
        }
    }

    /// Runs a ledger read of the request path through the breaker, within `ledger_timeout`.
    pub async fn ask_ledger<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, tidal_billing::Error>>,
    ) -> Result<T, LedgerFault> {
        guard(&self.breaker, self.config.ledger_timeout, read).await
    }

    /// Whether in-flight requests should be left running when their client goes away.
    pub fn is_detached(&self) -> bool {
        *self.detached.borrow()
    }

    /// Resolves when the process starts stopping ([`Gateway::detach_in_flight`]).
    pub async fn detaching(&self) {
        let mut rx = self.detached.subscribe();
        // The sender lives as long as `self`: an error cannot happen while we are borrowed.
        let _ = rx.wait_for(|d| *d).await;
    }
}

/// The public API: cheap to clone, one per process (or several sharing a broker).
#[derive(Clone)]
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `broker` (jobs, responses, request owners, model records), `ledger`
    /// (keys, budgets, limits) and `limiter` (rate-limit counters).
    pub fn new(
        broker: Arc<dyn Broker>,
        ledger: Ledger,
        limiter: Arc<dyn RateLimiter>,
        config: GatewayConfig,
    ) -> Self {
        let (ttl, max_stale) = (config.cache_ttl, config.max_stale);
        let breaker = Breaker::new(config.breaker_open);
        let body_reads = tokio::sync::Semaphore::new(config.body_reads.max(1));
        Gateway {
            shared: Arc::new(Shared {
                broker,
                ledger,
                limiter,
                config,
                keys: KeyCache::new(ttl, max_stale),
                policies: TtlCache::new(ttl, max_stale),
                // Model records come from the broker: no fallback past their ttl.
                models: TtlCache::new(ttl, ttl),
                breaker,
                body_reads,
                detached: watch::Sender::new(false),
            }),
        }
    }

    /// Every route (see [`crate::route_table`]), with request ids and tracing spans.
    pub fn router(&self) -> Router {
        crate::routes::router(self.shared.clone())
    }

    /// The admin API's token check, for routes a host process adds beside the gateway's own
    /// (e.g. `tidal up`'s status): 403 when no admin token is configured, 401 when it is
    /// missing or wrong.
    pub fn authorize_admin(&self, headers: &axum::http::HeaderMap) -> Result<(), Reject> {
        crate::auth::admin(&self.shared, headers)
    }

    /// Call when the process is about to stop: from now on, a request whose connection is
    /// dropped is left running instead of cancelled, so its client can reattach
    /// (`GET /v1/requests/{id}/events`) through another replica or after the restart. A
    /// request still waiting for its first event (queued: its client has no byte yet, not
    /// even its id) is answered at once, with its id: see [`crate::respond`].
    pub fn detach_in_flight(&self) {
        self.shared.detached.send_replace(true);
    }
}
