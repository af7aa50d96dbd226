//! A circuit breaker in front of the ledger, so that an outage costs a request milliseconds
//! (the bounded caches answer) instead of the ledger's timeout.
//!
//! Closed: every read goes to the ledger. A transient failure (database error or a read over
//! `ledger_timeout`) opens it: for `breaker_open`, reads are skipped and callers fall back to
//! their bounded stale entries. Then it is half-open: one read goes through as a probe;
//! success closes it, failure opens it again. A probe that never reports (its request was
//! dropped) is replaced by another after `breaker_open`.
//!
//! The state machine takes `now` from its caller, so it is tested without a clock.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Where the breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Reads go to the ledger.
    Closed,
    /// Reads are skipped until `until`.
    Open { until: Instant },
    /// One probe is out; others are skipped until it reports or `until` passes.
    HalfOpen { until: Instant },
}

/// The ledger's breaker (one per gateway).
#[derive(Debug)]
pub(crate) struct Breaker {
    open_for: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// A closed breaker that stays open for `open_for` after each failure.
    pub fn new(open_for: Duration) -> Self {
        Breaker {
            open_for,
            state: Mutex::new(State::Closed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain value written whole: a poisoned lock still holds a valid one.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current state.
    #[cfg(test)]
    pub fn state(&self) -> State {
        *self.lock()
    }

    /// Whether a read may go to the ledger at `now`. Past the open period, the first caller
    /// becomes the half-open probe and later ones are refused until it reports.
    pub fn allow(&self, now: Instant) -> bool {
        let mut s = self.lock();
        match *s {
            State::Closed => true,
            State::Open { until } | State::HalfOpen { until } if now >= until => {
                *s = State::HalfOpen {
                    until: now + self.open_for,
                };
                true
            }
            State::Open { .. } | State::HalfOpen { .. } => false,
        }
    }

    /// The ledger answered: close.
    pub fn succeeded(&self) {
        let mut s = self.lock();
        if *s != State::Closed {
            tracing::info!("ledger reachable again; breaker closed");
        }
        *s = State::Closed;
    }

    /// The ledger failed transiently at `now`: open for the open period.
    pub fn failed(&self, now: Instant) {
        let mut s = self.lock();
        if *s == State::Closed {
            tracing::warn!(
                open_ms = self.open_for.as_millis() as u64,
                "ledger unavailable; breaker open, answering from cache"
            );
        }
        *s = State::Open {
            until: now + self.open_for,
        };
    }
}

/// Why a guarded ledger read gave no answer.
#[derive(Debug)]
pub(crate) enum LedgerFault {
    /// The ledger cannot be asked now (breaker open, a transient error, or no answer within
    /// the timeout): callers use their bounded cache or answer 503.
    Unavailable,
    /// The ledger answered with an error (not found, invalid, corrupt data).
    Failed(tidal_billing::Error),
}

/// Runs the ledger read `read` through `breaker`, giving it at most `timeout`.
pub(crate) async fn guard<T>(
    breaker: &Breaker,
    timeout: Duration,
    read: impl Future<Output = Result<T, tidal_billing::Error>>,
) -> Result<T, LedgerFault> {
    if !breaker.allow(Instant::now()) {
        return Err(LedgerFault::Unavailable);
    }
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(v)) => {
            breaker.succeeded();
            Ok(v)
        }
        Ok(Err(e)) if e.is_transient() => {
            tracing::warn!(error = %e, "ledger read failed");
            breaker.failed(Instant::now());
            Err(LedgerFault::Unavailable)
        }
        Ok(Err(e)) => {
            // An answer, even a refusal, shows the ledger is reachable.
            breaker.succeeded();
            Err(LedgerFault::Failed(e))
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "ledger read timed out"
            );
            breaker.failed(Instant::now());
            Err(LedgerFault::Unavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    const OPEN: Duration = Duration::from_secs(5);

    #[test]
    fn opens_on_failure_then_lets_one_probe_through() {
        let b = Breaker::new(OPEN);
        let t0 = Instant::now();
        assert!(b.allow(t0));
        b.failed(t0);
        assert_eq!(b.state(), State::Open { until: t0 + OPEN });
        assert!(!b.allow(t0));
        assert!(!b.allow(t0 + OPEN - Duration::from_millis(1)));
        // Half-open: the first caller probes, the next ones wait for it.
        assert!(b.allow(t0 + OPEN));
        assert!(matches!(b.state(), State::HalfOpen { .. }));
        assert!(!b.allow(t0 + OPEN));
        assert!(!b.allow(t0 + OPEN + Duration::from_secs(1)));
        b.succeeded();
        assert_eq!(b.state(), State::Closed);
        assert!(b.allow(t0 + OPEN));
        assert!(b.allow(t0 + OPEN));
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let b = Breaker::new(OPEN);
        let t0 = Instant::now();
        b.failed(t0);
        let t1 = t0 + OPEN;
        assert!(b.allow(t1));
        b.failed(t1);
        assert_eq!(b.state(), State::Open { until: t1 + OPEN });
        assert!(!b.allow(t1 + OPEN - Duration::from_millis(1)));
        assert!(b.allow(t1 + OPEN));
    }

    #[test]
    fn a_lost_probe_is_replaced_after_the_open_period() {
        let b = Breaker::new(OPEN);
        let t0 = Instant::now();
        b.failed(t0);
        assert!(b.allow(t0 + OPEN), "probe");
        // The probe's request was dropped: it never reports.
        assert!(!b.allow(t0 + OPEN * 2 - Duration::from_millis(1)));
        assert!(b.allow(t0 + OPEN * 2), "another probe");
    }

    #[tokio::test(start_paused = true)]
    async fn guard_skips_the_ledger_while_open() {
        let b = Breaker::new(OPEN);
        let timeout = Duration::from_secs(1);
        // A read that hangs counts as a failure after the timeout.
        let r = guard(&b, timeout, std::future::pending::<Result<(), _>>()).await;
        assert!(matches!(r, Err(LedgerFault::Unavailable)));
        assert!(matches!(b.state(), State::Open { .. }));
        // Open: the read is not even started.
        let started = AtomicBool::new(false);
        let r = guard(&b, timeout, async {
            started.store(true, Ordering::SeqCst);
            Ok(1)
        })
        .await;
        assert!(matches!(r, Err(LedgerFault::Unavailable)));
        assert!(!started.load(Ordering::SeqCst));
        tokio::time::advance(OPEN).await;
        assert_eq!(guard(&b, timeout, async { Ok(2) }).await.ok(), Some(2));
        assert_eq!(b.state(), State::Closed);
        // A refusal is an answer: it keeps the breaker closed and passes through.
        let r = guard(&b, timeout, async {
            Err::<(), _>(tidal_billing::Error::NotFound("x".into()))
        })
        .await;
        assert!(matches!(
            r,
            Err(LedgerFault::Failed(tidal_billing::Error::NotFound(_)))
        ));
        assert_eq!(b.state(), State::Closed);
    }
}
