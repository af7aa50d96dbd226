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
    /// Decode steps of a sequence that verified nothing: no proposal was found, none paid
    /// for itself, or speculation paused for a large batch.
    pub plain_decodes: u64,
}

impl SpeculationStats {
    /// Adds one verification of `proposed` tokens of which `accepted` were kept.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += proposed as u64;
        self.accepted_tokens += accepted.min(proposed) as u64;
    }

    /// Counts one decode step of a sequence that carried no proposal.
    pub fn record_plain(&mut self) {
        self.plain_decodes += 1;
    }

    /// Share of decode steps that verified a proposal (0 before the first decode).
    pub fn verified_share(&self) -> f64 {
        let steps = self.drafts + self.plain_decodes;
        if steps == 0 {
            return 0.0;
        }
        self.drafts as f64 / steps as f64
    }

    /// The totals gathered since `earlier` was taken.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            drafts: self.drafts - earlier.drafts,
            draft_tokens: self.draft_tokens - earlier.draft_tokens,
            accepted_tokens: self.accepted_tokens - earlier.accepted_tokens,
            plain_decodes: self.plain_decodes - earlier.plain_decodes,
        }
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
        assert_eq!(s.verified_share(), 0.0);
        s.record(4, 4);
        s.record(4, 0);
        s.record(2, 9);
        assert_eq!(s.verified_share(), 1.0);
        s.record_plain();
        let earlier = s;
        assert_eq!(
            s,
            SpeculationStats {
                drafts: 3,
                draft_tokens: 10,
                accepted_tokens: 6,
                plain_decodes: 1,
            }
        );
        assert!((s.verified_share() - 0.75).abs() < 1e-12);
        assert!((s.acceptance_rate() - 0.6).abs() < 1e-12);
        assert!((s.mean_accepted_length() - 3.0).abs() < 1e-12);
        s.record(1, 1);
        assert_eq!(
            s.since(&earlier),
            SpeculationStats {
                drafts: 1,
                draft_tokens: 1,
                accepted_tokens: 1,
                plain_decodes: 0,
            }
        );
    }
}
