//! The `foresight` row: a fleet that knows every arrival, run through the same simulated
//! fleet as the policies. The oracle row is a lower bound; this is a schedule a clairvoyant
//! operator could actually run, so when it meets every TTFT the best possible fleet costs
//! between the two, and a policy's ratio to the true optimum lies between its ratios to them.
//!
//! It computes, for every second, the replicas that second needs ready: one over each of
//! the oracle's stretches ([`super::bound::oracle_schedule`]), more when the prompts arriving
//! within a TTFT target need more than one replica's prefill to meet it, or the requests in
//! service (at their unloaded service time) more than one replica's sequence slots. It asks
//! at each moment for the most any second within the next cold start needs: replicas are
//! ready when needed and kept across a lull shorter than a cold start (the ski-rental rule,
//! with the future known). While requests are queued or running it keeps at least one. New
//! replicas are spot unless spot is out at that moment (the outages are known); live ones
//! are kept, spot first; across an outage where that is cheaper than on-demand, it keeps the
//! spot replicas the outage will need from before it starts. It does not foresee spot
//! interruptions.

use super::bound::{prefill_ms, service_ms, Stretch};
use super::engine::in_outage;
use super::profile::ServiceProfile;
use super::scalers::{Desired, Scaler};
use super::trace::Request;
use crate::observed::Observed;
use std::time::Duration;

/// How often it decides, and the grid of its plan, ms.
const TICK_MS: u64 = 1_000;

/// The clairvoyant fleet for one trace.
#[derive(Debug, Clone)]
pub struct Foresight {
    /// need[k]: replicas needed ready during second k of the trace
    need: Vec<u32>,
    /// the plan looks a cold start ahead, in seconds
    ahead: usize,
    outages: Vec<(u64, u64)>,
}

/// Replicas beyond the first that `x` replicas' worth of demand needs: the stretches hold
/// one, and a fraction of one must not keep a replica past its stretch.
fn beyond_one(x: f64) -> u32 {
    if x > 1.0 {
        x.ceil() as u32
    } else {
        0
    }
}

/// Where keeping spot replicas across a spot outage costs less than serving what it needs
/// on demand, plans the outage's peak need for all of it: the spot replicas started before
/// it are then kept, since none can start during it.
fn hold_spot_through_outages(need: &mut [u32], outages: &[(u64, u64)], p: &ServiceProfile) {
    for &(from, to) in outages {
        let a = ((from / TICK_MS) as usize).min(need.len());
        let b = (to.div_ceil(TICK_MS) as usize).min(need.len());
        let during = &mut need[a..b];
        let peak = during.iter().copied().max().unwrap_or(0);
        let needed: u64 = during.iter().map(|n| u64::from(*n)).sum();
        let hold =
            u128::from(p.spot_price_micros_per_hour) * u128::from(peak) * during.len() as u128;
        let on_demand = u128::from(p.on_demand_price_micros_per_hour) * u128::from(needed);
        if hold < on_demand {
            during.fill(peak);
        }
    }
}

impl Foresight {
    /// The fleet for `reqs` (sorted by arrival) on `profile`, following the oracle's
    /// `stretches` ([`super::bound::oracle_schedule`]) and knowing the spot `outages`.
    pub fn new(
        reqs: &[Request],
        profile: &ServiceProfile,
        stretches: &[Stretch],
        outages: &[(u64, u64)],
    ) -> Self {
        let slo_ms = ((profile.ttft_slo_s * 1000.0) as u64).max(1);
        let second = |ms: f64| (ms / TICK_MS as f64) as usize;
        let end = reqs
            .iter()
            .map(|r| r.arrival_ms as f64 + service_ms(r, profile))
            .fold(0.0, f64::max);
        let seconds = second(end) + 2;
        let mut need = vec![0u32; seconds];
        for s in stretches {
            let to = second(s.end_ms.ceil()).min(seconds - 1);
            for n in need.iter_mut().take(to + 1).skip(second(s.start_ms)) {
                *n = 1;
            }
        }
        // requests in service per second, at their unloaded service time
        let mut starts_ends = vec![0i64; seconds + 1];
        for r in reqs {
            let a = r.arrival_ms as f64;
            starts_ends[second(a)] += 1;
            starts_ends[second(a + service_ms(r, profile)) + 1] -= 1;
        }
        let mut in_service = 0i64;
        for (k, n) in need.iter_mut().enumerate() {
            in_service += starts_ends[k];
            let t = k as u64 * TICK_MS;
            // prompts arriving in [t - slo, t + tick) prefill within the target
            let a = reqs.partition_point(|r| r.arrival_ms < t.saturating_sub(slo_ms));
            let b = reqs.partition_point(|r| r.arrival_ms < t + TICK_MS);
            let prefill: f64 = reqs[a..b].iter().map(|r| prefill_ms(r, profile)).sum();
            let for_prefill = beyond_one(prefill / slo_ms as f64);
            let for_slots =
                beyond_one(in_service as f64 / f64::from(profile.max_concurrent_seqs.max(1)));
            *n = (*n).max(for_prefill).max(for_slots);
        }
        hold_spot_through_outages(&mut need, outages, profile);
        Self {
            need,
            ahead: profile.cold_start_ms().div_ceil(TICK_MS) as usize,
            outages: outages.to_vec(),
        }
    }

