//! The engine's measured prefill throughput (pure): what the queue worker turns a claim
//! budget in seconds into prompt tokens with (`worker::capacity::budget_tokens`).

use std::time::Duration;

/// Weight of each new sample after the first. A quarter follows a change of load or
/// machine (another process taking cores, a longer context) within a few steps, while one
/// noisy step moves the rate by at most a quarter of its error.
const NEW_SAMPLE_WEIGHT: f64 = 0.25;

/// Moving average of the tokens per second of the steps that were mostly prefill.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PrefillRate {
    tokens_per_s: f64,
}

impl PrefillRate {
    /// Tokens per second; 0 before the first prefill step.
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens_per_s
    }

    /// Counts one step of `step_tokens` tokens, `prefill_tokens` of them prompt work (not
    /// decodes), that took `elapsed`. Only steps that are at least half prefill count: a
    /// decode-heavy step is bound by reading the weights, not by the prompt tokens, and
    /// would make prefill look slow.
    pub fn record(&mut self, step_tokens: usize, prefill_tokens: usize, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if prefill_tokens == 0 || prefill_tokens * 2 < step_tokens || secs <= 0.0 {
            return;
        }
        let sample = step_tokens as f64 / secs;
        self.tokens_per_s = if self.tokens_per_s > 0.0 {
            self.tokens_per_s + NEW_SAMPLE_WEIGHT * (sample - self.tokens_per_s)
        } else {
            sample
        };
    }
}

/// Tokens of a step's sequences that are prompt work: every sequence but a decode (fed
/// exactly one token and sampled from). A one-token prompt chunk (an engine stepping one
/// token at a time) is prefill too.
pub(crate) fn prefill_tokens(seqs: impl IntoIterator<Item = (usize, bool)>) -> usize {
    seqs.into_iter()
        .filter(|&(tokens, sample)| !(tokens == 1 && sample))
        .map(|(tokens, _)| tokens)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn zero_until_a_prefill_step_then_the_first_sample() {
        let mut r = PrefillRate::default();
        assert_eq!(r.tokens_per_s(), 0.0);
        // decode-only and decode-heavy steps say nothing about prefill
        r.record(16, 0, 10 * MS);
        r.record(16, 7, 10 * MS);
        // a zero-length step (a coarse clock) is no sample either
        r.record(512, 512, Duration::ZERO);
        assert_eq!(r.tokens_per_s(), 0.0);
        // 512 tokens in 250 ms
        r.record(512, 512, 250 * MS);
        assert_eq!(r.tokens_per_s(), 2048.0);
    }

    #[test]
    fn later_samples_weigh_a_quarter() {
        let mut r = PrefillRate::default();
        r.record(400, 400, 1000 * MS); // 400/s
        r.record(240, 120, 100 * MS); // half prefill counts: 2400/s
        assert_eq!(r.tokens_per_s(), 400.0 + 0.25 * 2000.0);
        r.record(240, 119, MS); // under half: ignored
        assert_eq!(r.tokens_per_s(), 900.0);
        // a steady rate converges to it
        for _ in 0..100 {
            r.record(100, 100, 1000 * MS);
        }
        assert!(
            (r.tokens_per_s() - 100.0).abs() < 1e-6,
            "{}",
            r.tokens_per_s()
        );
    }

    #[test]
    fn decodes_are_not_prefill() {
        // (tokens fed, sampled): a decode, a middle chunk, a last chunk, a one-token chunk
        assert_eq!(prefill_tokens([(1, true)]), 0);
        assert_eq!(prefill_tokens([(1, true), (64, false), (9, true)]), 73);
        assert_eq!(prefill_tokens([(1, false), (1, true), (1, true)]), 1);
        assert_eq!(prefill_tokens([]), 0);
    }
}
