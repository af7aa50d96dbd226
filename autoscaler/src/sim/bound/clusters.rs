//! The clusters bound: one replica level's billing over the requests' service intervals,
//! split where a restart is cheaper than bridging (`docs/oracle.md`, "Proof", step 6).

use super::Anchor;
use std::ops::Range;

/// A least split of the anchors into runs, for one way of costing a run.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Clusters {
    /// the least sum, ms
    pub ms: f64,
    /// its runs, ranges of the anchors in arrival order
    pub runs: Vec<Range<usize>>,
}

/// The clusters bound counted over all replicas, and over the first replica alone.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct ClusterBounds {
    /// each run costs `C` + max(extent, longest service, summed prefill)
    pub all_replicas: Clusters,
    /// each run costs `C` + max(extent, longest service): the summed prefill may be spent
    /// on other replicas, so this bounds the first replica level alone ([`super::levels`])
    pub first_replica: Clusters,
}

/// Both cluster bounds, or `None` when a cold start is not longer than some anchor's slack,
/// where clusters need not be runs in arrival order.
///
/// In any run, split the union of the anchored services at its gaps of at least `C`: each
/// such gap, and the first start, bills a cold start or the gap, and each cluster between
/// bills its extent (shorter gaps are billed throughout, or a cold start would not fit). A
/// later cluster's request arrived after an earlier cluster's, because it started at least
/// `C + s` after that one's arrival and `C` exceeds its slack. The extent is at least the
/// latest `a + s` minus the earliest `a + slo - p`, the longest `s`, and the summed `p`.
/// The least sum over all splits into runs is the dynamic programme below (quadratic; both
/// costings in one pass).
pub(super) fn cluster_bounds(anchors: &[Anchor], cold: f64, slo_ms: f64) -> Option<ClusterBounds> {
    if anchors.is_empty() {
        let none = Clusters {
            ms: cold,
            runs: Vec::new(),
        };
        return Some(ClusterBounds {
            all_replicas: none.clone(),
            first_replica: none,
        });
    }
    let shortest = |f: fn(&Anchor) -> f64| anchors.iter().map(f).fold(f64::INFINITY, f64::min);
    if cold + shortest(|a| a.service) + shortest(|a| a.prefill) <= slo_ms {
        return None;
    }
    let n = anchors.len();
    // per costing, least[i]: the best split of the first i anchors; first[i]: where its last
    // run starts
    let mut least = [vec![0.0; n + 1], vec![0.0; n + 1]];
    let mut first = [vec![0usize; n + 1], vec![0usize; n + 1]];
    for i in 1..=n {
        let (mut first_latest_start, mut last_end) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut longest, mut prefill) = (0.0f64, 0.0);
        least[0][i] = f64::INFINITY;
        least[1][i] = f64::INFINITY;
        // the last run is anchors[j..i]
        for j in (0..i).rev() {
            let a = &anchors[j];
            first_latest_start = first_latest_start.min(a.latest_start);
            last_end = last_end.max(a.arrival + a.service);
            longest = longest.max(a.service);
            prefill += a.prefill;
            let one = (last_end - first_latest_start).max(longest);
            for (k, extent) in [one.max(prefill), one].into_iter().enumerate() {
                let total = least[k][j] + cold + extent;
                if total < least[k][i] {
                    least[k][i] = total;
                    first[k][i] = j;
                }
            }
        }
    }
    let clusters = |k: usize| {
        let mut runs = Vec::new();
        let mut end = n;
        while end > 0 {
            runs.push(first[k][end]..end);
            end = first[k][end];
        }
        runs.reverse();
        Clusters {
            ms: least[k][n],
            runs,
        }
    };
    Some(ClusterBounds {
        all_replicas: clusters(0),
        first_replica: clusters(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(arrival: f64) -> Anchor {
        Anchor {
            arrival,
            latest_start: arrival + 1_900.0,
            service: 100.0,
            prefill: 100.0,
        }
    }

    #[test]
    fn clusters_need_a_cold_start_longer_than_every_slack() {
        // slack 1.9 s: with a 1 s cold start a later cluster could hold an earlier arrival,
        // so the runs-in-arrival-order programme would not bound every run
        let v = [anchor(0.0), anchor(5_000.0)];
        assert!(cluster_bounds(&v, 1_000.0, 2_000.0).is_none());
        assert!(cluster_bounds(&v, 1_800.0, 2_000.0).is_none());
        // 1.9 s + 0.1 s service + 0.1 s prefill > 2 s: two clusters of 1.9 + 0.1 s each
        // (one cluster bills 1.9 s + its extent 5.1 - 1.9 s = 5.1 s); prefill changes nothing
        let two = Clusters {
            ms: 4_000.0,
            runs: vec![0..1, 1..2],
        };
        assert_eq!(
            cluster_bounds(&v, 1_900.0, 2_000.0),
            Some(ClusterBounds {
                all_replicas: two.clone(),
                first_replica: two,
            })
        );
        let empty = cluster_bounds(&[], 1_900.0, 2_000.0).unwrap_or_default();
        assert_eq!(
            (empty.all_replicas.ms, empty.all_replicas.runs.len()),
            (1_900.0, 0)
        );
    }

    #[test]
    fn a_cluster_counts_its_summed_prefill() {
        // ten prompts at once, 1 s of prefill each, on a 2 s target: the services fit in
        // 1.1 s but replicas spend 10 s prefilling
        let v: Vec<Anchor> = (0..10)
            .map(|_| Anchor {
                arrival: 0.0,
                latest_start: 1_000.0,
                service: 1_100.0,
                prefill: 1_000.0,
            })
            .collect();
        let b = cluster_bounds(&v, 60_000.0, 2_000.0).unwrap_or_default();
        assert_eq!(b.all_replicas.ms, 70_000.0);
        assert_eq!(b.all_replicas.runs.len(), 1);
        assert_eq!(
            (b.all_replicas.runs[0].start, b.all_replicas.runs[0].end),
            (0, 10)
        );
        // the first replica alone: the longest service, 1.1 s
        assert_eq!(b.first_replica.ms, 61_100.0);
    }
}
