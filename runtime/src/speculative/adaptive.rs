//! How many tokens to propose for one sequence: as many as pay for themselves.
//!
//! Treat each proposed token as accepted with probability α once every token before it was
//! (acceptance stops at the first rejection). Proposing k tokens then yields
//! `1 + α + α² + … + α^k` tokens per step (the last is the target's own), and the step costs
//! `t(k)` one-token steps: the measured [`super::StepCost`] curve, or `1 + c·k` for a
//! `--speculative-verify-cost` of c. [`best_num_tokens`] picks the k in `0..=max` with the
//! most tokens per unit of time; 0 means speculation does not pay at this α. A draft model
//! runs one forward pass per proposed token, so for it the engine adds `d·k`, where d is a
//! draft pass relative to a one-token step ([`super::SpeculativeConfig::draft_cost`]).
//!
//! [`Acceptance`] estimates α for a sequence from its own recent verifications, apart for
//! each [`ProposalKind`]: how often a lookup's continuation holds depends mostly on how long
//! a suffix it matched, so a lookup is found first and its length is chosen from the
//! acceptance of matches of that length ([`lookup_proposal`]).

use super::ngram::NgramProposer;

/// Expected tokens per step from proposing `k` tokens each accepted with probability
/// `alpha` given all before it were.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    (0..=k).map(|i| alpha.powi(i as i32)).sum()
}

/// The number of tokens in `0..=max` to propose that maximises tokens per unit of time at
/// acceptance `alpha`, where `time(k)` is a step that verifies k tokens relative to a
/// one-token step (`time(0)` is taken as 1); the smallest such k on ties.
pub fn best_num_tokens(alpha: f64, max: usize, time: impl Fn(usize) -> f64) -> usize {
    let alpha = alpha.clamp(0.0, 1.0);
    let mut best = (0, 1.0);
    for k in 1..=max {
        let rate = expected_tokens(alpha, k) / time(k).max(1e-9);
        if rate > best.1 + 1e-12 {
            best = (k, rate);
        }
    }
    best.0
}

/// Weight of the past in the acceptance estimate, per verified token.
const DECAY: f64 = 0.9;
/// Weight of the prior, in tokens: a new sequence speculates at once, and a sequence that
/// stopped speculating drifts back to the prior and tries again.
const PRIOR_WEIGHT: f64 = 2.0;
/// Per step without a verification, the evidence fades by this much.
const IDLE_DECAY: f64 = 0.97;

/// Longest match length that a lookup's kind tells apart; longer matches count as this.
pub const LOOKUP_MATCH_CLASSES: usize = 4;

/// Prior acceptance of each kind, by [`ProposalKind::index`]: a draft model's proposals,
/// then lookups matching 1, 2, 3 and 4 or more tokens. Replaying SmolLM2-135M's greedy
/// answers (`tidal bench speculative --verify-cost`, `replay`), a lookup's first token was
/// right 19–26 % of the time after a one-token match, 52–53 % after two, 68–76 % after
/// three and 89–93 % after four, on both workloads.
const PRIORS: [f64; LOOKUP_MATCH_CLASSES + 1] = [0.6, 0.3, 0.5, 0.7, 0.9];

/// What made a proposal; acceptance is estimated for each kind apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalKind {
    /// A draft model's greedy continuation.
    Draft,
    /// A prompt lookup whose matched suffix was this many tokens long.
    Lookup {
        /// Length of the matched suffix.
        matched: usize,
    },
}

impl ProposalKind {
    /// Position of this kind's estimate: 0 for a draft, the match length (1 to
    /// [`LOOKUP_MATCH_CLASSES`]) for a lookup.
    pub fn index(self) -> usize {
        match self {
            Self::Draft => 0,
            Self::Lookup { matched } => matched.clamp(1, LOOKUP_MATCH_CLASSES),
        }
    }
}

/// A sequence's recent acceptance: decayed counts of accepted and verified proposals, for
/// each [`ProposalKind`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    accepted: [f64; LOOKUP_MATCH_CLASSES + 1],
    trials: [f64; LOOKUP_MATCH_CLASSES + 1],
}

impl Default for Acceptance {
    fn default() -> Self {
        Self::new()
    }
}

impl Acceptance {
    /// No evidence yet: every estimate is its kind's prior.
    pub fn new() -> Self {
        Self {
            accepted: [0.0; LOOKUP_MATCH_CLASSES + 1],
            trials: [0.0; LOOKUP_MATCH_CLASSES + 1],
        }
    }

    /// Estimated probability that the next proposed token of `kind` is accepted.
    pub fn rate(&self, kind: ProposalKind) -> f64 {
        let i = kind.index();
        (self.accepted[i] + PRIORS[i] * PRIOR_WEIGHT) / (self.trials[i] + PRIOR_WEIGHT)
    }

