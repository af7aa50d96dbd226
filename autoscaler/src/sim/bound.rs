//! Lower bounds on the replica-time a run bills, from the requests alone.
//!
//! - [`fluid_ms`]: every request's work at the fully batched rate; no run bills less.
//! - [`bound_ms`]: the fluid work, or the occupancy that requests meeting their TTFT force,
//!   for replicas that start instantly and free.
//! - [`clairvoyant_bound_ms`]: the same for replicas that pay the profile's cold start, as
//!   every simulated fleet's do; what a fleet with perfect foresight pays.
//!
//! The proofs are in `docs/autoscaling.md`, "The oracle".

use super::profile::ServiceProfile;
use super::trace::Request;
use std::ops::Range;

/// Work of one request on an otherwise idle, perfectly batched replica, ms (fluid bound).
pub fn work_ms(r: &Request, p: &ServiceProfile) -> f64 {
    let prefill = f64::from(r.prompt_tokens) / p.prefill_tokens_per_s;
    let decode = f64::from(r.generated_tokens - 1) / p.decode_tokens_per_s_at_max;
    (prefill + decode) * 1000.0
}

/// Unloaded time to first token of one request, ms.
pub fn unloaded_ttft_ms(r: &Request, p: &ServiceProfile) -> u64 {
    (f64::from(r.prompt_tokens) / p.prefill_tokens_per_s * 1000.0).ceil() as u64
}

/// Shortest time one request occupies a replica, ms: prefill at the prefill rate, then its
/// other tokens at the single-sequence decode rate (no sequence decodes faster than that).
pub fn service_ms(r: &Request, p: &ServiceProfile) -> f64 {
    let prefill = f64::from(r.prompt_tokens) / p.prefill_tokens_per_s;
    let decode = f64::from(r.generated_tokens - 1) / p.decode_tokens_per_s_single;
    (prefill + decode) * 1000.0
}

/// Fluid work of every request, ms.
pub fn fluid_ms(reqs: &[Request], p: &ServiceProfile) -> f64 {
    reqs.iter().map(|r| work_ms(r, p)).sum()
}

/// What an anchored request forces, ms: its service `[c, c + service]` starts at some
/// `c` in `[arrival, latest_start]` on one ready, billed replica.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    arrival: f64,
    /// `arrival + target - prefill`: the last claim that still meets the TTFT
    latest_start: f64,
    service: f64,
    prefill: f64,
}

/// The anchored requests that can meet the target, in arrival order.
fn anchors(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> Vec<Anchor> {
    let slo_ms = p.ttft_slo_s * 1000.0;
    let mut v: Vec<Anchor> = reqs
        .iter()
        .zip(anchored)
        .filter(|(_, a)| **a)
        .map(|(r, _)| {
            let arrival = r.arrival_ms as f64;
            let prefill = f64::from(r.prompt_tokens) / p.prefill_tokens_per_s * 1000.0;
            Anchor {
                arrival,
                latest_start: arrival + slo_ms - prefill,
                service: service_ms(r, p),
                prefill,
            }
        })
        // a prefill longer than the target cannot meet it: such a request anchors nothing
        .filter(|a| a.prefill <= slo_ms)
        .collect();
    v.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    v
}

/// One merged span of anchored requests' occupancy windows, ms.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: f64,
    end: f64,
    /// the longest unloaded service in the span
    longest: f64,
    /// the prefill of every request in the span
    prefill: f64,
}

impl Span {
    /// Billed ready time the span forces: one replica for its longest service, and at least
    /// the summed prefill across replicas.
    fn occupied(&self) -> f64 {
        self.longest.max(self.prefill)
    }
}

/// The disjoint spans of `E = [a, a + slo - p + s]` over the anchors, in time order.
fn spans(anchors: &[Anchor]) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for a in anchors {
        let w = Span {
            start: a.arrival,
            end: a.latest_start + a.service,
            longest: a.service,
            prefill: a.prefill,
        };
        match spans.last_mut() {
            Some(cur) if w.start <= cur.end => {
                cur.end = cur.end.max(w.end);
                cur.longest = cur.longest.max(w.longest);
                cur.prefill += w.prefill;
            }
            _ => spans.push(w),
        }
    }
    spans
}