    /// The most any second in `[k, k + ahead]` needs.
    fn planned(&self, k: usize) -> u32 {
        let end = (k + self.ahead + 1).min(self.need.len());
        self.need
            .get(k..end)
            .map_or(0, |w| w.iter().copied().max().unwrap_or(0))
    }
}

impl Scaler for Foresight {
    fn name(&self) -> &str {
        "foresight"
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(TICK_MS)
    }

    fn desired(&mut self, obs: &Observed, now: Duration) -> Desired {
        let t = now.as_millis() as u64;
        let n = self
            .planned((t / TICK_MS) as usize)
            .max(u32::from(obs.demand() > 0));
        let keep_spot = n.min(obs.spot.ready + obs.spot.starting);
        let keep_on_demand = (n - keep_spot).min(obs.on_demand.ready + obs.on_demand.starting);
        let new = n - keep_spot - keep_on_demand;
        if in_outage(&self.outages, t) {
            Desired {
                spot: keep_spot,
                on_demand: keep_on_demand + new,
            }
        } else {
            Desired {
                spot: keep_spot + new,
                on_demand: keep_on_demand,
            }
        }
    }

    /// Ready at t = 0 (started a cold start before) what the first cold start needs.
    fn initial(&self) -> Desired {
        Desired {
            spot: self.planned(0),
            on_demand: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::bound;
    use crate::sim::tests::tiny_profile as profile;

    /// The fleet on the tiny profile, with the oracle's stretches for `reqs`.
    fn foresight(reqs: &[Request], outages: &[(u64, u64)]) -> Foresight {
        let stretches = bound::oracle_schedule(reqs, &profile()).stretches;
        Foresight::new(reqs, &profile(), &stretches, outages)
    }

    fn want(spot: u32, on_demand: u32) -> Desired {
        Desired { spot, on_demand }
    }

    fn req(at_s: u64, prompt: u32) -> Request {
        Request {
            arrival_ms: at_s * 1000,
            prompt_tokens: prompt,
            generated_tokens: 11,
        }
    }

    #[test]
    fn asks_a_cold_start_ahead_and_releases_across_long_gaps() {
        // stretches [20 s, 21.5 s] and [100 s, 101.5 s]: asked a cold start ahead
        let mut f = foresight(&[req(20, 500), req(100, 500)], &[]);
        let idle = Observed::default();
        let at = |f: &mut Foresight, s: u64| f.desired(&idle, Duration::from_secs(s)).spot;
        assert_eq!(f.initial(), Desired::default());
        assert_eq!(at(&mut f, 9), 0);
        assert_eq!(at(&mut f, 10), 1);
        assert_eq!(at(&mut f, 21), 1);
        assert_eq!(at(&mut f, 22), 0);
        assert_eq!(at(&mut f, 89), 0);
        assert_eq!(at(&mut f, 90), 1);
        // work in flight keeps a replica
        let busy = Observed {
            in_flight: 1,
            ..Observed::default()
        };
        assert_eq!(f.desired(&busy, Duration::from_secs(50)).spot, 1);
    }

    #[test]
    fn sizes_for_a_prefill_burst_and_starts_ready_when_needed_at_once() {
        // five 1.6 s prompts at 5 s: 8 s of prefill within a 2 s target -> 4 replicas,
        // ready at t = 0 since 5 s is within the first cold start
        let burst: Vec<Request> = (0..5).map(|_| req(5, 1600)).collect();
        let mut f = foresight(&burst, &[]);
        assert_eq!(f.initial(), want(4, 0));
        // while they are being served, all four are kept; once idle, none
        let busy = Observed {
            in_flight: 5,
            ..Observed::default()
        };
        assert_eq!(f.desired(&busy, Duration::from_secs(6)).spot, 4);
        assert_eq!(
            f.desired(&Observed::default(), Duration::from_secs(20))
                .spot,
            0
        );
    }

    #[test]
    fn keeps_spot_across_an_outage_when_that_is_cheaper_than_on_demand() {
        // spot is out from 15 s to 25 s and requests arrive every 2 s in it: 10 s of spot
        // (10,000) is cheaper than their seconds on demand (at 2,000/s), so a spot replica
        // is asked a cold start before the outage and kept through it
        let reqs: Vec<Request> = (0..5).map(|i| req(16 + 2 * i, 500)).collect();
        let mut f = foresight(&reqs, &[(15_000, 25_000)]);
        let idle = Observed::default();
        assert_eq!(f.desired(&idle, Duration::from_secs(4)).spot, 0);
        assert_eq!(f.desired(&idle, Duration::from_secs(5)), want(1, 0));
        let mut running = Observed::default();
        running.spot.ready = 1;
        for t in 15..25 {
            assert_eq!(
                f.desired(&running, Duration::from_secs(t)),
                want(1, 0),
                "t={t}"
            );
        }
    }

    #[test]
    fn starts_on_demand_while_spot_is_out_and_keeps_what_runs() {
        let mut f = foresight(&[req(20, 500)], &[(0, 15_000)]);
        let idle = Observed::default();
        assert_eq!(f.desired(&idle, Duration::from_secs(10)), want(0, 1));
        // after the outage the on-demand replica it started is kept, not replaced
        let mut running = Observed::default();
        running.on_demand.starting = 1;
        assert_eq!(f.desired(&running, Duration::from_secs(16)), want(0, 1));
    }
}
