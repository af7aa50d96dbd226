//! Settings of a queue worker (the `tidal runtime --queue` flags) and their checks.

use std::num::NonZeroUsize;
use std::time::Duration;

use tidal_queue::CapacityType;

use super::cache_scope::SharedPrefix;

/// Why a worker cannot start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A setting is out of range.
    #[error("invalid worker setting: {0}")]
    Config(String),
}

/// How much prefill work a worker lets itself hold before it leaves new jobs in the queue
/// for other workers ([`super::capacity::budget_tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimBudget {
    /// Claim whenever slots and KV blocks allow.
    Off,
    /// Claim only while the prompt tokens queued for prefill stay under this many.
    Tokens(NonZeroUsize),
    /// Claim only while the queued prefill takes less than this at the engine's measured
    /// prefill rate (one job at a time until the engine has measured it).
    Prefill(Duration),
}

/// The default budget: one second of the engine's own prefill (a time, because a token
/// count depends on the model and the hardware). In the trace simulator it kept SLO
/// attainment higher than greedy claims on every run (docs/autoscaling.md); on the runtime
/// see docs/benchmarks.md, "A burst and a scale-up".
pub const DEFAULT_CLAIM_BUDGET: ClaimBudget = ClaimBudget::Prefill(Duration::from_secs(1));

impl Default for ClaimBudget {
    fn default() -> Self {
        DEFAULT_CLAIM_BUDGET
    }
}

/// In reports (`tidal bench scale-up`), as its words: `greedy`, `N prompt tokens`,
/// `1s of prefill`.
impl serde::Serialize for ClaimBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for ClaimBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimBudget::Off => write!(f, "greedy"),
            ClaimBudget::Tokens(n) => write!(f, "{n} prompt tokens"),
            ClaimBudget::Prefill(d) => write!(f, "{d:?} of prefill"),
        }
    }
}

/// How a worker pulls from its model's queue. Build with [`WorkerConfig::new`] and adjust
/// the public fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The model id whose jobs stream this worker serves.
    pub model_id: String,
    /// This worker's consumer name (unique among the model's workers: the pod name).
    pub name: String,
    /// Capacity it runs on (reported in heartbeats and usage events).
    pub capacity_type: CapacityType,
    /// After shutdown is asked for, how long running sequences may take to finish before
    /// the rest are re-enqueued.
    pub drain_timeout: Duration,
    /// A job whose holder has not renewed it for this long is taken over by another worker
    /// (the backstop for holders that never wrote a heartbeat; others are found dead by
    /// their heartbeats much sooner). The same value must be used by every worker of a model.
    pub claim_timeout: Duration,
    /// How often the worker writes its heartbeat.
    pub heartbeat_interval: Duration,
    /// Heartbeats a worker may miss before the others presume it dead and take its jobs
    /// over ([`WorkerConfig::dead_after`]). The same value must be used by every worker of a
    /// model, and their clocks must agree to well within the resulting time (a worker taken
    /// for dead too early loses its jobs at its next write, costing a re-prefill, never a
    /// duplicate).
    pub missed_heartbeats: u32,
    /// How often held jobs are renewed ([`tidal_queue::Broker::keep_alive`]); `None`: a
    /// quarter of `claim_timeout`.
    pub keep_alive_interval: Option<Duration>,
    /// How often the worker looks for jobs of workers whose heartbeats stopped; `None`: the
    /// heartbeat interval. (Jobs idle past the claim timeout are looked for every quarter of
    /// it.)
    pub takeover_interval: Option<Duration>,
    /// How long a job retries a broker call that fails for a transient reason (Redis
    /// unreachable or restarting) before it gives the job up to a takeover; generation goes
    /// on meanwhile and its tokens go out together once the broker answers. `None`: the claim
    /// timeout, after which another worker would take the job over anyway.
    pub broker_retry: Option<Duration>,
    /// How often the cancel flags of all running jobs are read (one round trip for all).
    pub cancel_poll_interval: Duration,
    /// Longest one claim waits for a job (shutdown is noticed between claims).
    pub claim_block: Duration,
    /// Most jobs held at once; `None`: the engine's `max_num_seqs`.
    pub max_jobs: Option<usize>,
    /// KV-cache tokens set aside per claimed job when judging free capacity: a job is
    /// claimed only while the free blocks cover this much for it and every held job that
    /// the engine has not admitted yet.
    pub kv_tokens_per_job: usize,
    /// How much queued prefill stops claims ([`super::capacity::claimable`]); default one
    /// second of the engine's measured prefill.
    pub claim_budget: ClaimBudget,
    /// Public prompt prefixes whose prefix-cache blocks every tenant shares (default none:
    /// each tenant's prompts are cached apart from every other's; see
    /// [`super::SharedPrefix`]).
    pub shared_prefixes: Vec<SharedPrefix>,
}

impl WorkerConfig {
    /// Defaults: on-demand capacity, 30 s drain and claim timeouts, heartbeats every second
    /// and presumed dead after 3 missed, broker calls retried for the claim timeout, cancel
    /// flags read every 100 ms, claims blocking 500 ms, 256 KV tokens per job, claims under
    /// one second of measured prefill ([`DEFAULT_CLAIM_BUDGET`]).
    pub fn new(model_id: impl Into<String>, name: impl Into<String>) -> Self {
        WorkerConfig {
            model_id: model_id.into(),
            name: name.into(),
            capacity_type: CapacityType::OnDemand,
            drain_timeout: Duration::from_secs(30),
            claim_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(1),
            missed_heartbeats: 3,
            keep_alive_interval: None,
            takeover_interval: None,
            broker_retry: None,
            cancel_poll_interval: Duration::from_millis(100),
            claim_block: Duration::from_millis(500),
            max_jobs: None,
            kv_tokens_per_job: 256,
            claim_budget: DEFAULT_CLAIM_BUDGET,
            shared_prefixes: Vec::new(),
        }
    }

