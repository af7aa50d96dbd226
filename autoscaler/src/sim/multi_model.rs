//! A multi-model workload from one trace: N models with Zipf popularity, each model's
//! arrivals the trace's own arrival process thinned to its share and shifted in time (wrapped
//! around the trace's period) by a seeded offset, so the models keep the trace's burstiness
//! without peaking together. The shares sum to one, so the N models together carry about
//! the trace's traffic.

use super::trace::{self, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One model's slice of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTrace {
    /// The model's name (`model-0` is the most popular).
    pub name: String,
    /// Its share of the traffic.
    pub share: f64,
    /// Its requests, sorted by arrival.
    pub requests: Vec<Request>,
}

/// Zipf shares of `n` models with `exponent` (0: all equal): rank `k` gets `k^-s / H`.
pub fn zipf_shares(n: u32, exponent: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=n).map(|k| f64::from(k).powf(-exponent)).collect();
    let h: f64 = w.iter().sum();
    w.into_iter().map(|x| x / h).collect()
}

/// Splits `reqs` (sorted by arrival) into `n` models' traces, seeded.
pub fn split(reqs: &[Request], n: u32, exponent: f64, seed: u64) -> Vec<ModelTrace> {
    let period = trace::period_ms(reqs).max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9001_0C0D_E5EE_D000);
    zipf_shares(n, exponent)
        .into_iter()
        .enumerate()
        .map(|(k, share)| {
            let thin_seed = rng.random::<u64>();
            // the most popular model is the trace as it starts; the others are shifted
            let offset = if k == 0 {
                0
            } else {
                rng.random_range(0..period)
            };
            let mut requests: Vec<Request> = trace::thin(reqs, share, thin_seed)
                .into_iter()
                .map(|r| Request {
                    arrival_ms: (r.arrival_ms + offset) % period,
                    ..r
                })
                .collect();
            requests.sort_by_key(|r| r.arrival_ms);
            ModelTrace {
                name: format!("model-{k}"),
                share,
                requests,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reqs(n: u64) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                arrival_ms: i * 100,
                prompt_tokens: 10,
                generated_tokens: 2,
            })
            .collect()
    }

    #[test]
    fn shares_follow_zipf_and_sum_to_one() {
        let s = zipf_shares(4, 1.0);
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((s[0] / s[1] - 2.0).abs() < 1e-12);
        assert!((s[0] / s[3] - 4.0).abs() < 1e-12);
        assert_eq!(zipf_shares(3, 0.0), vec![1.0 / 3.0; 3]);
    }

    #[test]
    fn the_split_is_seeded_shifted_and_keeps_about_the_traffic() {
        let all = reqs(20_000);
        let a = split(&all, 8, 1.0, 5);
        assert_eq!(a, split(&all, 8, 1.0, 5));
        assert_ne!(a, split(&all, 8, 1.0, 6));
        let total: usize = a.iter().map(|m| m.requests.len()).sum();
        assert!((19_000..21_000).contains(&total), "{total}");
        assert!(a[0].requests.len() > 3 * a[7].requests.len());
        let period = trace::period_ms(&all);
        for m in &a {
            assert!(m
                .requests
                .windows(2)
                .all(|w| w[0].arrival_ms <= w[1].arrival_ms));
            assert!(m.requests.iter().all(|r| r.arrival_ms < period));
        }
        // a burst in the first tenth of the trace: the most popular model keeps it there,
        // the others carry it elsewhere
        let mut bursty: Vec<Request> = reqs(10_000)
            .into_iter()
            .map(|r| Request {
                arrival_ms: r.arrival_ms / 100,
                ..r
            })
            .collect();
        bursty.push(Request {
            arrival_ms: 100_000,
            ..bursty[0]
        });
        let b = split(&bursty, 8, 0.0, 1);
        let median = |m: &ModelTrace| m.requests[m.requests.len() / 2].arrival_ms;
        assert!(median(&b[0]) < 10_000);
        let moved = b.iter().skip(1).filter(|m| median(m) >= 10_000).count();
        assert!(moved >= 5, "{moved}");
    }
}
