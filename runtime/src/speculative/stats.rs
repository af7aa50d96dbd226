//! Running totals of speculative decoding (vLLM's `spec_decode` counters).

/// What the proposals of an engine came to since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpeculationStats {
    /// Verifications: sequence-steps that carried at least one proposed token.
    pub drafts: u64,
    /// Proposed tokens verified.
    pub draft_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
}

impl SpeculationStats {
    /// Adds one verification of `proposed` tokens of which `accepted` were kept.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += proposed as u64;
        self.accepted_tokens += accepted.min(proposed) as u64;
    }

    /// Accepted over proposed tokens (0 before the first proposal).
    pub fn acceptance_rate(&self) -> f64 {
        if self.draft_tokens == 0 {
            return 0.0;
        }
        self.accepted_tokens as f64 / self.draft_tokens as f64
    }

    /// Tokens a verification yields on average: its accepted proposals plus the target's
    /// own token (1 before the first proposal).
    pub fn mean_accepted_length(&self) -> f64 {
        if self.drafts == 0 {
            return 1.0;
        }
        1.0 + self.accepted_tokens as f64 / self.drafts as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_ratios() {
        let mut s = SpeculationStats::default();
        assert_eq!((s.acceptance_rate(), s.mean_accepted_length()), (0.0, 1.0));
        s.record(4, 4);
        s.record(4, 0);
        s.record(2, 9);
        assert_eq!(
            s,
            SpeculationStats {
                drafts: 3,
                draft_tokens: 10,
                accepted_tokens: 6
            }
        );
        assert!((s.acceptance_rate() - 0.6).abs() < 1e-12);
        assert!((s.mean_accepted_length() - 3.0).abs() < 1e-12);
    }
}