    /// Records one verification of a proposal of `kind`: `accepted` of `proposed` tokens
    /// were kept. Every token up to and including the first rejected one was a trial; those
    /// after it were never judged.
    pub fn record(&mut self, kind: ProposalKind, proposed: usize, accepted: usize) {
        let i = kind.index();
        let accepted = accepted.min(proposed);
        let trials = (accepted + 1).min(proposed);
        for t in 0..trials {
            self.accepted[i] = self.accepted[i] * DECAY + f64::from(u8::from(t < accepted));
            self.trials[i] = self.trials[i] * DECAY + 1.0;
        }
    }

    /// A step that verified nothing for this sequence: every kind's evidence fades.
    pub fn idle(&mut self) {
        for (a, t) in self.accepted.iter_mut().zip(&mut self.trials) {
            *a *= IDLE_DECAY;
            *t *= IDLE_DECAY;
        }
    }

    /// Tokens of `kind` to propose next, at most `max`, where `time(k)` is the relative
    /// time of a step that verifies k tokens.
    pub fn num_tokens(&self, kind: ProposalKind, max: usize, time: impl Fn(usize) -> f64) -> usize {
        best_num_tokens(self.rate(kind), max, time)
    }
}

/// A lookup proposal for one sequence: the continuation `proposer` finds for `tokens`, cut
/// to the length that pays at this sequence's acceptance of matches as long as the one
/// found, at most `limit`. `None` when nothing matches or no length pays. The engine and the
/// offline replay ([`super::replay`]) both choose through this.
pub fn lookup_proposal<'t>(
    proposer: &NgramProposer,
    acceptance: &Acceptance,
    tokens: &'t [u32],
    limit: usize,
    time: impl Fn(usize) -> f64,
) -> Option<(&'t [u32], ProposalKind)> {
    let found = proposer.lookup(tokens, limit)?;
    let kind = ProposalKind::Lookup {
        matched: found.matched,
    };
    let k = acceptance.num_tokens(kind, found.continuation.len(), time);
    (k > 0).then(|| (&found.continuation[..k], kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::step_cost::BENT_CURVE;
    use crate::speculative::StepCost;

    /// A step of k verified tokens at `c` per token.
    fn line(c: f64) -> impl Fn(usize) -> f64 {
        move |k| 1.0 + c * k as f64
    }

    #[test]
    fn expected_tokens_is_the_geometric_sum() {
        assert_eq!(expected_tokens(0.0, 5), 1.0);
        assert_eq!(expected_tokens(1.0, 4), 5.0);
        assert!((expected_tokens(0.5, 3) - 1.875).abs() < 1e-12);
    }

    #[test]
    fn best_k_follows_acceptance_and_cost() {
        // Free verification: always the most.
        assert_eq!(best_num_tokens(0.3, 6, line(0.0)), 6);
        // Certain acceptance pays whenever a token costs less than a step.
        assert_eq!(best_num_tokens(1.0, 6, line(0.5)), 6);
        // Nothing is accepted: never speculate.
        assert_eq!(best_num_tokens(0.0, 6, line(0.1)), 0);
        // A token must be accepted more often than it costs: alpha 0.1 at cost 0.15 does not pay.
        assert_eq!(best_num_tokens(0.1, 6, line(0.15)), 0);
        assert!(best_num_tokens(0.2, 6, line(0.15)) >= 1);
        // Higher acceptance never asks for fewer tokens.
        let mut last = 0;
        for i in 0..=100 {
            let k = best_num_tokens(f64::from(i) / 100.0, 8, line(0.15));
            assert!(k >= last, "alpha {i}%: {k} < {last}");
            last = k;
        }
        assert_eq!(last, 8);
        // Out-of-range alpha is clamped.
        assert_eq!(best_num_tokens(7.0, 3, line(0.1)), 3);
        assert_eq!(best_num_tokens(-1.0, 3, line(0.1)), 0);
    }

    #[test]
    fn best_k_is_the_argmax_of_the_rate() {
        for a in 0..=20 {
            for c in [0.0, 0.05, 0.15, 0.4, 1.0] {
                let alpha = f64::from(a) / 20.0;
                let k = best_num_tokens(alpha, 7, line(c));
                let rate = |k: usize| expected_tokens(alpha, k) / (1.0 + c * k as f64);
                for other in 0..=7 {
                    assert!(
                        rate(k) + 1e-9 >= rate(other),
                        "alpha {alpha} c {c}: k {k} vs {other}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_measured_curve_buys_the_cheap_long_steps() {
        // A bent curve: k = 4..8 cost about what k = 3 does.
        let curve = StepCost::from_measured(&BENT_CURVE, 8).unwrap();
        let k = best_num_tokens(0.7, 8, |k| curve.at(k));
        assert_eq!(k, 8, "long proposals are nearly free here");
        // The straight line through the same points stops earlier.
        let straight = best_num_tokens(0.7, 8, line(curve.per_token() + 0.02));
        assert!(straight < 8, "{straight}");
        // Poor acceptance still takes the cheap first rows and no more.
        assert_eq!(best_num_tokens(0.1, 8, |k| curve.at(k)), 1);
        // A draft's own passes make every token dearer.
        assert!(best_num_tokens(0.7, 8, |k| curve.at(k) + 0.5 * k as f64) < 8);
    }

    const DRAFT: ProposalKind = ProposalKind::Draft;

    #[test]
    fn acceptance_learns_and_forgets() {
        let mut a = Acceptance::new();
        assert_eq!(a.rate(DRAFT), PRIORS[0]);
        assert!(
            a.num_tokens(DRAFT, 5, line(0.15)) > 0,
            "a new sequence speculates"
        );
        for _ in 0..20 {
            a.record(DRAFT, 5, 0);
        }
        assert!(a.rate(DRAFT) < 0.15, "{}", a.rate(DRAFT));
        assert_eq!(
            a.num_tokens(DRAFT, 5, line(0.15)),
            0,
            "rejections stop speculation"
        );
        for _ in 0..200 {
            a.idle();
        }
        assert!(
            a.num_tokens(DRAFT, 5, line(0.15)) > 0,
            "idle steps bring back the prior"
        );
        let mut b = Acceptance::new();
        for _ in 0..20 {
            b.record(DRAFT, 5, 5);
        }
        assert!(b.rate(DRAFT) > 0.9, "{}", b.rate(DRAFT));
        assert_eq!(b.num_tokens(DRAFT, 5, line(0.15)), 5);
        // Tokens after the first rejection are not trials: 2 accepted of 5 is 2 of 3.
        let mut c = Acceptance::new();
        c.record(DRAFT, 5, 2);
        let trials = DECAY * DECAY + DECAY + 1.0;
        let accepted = DECAY * DECAY + DECAY;
        let want = (accepted + PRIORS[0] * PRIOR_WEIGHT) / (trials + PRIOR_WEIGHT);
        assert!((c.rate(DRAFT) - want).abs() < 1e-12);
    }

    #[test]
    fn each_kind_keeps_its_own_estimate() {
        let lookup = |matched| ProposalKind::Lookup { matched };
        let a = Acceptance::new();
        // Longer matches start more trusted; past the last class they share its estimate.
        let priors: Vec<f64> = (1..=6).map(|m| a.rate(lookup(m))).collect();
        assert!(priors.windows(2).all(|w| w[0] <= w[1]), "{priors:?}");
        assert_eq!(a.rate(lookup(9)), a.rate(lookup(LOOKUP_MATCH_CLASSES)));
        assert_eq!(
            lookup(0).index(),
            1,
            "a zero-length match is the weakest class"
        );
        // Rejections of one-token matches leave four-token matches trusted.
        let mut b = Acceptance::new();
        for _ in 0..10 {
            b.record(lookup(1), 4, 0);
        }
        assert!(b.rate(lookup(1)) < 0.1);
        assert_eq!(b.rate(lookup(4)), a.rate(lookup(4)));
        assert_eq!(b.rate(DRAFT), a.rate(DRAFT));
        // Idling fades every kind's evidence towards its prior.
        for _ in 0..300 {
            b.idle();
        }
        assert!((b.rate(lookup(1)) - PRIORS[1]).abs() < 0.01);
    }

    #[test]
    fn a_lookup_is_cut_to_what_its_match_pays_for() {
        let proposer = NgramProposer::new(1, 4);
        // "1 2 3 4 5 6 7 8" then "... 3 4": a two-token match continuing "5 6 7 8 9".
        let two = [1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4];
        // "... 2 3 4": the same continuation after a four-token match (0 2 3 4).
        let four = [0, 2, 3, 4, 5, 6, 7, 8, 9, 0, 2, 3, 4];
        let fresh = Acceptance::new();
        let cost = line(0.2);
        let (short, kind) = lookup_proposal(&proposer, &fresh, &two, 8, &cost).unwrap();
        assert_eq!(kind, ProposalKind::Lookup { matched: 2 });
        let (long, kind) = lookup_proposal(&proposer, &fresh, &four, 8, &cost).unwrap();
        assert_eq!(kind, ProposalKind::Lookup { matched: 4 });
        assert!(long.len() > short.len(), "{long:?} vs {short:?}");
        assert_eq!(long, &four[4..4 + long.len()]);
        // The limit bounds it; no lookup without a match; none when nothing pays.
        let (capped, _) = lookup_proposal(&proposer, &fresh, &four, 2, &cost).unwrap();
        assert_eq!(capped, &[5, 6]);
        assert_eq!(
            lookup_proposal(&proposer, &fresh, &[1, 2, 3], 8, &cost),
            None
        );
        let mut burnt = Acceptance::new();
        for _ in 0..20 {
            burnt.record(ProposalKind::Lookup { matched: 2 }, 3, 0);
        }
        assert_eq!(lookup_proposal(&proposer, &burnt, &two, 8, &cost), None);
    }
}