    /// The keep-alive period in force.
    pub fn keep_alive_every(&self) -> Duration {
        self.keep_alive_interval.unwrap_or(self.claim_timeout / 4)
    }

    /// The period of the scan for jobs of workers whose heartbeats stopped.
    pub fn takeover_every(&self) -> Duration {
        self.takeover_interval.unwrap_or(self.heartbeat_interval)
    }

    /// The period of the scan for jobs idle past the claim timeout.
    pub fn idle_takeover_every(&self) -> Duration {
        self.claim_timeout / 4
    }

    /// How old a worker's last heartbeat must be for it to be presumed dead.
    pub fn dead_after(&self) -> Duration {
        self.heartbeat_interval
            .saturating_mul(self.missed_heartbeats)
    }

    /// How long a job retries a failing broker call.
    pub fn broker_retry_for(&self) -> Duration {
        self.broker_retry.unwrap_or(self.claim_timeout)
    }

    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |m: String| Err(WorkerError::Config(m));
        if self.model_id.is_empty() || self.name.is_empty() {
            return bad("model id and worker name must not be empty".into());
        }
        if self.claim_timeout.is_zero() {
            return bad("the claim timeout must be positive".into());
        }
        let keep_alive = self.keep_alive_every();
        if keep_alive.is_zero() || keep_alive * 2 > self.claim_timeout {
            return bad(format!(
                "the keep-alive interval ({keep_alive:?}) must be positive and at most half the claim timeout ({:?})",
                self.claim_timeout
            ));
        }
        for (name, d) in [
            ("heartbeat interval", self.heartbeat_interval),
            ("takeover interval", self.takeover_every()),
            ("cancel poll interval", self.cancel_poll_interval),
            ("claim block", self.claim_block),
        ] {
            if d.is_zero() {
                return bad(format!("the {name} must be positive"));
            }
        }
        if self.missed_heartbeats < 2 {
            // one late heartbeat is ordinary scheduling jitter, not a death
            return bad("missed heartbeats must be at least 2".into());
        }
        if self.max_jobs == Some(0) {
            return bad("max jobs must be at least 1".into());
        }
        if self.kv_tokens_per_job == 0 {
            return bad("KV tokens per job must be at least 1".into());
        }
        if self.claim_budget == ClaimBudget::Prefill(Duration::ZERO) {
            // Zero seconds would still claim one job at a time; "no budget" is `Off`.
            return bad(
                "a claim prefill budget of zero seconds: use ClaimBudget::Off for none".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_derive_intervals_from_the_claim_timeout() {
        let c = WorkerConfig::new("m", "w");
        c.validate().unwrap();
        assert_eq!(c.claim_budget, ClaimBudget::Prefill(Duration::from_secs(1)));
        // reports show the rule in words
        let words = |b: ClaimBudget| serde_json::to_value(b).unwrap();
        assert_eq!(words(c.claim_budget), "1s of prefill");
        assert_eq!(words(ClaimBudget::Off), "greedy");
        assert_eq!(
            words(ClaimBudget::Tokens(NonZeroUsize::new(1469).unwrap())),
            "1469 prompt tokens"
        );
        for budget in [
            ClaimBudget::Off,
            ClaimBudget::Prefill(Duration::from_millis(1)),
        ] {
            WorkerConfig {
                claim_budget: budget,
                ..c.clone()
            }
            .validate()
            .unwrap();
        }
        assert_eq!(c.keep_alive_every(), Duration::from_millis(7500));
        assert_eq!(c.takeover_every(), Duration::from_secs(1));
        assert_eq!(c.idle_takeover_every(), Duration::from_millis(7500));
        assert_eq!(c.dead_after(), Duration::from_secs(3));
        assert_eq!(c.broker_retry_for(), Duration::from_secs(30));
        let mut short = c.clone();
        short.claim_timeout = Duration::from_secs(2);
        short.validate().unwrap();
        assert_eq!(short.keep_alive_every(), Duration::from_millis(500));
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let base = WorkerConfig::new("m", "w");
        let mut cases = Vec::new();
        let mut c = base.clone();
        c.keep_alive_interval = Some(Duration::from_secs(16));
        cases.push(c);
        let mut c = base.clone();
        c.claim_timeout = Duration::ZERO;
        cases.push(c);
        let mut c = base.clone();
        c.max_jobs = Some(0);
        cases.push(c);
        let mut c = base.clone();
        c.cancel_poll_interval = Duration::ZERO;
        cases.push(c);
        let mut c = base.clone();
        c.name = String::new();
        cases.push(c);
        let mut c = base.clone();
        c.kv_tokens_per_job = 0;
        cases.push(c);
        let mut c = base.clone();
        c.claim_budget = ClaimBudget::Prefill(Duration::ZERO);
        cases.push(c);
        let mut c = base.clone();
        c.missed_heartbeats = 1;
        cases.push(c);
        for c in cases {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
