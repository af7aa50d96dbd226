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
//! [`Acceptance`] estimates α for a sequence from its own recent verifications.

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
/// Prior acceptance, and its weight in tokens: a new sequence speculates at once, and a
/// sequence that stopped speculating drifts back to the prior and tries again.
const PRIOR: f64 = 0.6;
const PRIOR_WEIGHT: f64 = 2.0;
/// Per step without a verification, the evidence fades by this much.
const IDLE_DECAY: f64 = 0.97;

/// A sequence's recent acceptance: decayed counts of accepted and verified proposals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    accepted: f64,
    trials: f64,
}

impl Default for Acceptance {
    fn default() -> Self {
        Self::new()
    }
}

impl Acceptance {
    /// No evidence yet: the estimate is the prior.
    pub fn new() -> Self {
        Self {
            accepted: 0.0,
            trials: 0.0,
        }
    }

    /// Estimated probability that the next proposed token is accepted.
    pub fn rate(&self) -> f64 {
        (self.accepted + PRIOR * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)
    }

    /// Records one verification: `accepted` of `proposed` tokens were kept. Every token up
    /// to and including the first rejected one was a trial; those after it were never
    /// judged.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        let accepted = accepted.min(proposed);
        let trials = (accepted + 1).min(proposed);
        for i in 0..trials {
            self.accepted = self.accepted * DECAY + f64::from(u8::from(i < accepted));
            self.trials = self.trials * DECAY + 1.0;
        }
    }

    /// A step that verified nothing for this sequence.
    pub fn idle(&mut self) {
        self.accepted *= IDLE_DECAY;
        self.trials *= IDLE_DECAY;
    }

    /// Tokens to propose next, at most `max`, where `time(k)` is the relative time of a
    /// step that verifies k tokens.
    pub fn num_tokens(&self, max: usize, time: impl Fn(usize) -> f64) -> usize {
        best_num_tokens(self.rate(), max, time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::step_cost::AVX512_SMOLLM2;
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
        // The AVX-512 curve: k = 4..8 cost about what k = 3 does.
        let curve = StepCost::from_measured(&AVX512_SMOLLM2, 8).unwrap();
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

    #[test]
    fn acceptance_learns_and_forgets() {
        let mut a = Acceptance::new();
        assert_eq!(a.rate(), PRIOR);
        assert!(a.num_tokens(5, line(0.15)) > 0, "a new sequence speculates");
        for _ in 0..20 {
            a.record(5, 0);
        }
        assert!(a.rate() < 0.15, "{}", a.rate());
        assert_eq!(
            a.num_tokens(5, line(0.15)),
            0,
            "rejections stop speculation"
        );
        for _ in 0..200 {
            a.idle();
        }
        assert!(
            a.num_tokens(5, line(0.15)) > 0,
            "idle steps bring back the prior"
        );
        let mut b = Acceptance::new();
        for _ in 0..20 {
            b.record(5, 5);
        }
        assert!(b.rate() > 0.9, "{}", b.rate());
        assert_eq!(b.num_tokens(5, line(0.15)), 5);
        // Tokens after the first rejection are not trials: 2 accepted of 5 is 2 of 3.
        let mut c = Acceptance::new();
        c.record(5, 2);
        let trials = DECAY * DECAY + DECAY + 1.0;
        let accepted = DECAY * DECAY + DECAY;
        let want = (accepted + PRIOR * PRIOR_WEIGHT) / (trials + PRIOR_WEIGHT);
        assert!((c.rate() - want).abs() < 1e-12);
    }
}
