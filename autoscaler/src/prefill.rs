//! Prefill sizing: replicas for the prompt tokens that arrived within the last TTFT target.
//!
//! Request counts (KPA's concurrency) weigh a 100-token and a 7,000-token prompt alike. When a
//! replica takes longer to start than a burst lasts, the replicas that serve the burst are
//! the ones already running, and a burst of long prompts needs more of them than its count
//! says. The broker counts the prompt tokens it enqueues per model
//! (`QueueDepth::arrived_prompt_tokens`); [`ArrivalWindow`] turns that counter's growth over
//! the last `ttftTarget` into tokens, and [`prefill_replicas`] into replicas.

use crate::spec::ScalingSpec;
use std::collections::VecDeque;
use std::time::Duration;

/// Readings of the arrived-prompt-tokens counter over the last TTFT target.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArrivalWindow {
    samples: VecDeque<(Duration, u64)>,
}

impl ArrivalWindow {
    /// Records the counter `count` at `now` and returns the tokens that arrived since the
    /// latest reading at least `within` old (since the first reading, early on). A counter
    /// that went down (broker data lost, model purged) restarts the window.
    pub fn record(&mut self, now: Duration, count: u64, within: Duration) -> u64 {
        if self.samples.back().is_some_and(|(_, c)| *c > count) {
            self.samples.clear();
        }
        self.samples.push_back((now, count));
        while self.samples.len() > 1 && self.samples[1].0 + within <= now {
            self.samples.pop_front();
        }
        self.samples
            .front()
            .map_or(0, |(_, base)| count.saturating_sub(*base))
    }
}

/// Replicas (fractional, before rounding up) that `tokens` of prompts need to be prefilled
/// within the spec's TTFT target at its `prefillUtilisation`, less its tolerance; zero when
/// prefill sizing is off.
pub fn prefill_replicas(tokens: u64, spec: &ScalingSpec) -> f64 {
    let capacity =
        spec.prefill_tokens_per_second * spec.ttft_target.as_secs_f64() * spec.prefill_utilisation;
    if !capacity.is_finite() || capacity <= 0.0 {
        return 0.0;
    }
    (tokens as f64 / capacity - spec.prefill_tolerance_replicas).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn window_counts_the_growth_of_the_last_target() {
        let mut w = ArrivalWindow::default();
        let within = s(2);
        assert_eq!(
            w.record(s(0), 500, within),
            0,
            "no history: nothing attributed"
        );
        assert_eq!(w.record(s(1), 1_500, within), 1_000);
        assert_eq!(w.record(s(2), 1_500, within), 1_000, "since t = 0");
        assert_eq!(w.record(s(3), 4_000, within), 2_500, "since t = 1");
        assert_eq!(w.record(s(5), 4_000, within), 0, "since t = 3");
        // irregular ticks: the newest reading at least `within` old is the base
        assert_eq!(w.record(s(6), 4_100, within), 100);
        assert_eq!(
            w.record(s(6) + Duration::from_millis(500), 4_300, within),
            300
        );
    }

    #[test]
    fn a_counter_that_goes_down_restarts_the_window() {
        let mut w = ArrivalWindow::default();
        w.record(s(0), 10_000, s(2));
        assert_eq!(w.record(s(1), 50, s(2)), 0);
        assert_eq!(w.record(s(2), 80, s(2)), 30);
    }

    #[test]
    fn replicas_follow_tokens_with_headroom_and_tolerance() {
        let spec = ScalingSpec {
            prefill_tokens_per_second: 10_000.0,
            ttft_target: s(2),
            prefill_utilisation: 0.5,
            prefill_tolerance_replicas: 1.0,
            ..ScalingSpec::default()
        };
        // one replica prefills 10,000 tokens (2 s at half utilisation) within the target
        assert_eq!(prefill_replicas(0, &spec), 0.0);
        assert_eq!(prefill_replicas(10_000, &spec), 0.0);
        assert_eq!(prefill_replicas(15_000, &spec), 0.5);
        assert_eq!(prefill_replicas(70_000, &spec), 6.0);
        let off = ScalingSpec::default();
        assert_eq!(prefill_replicas(1_000_000, &off), 0.0);
    }
}