/// Lower bound on the billed replica-ms of a run, counting no cold start: it holds for every
/// run and is tight only for fleets whose replicas start instantly. `anchored[i]` says that
/// request `i` met the TTFT target and was not evicted after its first token; every request
/// counts in the fluid work.
///
/// An anchored request `i` (arrival `a`, prefill `p`, unloaded service `s`) sits on one billed
/// replica for at least `[c, c + s]` with `a <= c <= a + slo - p`, so inside
/// `E = [a, a + slo - p + s]`, and its prefill runs inside `[a, a + slo]`. The merged spans of
/// these `E` are disjoint; inside each, some replica is billed for at least the longest `s`
/// and replicas spend at least the summed prefill. Billing outside the spans and the fluid
/// work give the rest: `max(fluid work, sum over spans of max(longest s, summed prefill))`.
pub fn bound_ms(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> f64 {
    let occupied: f64 = spans(&anchors(reqs, p, anchored))
        .iter()
        .map(Span::occupied)
        .sum();
    fluid_ms(reqs, p).max(occupied)
}

/// Lower bound on the billed replica-ms of a run that starts with no replica and pays the
/// profile's cold start `C` for every replica it starts (as every simulated fleet does; a
/// fleet that is ready at the first arrival started `C` before it), `anchored` as in
/// [`bound_ms`]. It is what a fleet with perfect foresight pays: it starts each replica `C`
/// before it is needed, so no request waits for a cold start, keeps one across an idle gap
/// shorter than `C` and restarts across a longer one.
///
/// The larger of two proven bounds (`docs/autoscaling.md`, "The oracle"):
/// - spans: `C + max(fluid work, sum of span occupancy + sum over gaps G between spans of
///   min(G, C))`;
/// - clusters, when `C` exceeds every anchor's slack (`C + shortest service + shortest
///   prefill > target`): the least, over splits of the anchors (in arrival order) into runs,
///   of the sum over runs of `C + max(last a + s - first (a + slo - p), longest s, summed p)`.
///   It counts the idle time between requests a few seconds apart, which spans do not.
pub fn clairvoyant_bound_ms(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> f64 {
    clairvoyant(reqs, p, anchored).0
}

/// [`clairvoyant_bound_ms`] and the replica starts of the schedule it describes.
pub(super) fn clairvoyant(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> (f64, u64) {
    if reqs.is_empty() {
        return (0.0, 0);
    }
    let (ms, clusters) = schedule(reqs, p, anchored);
    (ms, clusters.len().max(1) as u64)
}

/// One stretch of the oracle's schedule, ms: a replica is needed from the first request's
/// arrival until the last one's unloaded service ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stretch {
    /// first arrival
    pub start_ms: f64,
    /// latest `arrival + service`
    pub end_ms: f64,
}

/// The stretches between the oracle's restarts, with every request anchored: where a fleet
/// with perfect foresight keeps a replica (see `scalers::Foresight`).
pub fn oracle_stretches(reqs: &[Request], p: &ServiceProfile) -> Vec<Stretch> {
    schedule(reqs, p, &vec![true; reqs.len()]).1
}

/// The bound and the stretches of the schedule that attains it.
fn schedule(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> (f64, Vec<Stretch>) {
    let cold = p.cold_start_ms() as f64;
    let anchors = anchors(reqs, p, anchored);
    let fluid = cold + fluid_ms(reqs, p);
    let (by_spans, span_stretches) = span_bound(&anchors, cold);
    let (ms, stretches) = match cluster_bound(&anchors, cold, p.ttft_slo_s * 1000.0) {
        Some((by_clusters, runs)) if by_clusters >= by_spans => {
            let stretches = runs.into_iter().map(|run| stretch(&anchors[run])).collect();
            (by_clusters, stretches)
        }
        _ => (by_spans, span_stretches),
    };
    (ms.max(fluid), stretches)
}

fn stretch(run: &[Anchor]) -> Stretch {
    Stretch {
        start_ms: run.iter().map(|a| a.arrival).fold(f64::INFINITY, f64::min),
        end_ms: run
            .iter()
            .map(|a| a.arrival + a.service)
            .fold(f64::NEG_INFINITY, f64::max),
    }
}

/// The span bound without the fluid term (one start, and one more after every gap of at
/// least a cold start) and its stretches: spans joined across shorter gaps.
fn span_bound(anchors: &[Anchor], cold: f64) -> (f64, Vec<Stretch>) {
    let spans = spans(anchors);
    let occupied: f64 = spans.iter().map(Span::occupied).sum();
    let bridged: f64 = spans
        .windows(2)
        .map(|w| (w[1].start - w[0].end).min(cold))
        .sum();
    let mut stretches: Vec<Stretch> = Vec::new();
    for s in &spans {
        match stretches.last_mut() {
            Some(last) if s.start - last.end_ms < cold => last.end_ms = s.end,
            _ => stretches.push(Stretch {
                start_ms: s.start,
                end_ms: s.end,
            }),
        }
    }
    (cold + occupied + bridged, stretches)
}

/// The cluster bound and its clusters (ranges of `anchors`), or `None` when a cold start is
/// not longer than some anchor's slack, where clusters need not be runs in arrival order.
///
/// In any run, split the union of the anchored services at its gaps of at least `C`: each
/// such gap, and the first start, bills a cold start or the gap, and each cluster between
/// bills its extent (shorter gaps are billed throughout, or a cold start would not fit). A
/// later cluster's request arrived after an earlier cluster's, because it started at least
/// `C + s` after that one's arrival and `C` exceeds its slack. The extent is at least the
/// latest `a + s` minus the earliest `a + slo - p`, the longest `s`, and the summed `p`.
/// The least sum over all splits into runs is the dynamic programme below (quadratic).
fn cluster_bound(anchors: &[Anchor], cold: f64, slo_ms: f64) -> Option<(f64, Vec<Range<usize>>)> {
    if anchors.is_empty() {
        return Some((cold, Vec::new()));
    }
    let shortest = |f: fn(&Anchor) -> f64| anchors.iter().map(f).fold(f64::INFINITY, f64::min);
    if cold + shortest(|a| a.service) + shortest(|a| a.prefill) <= slo_ms {
        return None;
    }
    // least[i]: the best split of the first i anchors; first[i]: where its last run starts
    let mut least = vec![0.0; anchors.len() + 1];
    let mut first = vec![0usize; anchors.len() + 1];
    for i in 1..=anchors.len() {
        let (mut first_latest_start, mut last_end) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut longest, mut prefill) = (0.0f64, 0.0);
        least[i] = f64::INFINITY;
        // the last run is anchors[j..i]
        for j in (0..i).rev() {
            let a = &anchors[j];
            first_latest_start = first_latest_start.min(a.latest_start);
            last_end = last_end.max(a.arrival + a.service);
            longest = longest.max(a.service);
            prefill += a.prefill;
            let extent = (last_end - first_latest_start).max(longest).max(prefill);
            let total = least[j] + cold + extent;
            if total < least[i] {
                least[i] = total;
                first[i] = j;
            }
        }
    }
    let mut runs = Vec::new();
    let mut end = anchors.len();
    while end > 0 {
        runs.push(first[end]..end);
        end = first[end];
    }
    runs.reverse();
    Some((least[anchors.len()], runs))
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
        assert!(cluster_bound(&v, 1_000.0, 2_000.0).is_none());
        assert!(cluster_bound(&v, 1_800.0, 2_000.0).is_none());
        // 1.9 s + 0.1 s service + 0.1 s prefill > 2 s: two clusters of 1.9 + 0.1 s each
        // (one cluster bills 1.9 s + its extent 5.1 - 1.9 s = 5.1 s)
        assert_eq!(
            cluster_bound(&v, 1_900.0, 2_000.0),
            Some((4_000.0, vec![0..1, 1..2]))
        );
        assert_eq!(
            cluster_bound(&[], 1_900.0, 2_000.0),
            Some((1_900.0, vec![]))
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
        let (ms, clusters) = cluster_bound(&v, 60_000.0, 2_000.0).unwrap_or_default();
        assert_eq!(ms, 70_000.0);
        assert_eq!(clusters.len(), 1);
        assert_eq!((clusters[0].start, clusters[0].end), (0, 10));
    }
}
