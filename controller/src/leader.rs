//! Leader election over a `coordination.k8s.io/v1` Lease, so two controller replicas can run
//! and only one reconciles.
//!
//! client-go's algorithm (`tools/leaderelection`), small enough to own: a candidate reads
//! the Lease; it may take it when it is free or when the holder's record has not changed for
//! `leaseDurationSeconds` *as observed on the candidate's own clock* (so clock skew between
//! nodes does not matter); it writes with the Lease's `resourceVersion`, so of two candidates
//! racing for the same version exactly one wins (the other gets 409 Conflict). The holder
//! renews every `retry_period`; one that cannot renew within `renew_deadline` steps down.
//! (kube-rs has no leader election; `kube-lease-manager` judges expiry by comparing the
//! holder's `renewTime` with the local wall clock, which clock skew breaks.)

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;

/// Lease timing (client-go's defaults: 15 s / 10 s / 2 s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This candidate's identity (pod name).
    pub identity: String,
    /// How long a holder's record stays valid without renewal.
    pub lease_duration: Duration,
    /// A holder that could not renew for this long steps down.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults for `name` in `namespace`.
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The part of a Lease that tells whether its holder is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<String>,
    duration_s: Option<i32>,
    transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.map(|t| t.0.to_string()),
            duration_s: spec.lease_duration_seconds,
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// Whether `identity` may write the lease: it holds it, it is free, or the holder's record
/// has not changed for the lease's duration since `observed_at` (pure; client-go's rule).
pub fn may_take(
    identity: &str,
    holder: Option<&str>,
    record_duration: Duration,
    observed_at: Instant,
    now: Instant,
) -> bool {
    match holder {
        None => true,
        Some(h) if h == identity => true,
        Some(_) => now.saturating_duration_since(observed_at) >= record_duration,
    }
}

/// One candidate.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: Option<(Record, Instant)>,
    last_renew: Option<Instant>,
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl LeaderElector {
    /// A candidate for `cfg`'s Lease.
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
            last_renew: None,
        }
    }

    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: acquire,
            renew_time: Some(now_micro()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Takes or renews the lease once; whether this candidate holds it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let Some(lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(Some(now_micro()), 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((Record::of(&created), now));
                    self.last_renew = Some(now);
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = Record::of(&lease);
        match &self.observed {
            Some((seen, _)) if *seen == record => {}
            _ => self.observed = Some((record.clone(), now)),
        }
        let observed_at = self.observed.as_ref().map(|(_, t)| *t).unwrap_or(now);
        let duration =
            Duration::from_secs(u64::try_from(record.duration_s.unwrap_or(0)).unwrap_or(0))
                .max(self.cfg.lease_duration);
        if !may_take(
            &self.cfg.identity,
            record.holder.as_deref(),
            duration,
            observed_at,
            now,
        ) {
            return Ok(false);
        }
        let ours = record.holder.as_deref() == Some(self.cfg.identity.as_str());
        let spec = if ours {
            let mut s = self.spec(None, record.transitions);
            s.acquire_time = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
            s
        } else {
            self.spec(Some(now_micro()), record.transitions + 1)
        };
        let mut updated = lease.clone();
        updated.spec = Some(spec);
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                if !ours {
                    tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "acquired leadership");
                }
                self.observed = Some((Record::of(&written), now));
                self.last_renew = Some(now);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown) so another replica takes over at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(());
        };
        if Record::of(&lease).holder.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now_micro());
        }
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Runs the election until `stop` fires, publishing whether this candidate leads.
    /// Leadership is lost when renewing fails for `renew_deadline`.
    pub async fn run(mut self, leading: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            let result = self.try_acquire_or_renew().await;
            let now = Instant::now();
            let was = *leading.borrow();
            let is = match result {
                Ok(true) => true,
                Ok(false) => false,
                Err(e) => {
                    tracing::warn!(error = %e, lease = %self.cfg.name, "lease update failed");
                    was && self
                        .last_renew
                        .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.renew_deadline)
                }
            };
            if was != is {
                if !is {
                    tracing::warn!(lease = %self.cfg.name, "lost leadership");
                }
                let _ = leading.send(is);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
                _ = stop.changed() => {
                    if *leading.borrow() {
                        if let Err(e) = self.release().await {
                            tracing::warn!(error = %e, "releasing the lease failed");
                        }
                        let _ = leading.send(false);
                    }
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_free_own_or_stale_leases_only() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        assert!(may_take("me", None, d, t0, t0));
        assert!(may_take("me", Some("me"), d, t0, t0));
        assert!(!may_take("me", Some("other"), d, t0, t0));
        assert!(!may_take(
            "me",
            Some("other"),
            d,
            t0,
            t0 + Duration::from_secs(14)
        ));
        assert!(may_take("me", Some("other"), d, t0, t0 + d));
    }
}
