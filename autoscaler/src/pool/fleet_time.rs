//! The fleet-time split: how one pool worker's billed time is charged to the models it
//! served, so the ledger can report each model's cost per million tokens and the pool's own
//! overhead.
//!
//! The rule: over an interval, a worker's milliseconds go to the models in proportion to the
//! tokens each served on it in that interval (the controller counts completion tokens, which
//! the worker's heartbeat carries per loaded model: decode steps are most of a worker's
//! time). Tokens rather than busy time because a continuous batch interleaves models within
//! one step, where busy time per model is not observable (the worker would have to
//! apportion each step itself, by tokens again). An interval in which nothing was served
//! goes to the models held in it, equally (they kept the memory); one with nothing held
//! either goes to the pool itself, a platform overhead line. Shares are whole milliseconds
//! and sum exactly to the interval (Hamilton's largest-remainder method, ties to the smaller
//! model id).

use std::collections::BTreeMap;

/// Who pays for a share of a worker's time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Payer {
    /// A model, by id.
    Model(String),
    /// The pool itself: a worker up with nothing loaded.
    Pool,
}

/// Splits `duration_ms` of one worker: by `served` tokens per model; with none served,
/// equally over `held`; with nothing held, all to [`Payer::Pool`]. Returns the shares in
/// model id order (the pool last), each above zero, summing to `duration_ms`. A model named
/// twice in `served` counts its tokens together.
pub fn split_fleet_time(
    duration_ms: u64,
    held: &[&str],
    served: &[(&str, u64)],
) -> Vec<(Payer, u64)> {
    let mut weights: BTreeMap<&str, u64> = BTreeMap::new();
    for (model, tokens) in served.iter().filter(|(_, t)| *t > 0) {
        let w = weights.entry(model).or_default();
        *w = w.saturating_add(*tokens);
    }
    if weights.is_empty() {
        weights = held.iter().map(|m| (*m, 1)).collect();
    }
    if weights.is_empty() {
        return if duration_ms == 0 {
            Vec::new()
        } else {
            vec![(Payer::Pool, duration_ms)]
        };
    }
    let shares = largest_remainder(duration_ms, &weights.values().copied().collect::<Vec<_>>());
    weights
        .keys()
        .zip(shares)
        .filter(|(_, ms)| *ms > 0)
        .map(|(m, ms)| (Payer::Model((*m).to_string()), ms))
        .collect()
}

/// Splits `total` into whole parts proportional to `weights` (not all zero), summing to
/// `total`: each part its quota rounded down, the rest one each to the largest remainders
/// (ties to the earlier weight).
pub fn largest_remainder(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut parts = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        let exact = u128::from(total) * u128::from(*w);
        // the quotient is at most `total`, so it fits
        parts.push(u64::try_from(exact / sum).unwrap_or(total));
        rems.push((exact % sum, i));
    }
    let given: u64 = parts.iter().sum();
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in rems
        .into_iter()
        .take(usize::try_from(total - given).unwrap_or(usize::MAX))
    {
        parts[i] += 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn m(id: &str, ms: u64) -> (Payer, u64) {
        (Payer::Model(id.into()), ms)
    }

    #[test]
    fn the_split_follows_tokens_then_holding_then_the_pool() {
        type Case<'a> = (u64, &'a [&'a str], &'a [(&'a str, u64)], Vec<(Payer, u64)>);
        let cases: Vec<Case<'_>> = vec![
            // by tokens: 3:1
            (
                1000,
                &["a", "b"],
                &[("a", 300), ("b", 100)],
                vec![m("a", 750), m("b", 250)],
            ),
            // a held model that served nothing pays nothing while another served
            (1000, &["a", "b", "c"], &[("a", 5)], vec![m("a", 1000)]),
            // thirds: 333 + 333 + 333 = 999, the last ms to the smallest id
            (
                1000,
                &["c", "b", "a"],
                &[("a", 1), ("b", 1), ("c", 1)],
                vec![m("a", 334), m("b", 333), m("c", 333)],
            ),
            // largest remainder, not the first: 10 ms by 1:2:7 = 1, 2, 7
            (
                10,
                &[],
                &[("a", 1), ("b", 2), ("c", 7)],
                vec![m("a", 1), m("b", 2), m("c", 7)],
            ),
            // 7 ms by 1:1:5 -> 1, 1, 5
            (
                7,
                &[],
                &[("x", 1), ("y", 1), ("z", 5)],
                vec![m("x", 1), m("y", 1), m("z", 5)],
            ),
            // 2 ms by 1:1:1: the two smallest ids get them, none gets a zero share
            (
                2,
                &[],
                &[("a", 1), ("b", 1), ("c", 1)],
                vec![m("a", 1), m("b", 1)],
            ),
            // nothing served: equally over the held ones
            (10, &["b", "a"], &[], vec![m("a", 5), m("b", 5)]),
            // served by a model no longer held (unloaded within the interval) still counts
            (10, &["a"], &[("gone", 4), ("a", 0)], vec![m("gone", 10)]),
            // nothing held: the pool's own overhead
            (60_000, &[], &[], vec![(Payer::Pool, 60_000)]),
            (0, &[], &[], vec![]),
            // twice named: summed
            (
                9,
                &[],
                &[("a", 1), ("b", 1), ("a", 1)],
                vec![m("a", 6), m("b", 3)],
            ),
        ];
        for (ms, held, served, want) in cases {
            assert_eq!(
                split_fleet_time(ms, held, served),
                want,
                "{ms} {held:?} {served:?}"
            );
        }
    }

    #[test]
    fn shares_always_sum_to_the_interval_and_follow_the_quota() {
        let mut rng = ChaCha8Rng::seed_from_u64(34);
        let ids = ["a", "b", "c", "d", "e", "f"];
        for _ in 0..5000 {
            let ms = rng.random_range(0..10_000_000u64);
            let n = rng.random_range(0..ids.len());
            let served: Vec<(&str, u64)> = ids[..n]
                .iter()
                .map(|id| (*id, rng.random_range(0..1_000_000u64)))
                .collect();
            let held: Vec<&str> = ids[..rng.random_range(0..ids.len())].to_vec();
            let out = split_fleet_time(ms, &held, &served);
            assert_eq!(out.iter().map(|(_, x)| x).sum::<u64>(), ms);
            let total: u64 = served.iter().map(|(_, t)| t).sum();
            for (payer, share) in &out {
                assert!(*share > 0);
                if let (Payer::Model(id), true) = (payer, total > 0) {
                    let t = served.iter().find(|(m, _)| m == id).map_or(0, |(_, t)| *t);
                    let quota = ms as f64 * t as f64 / total as f64;
                    assert!(
                        (*share as f64 - quota).abs() < 1.0 + 1e-6,
                        "{share} vs {quota}"
                    );
                }
            }
        }
        // u64 extremes do not overflow
        assert_eq!(
            largest_remainder(u64::MAX, &[u64::MAX, u64::MAX])
                .iter()
                .map(|x| u128::from(*x))
                .sum::<u128>(),
            u128::from(u64::MAX)
        );
        assert_eq!(largest_remainder(5, &[0, 0]), vec![0, 0]);
    }
}
