//! Lower bounds on the replica-time a run bills, from the requests alone.
//!
//! - [`fluid_ms`]: every request's work at the fully batched rate; no run bills less.
//! - [`bound_ms`]: the fluid work, or the occupancy that requests meeting their TTFT force,
//!   for replicas that start instantly and free.
//! - [`clairvoyant_bound_ms`]: the same for replicas that pay the profile's cold start, as
//!   every simulated fleet's do; what a fleet with perfect foresight pays.
//!
//! The proofs are in `docs/oracle.md`.

use super::profile::ServiceProfile;
use super::trace::Request;
use clusters::cluster_bounds;

mod clusters;
mod levels;

/// Work of one request on an otherwise idle, perfectly batched replica, ms (fluid bound).
pub fn work_ms(r: &Request, p: &ServiceProfile) -> f64 {
    prefill_ms(r, p) + f64::from(r.generated_tokens - 1) / p.decode_tokens_per_s_at_max * 1000.0
}

/// Prefill of one request's prompt at the profile's prefill rate, ms.
pub fn prefill_ms(r: &Request, p: &ServiceProfile) -> f64 {
    f64::from(r.prompt_tokens) / p.prefill_tokens_per_s * 1000.0
}

/// Unloaded time to first token of one request, ms.
pub fn unloaded_ttft_ms(r: &Request, p: &ServiceProfile) -> u64 {
    prefill_ms(r, p).ceil() as u64
}

/// Shortest time one request occupies a replica, ms: prefill at the prefill rate, then its
/// other tokens at the single-sequence decode rate (no sequence decodes faster than that).
pub fn service_ms(r: &Request, p: &ServiceProfile) -> f64 {
    prefill_ms(r, p) + f64::from(r.generated_tokens - 1) / p.decode_tokens_per_s_single * 1000.0
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
            let prefill = prefill_ms(r, p);
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
/// The largest of three proven bounds (`docs/oracle.md`):
/// - spans: `C + max(fluid work, sum of span occupancy + sum over gaps G between spans of
///   min(G, C))`;
/// - clusters, when `C` exceeds every anchor's slack (`C + shortest service + shortest
///   prefill > target`): the least, over splits of the anchors (in arrival order) into runs,
///   of the sum over runs of `C + max(last a + s - first (a + slo - p), longest s, summed p)`.
///   It counts the idle time between requests a few seconds apart, which spans do not;
/// - levels, under the same condition: the clusters bound without the summed prefill for the
///   first replica, plus the cold starts that bursts force on the replicas beyond it.
///
/// and at least `C + fluid work`.
pub fn clairvoyant_bound_ms(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> f64 {
    schedule(reqs, p, anchored).ms
}

/// The schedule of a fleet with perfect foresight that [`clairvoyant_bound_ms`] describes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    /// The bound, replica-ms.
    pub ms: f64,
    /// The replica starts it counts.
    pub starts: u64,
    /// Where its first replica is up, between restarts.
    pub stretches: Vec<Stretch>,
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

/// The oracle's schedule: [`clairvoyant_bound_ms`] with every request anchored, computed
/// once for the oracle row and the `foresight` fleet.
pub fn oracle_schedule(reqs: &[Request], p: &ServiceProfile) -> Schedule {
    schedule(reqs, p, &vec![true; reqs.len()])
}

/// The bound, the replica starts it counts, and the stretches of its first replica.
///
/// The largest of: the fluid work; the spans bound; the clusters bound; and, per replica
/// level, the clusters bound without the summed prefill for the first replica plus the cold
/// starts and bridged gaps that bursts force on the others ([`levels`]).
fn schedule(reqs: &[Request], p: &ServiceProfile, anchored: &[bool]) -> Schedule {
    if reqs.is_empty() {
        return Schedule::default();
    }
    let cold = p.cold_start_ms() as f64;
    let slo_ms = p.ttft_slo_s * 1000.0;
    let anchors = anchors(reqs, p, anchored);
    let fluid = cold + fluid_ms(reqs, p);
    let (mut ms, mut stretches) = span_bound(&anchors, cold);
    let mut starts = stretches.len().max(1) as u64;
    if let Some(clusters) = cluster_bounds(&anchors, cold, slo_ms) {
        let all = &clusters.all_replicas;
        stretches = all
            .runs
            .iter()
            .map(|r| stretch(&anchors[r.clone()]))
            .collect();
        if all.ms >= ms {
            (ms, starts) = (all.ms, all.runs.len().max(1) as u64);
        }
        let first = &clusters.first_replica;
        let (beyond, more_starts) = levels::beyond_the_first_ms(&anchors, cold, slo_ms);
        if first.ms + beyond > ms {
            (ms, starts) = (
                first.ms + beyond,
                first.runs.len().max(1) as u64 + more_starts,
            );
        }
    }
    Schedule {
        ms: ms.max(fluid),
        starts,
        stretches,
    }
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
