//! What the policy sees of the world on one tick: queue, in-flight work and the fleet.

use std::time::Duration;

/// Replicas of one capacity type as the fleet backend reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityObserved {
    /// Replicas ready to claim work and not under an interruption signal.
    pub ready: u32,
    /// Replicas placed on a node and starting (image pull, model load), not yet ready.
    pub starting: u32,
    /// When each replica still waiting for capacity (not yet scheduled onto a node) was
    /// created, on the same clock as `now`. Spot pods stuck here trigger on-demand fallback.
    pub pending_since: Vec<Duration>,
    /// Replicas (ready or not) on nodes that show an interruption signal.
    pub interrupted: u32,
}

impl CapacityObserved {
    /// Pending replicas that have waited at least `delay` by `now`.
    pub fn pending_longer_than(&self, now: Duration, delay: Duration) -> u32 {
        let n = self
            .pending_since
            .iter()
            .filter(|since| now.saturating_sub(**since) >= delay)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Replicas that exist but are not ready yet (pending or starting).
    pub fn not_ready(&self) -> u32 {
        u32::try_from(self.pending_since.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.starting)
    }
}

/// Metrics for one model at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Jobs in the stream not yet claimed by any worker (stream lag).
    pub backlog: u64,
    /// Jobs claimed and not yet acknowledged (pending entries).
    pub in_flight: u64,
    /// Of `in_flight`, the jobs whose worker has delivered their first token: they only
    /// decode now, while the others still wait for prefill.
    /// Zero where the broker does not know (every claimed job then counts as waiting).
    pub decoding: u64,
    /// Spot replicas.
    pub spot: CapacityObserved,
    /// On-demand replicas.
    pub on_demand: CapacityObserved,
    /// When the last request was enqueued, if ever.
    pub last_request_at: Option<Duration>,
    /// Prompt tokens enqueued for the model so far, as the broker counts them: a counter that
    /// only grows, of which the policy uses the growth (prefill sizing).
    pub arrived_prompt_tokens: u64,
}

impl Observed {
    /// Requests the fleet must hold: queued plus running.
    pub fn demand(&self) -> u64 {
        self.backlog.saturating_add(self.in_flight)
    }

    /// Demand in request units, with each decoding job weighing `decoding_weight` of a queued
    /// or prefilling one (`decodingWeight`); `decoding` beyond `in_flight` is ignored.
    pub fn weighted_demand(&self, decoding_weight: f64) -> f64 {
        let decoding = self.decoding.min(self.in_flight);
        (self.demand() - decoding) as f64 + decoding as f64 * decoding_weight
    }

    /// Ready replicas across capacity types.
    pub fn ready(&self) -> u32 {
        self.spot.ready.saturating_add(self.on_demand.ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_demand_discounts_decoding_jobs_within_in_flight() {
        let obs = Observed {
            backlog: 2,
            in_flight: 10,
            decoding: 6,
            ..Observed::default()
        };
        assert_eq!(obs.weighted_demand(1.0), 12.0);
        assert_eq!(obs.weighted_demand(0.5), 9.0);
        assert_eq!(obs.weighted_demand(0.0), 6.0);
        // a broker that reports more decoding jobs than it holds cannot push demand below
        // the backlog
        let stale = Observed {
            decoding: 50,
            ..obs
        };
        assert_eq!(stale.weighted_demand(0.0), 2.0);
        assert_eq!(stale.demand(), 12);
    }
}
