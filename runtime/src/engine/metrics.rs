use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::scheduler::SchedulerStats;
use crate::speculative::SpeculationStats;

/// Prometheus metrics of the engine (names follow vLLM's, with the `tidal_` prefix).
pub(crate) struct EngineMetrics;

impl EngineMetrics {
    pub fn prompt_tokens(&self, n: usize) {
        counter!("tidal_prompt_tokens_total").increment(n as u64);
    }

    pub fn token_generated(&self, latency: Duration, first: bool) {
        counter!("tidal_generation_tokens_total").increment(1);
        if first {
            histogram!("tidal_time_to_first_token_seconds").record(latency.as_secs_f64());
        } else {
            histogram!("tidal_inter_token_latency_seconds").record(latency.as_secs_f64());
        }
    }

    pub fn step(&self, tokens: usize, elapsed: Duration) {
        histogram!("tidal_step_duration_seconds").record(elapsed.as_secs_f64());
        histogram!("tidal_step_tokens").record(tokens as f64);
    }

    /// One verification of `proposed` tokens of which `accepted` were kept (vLLM's
    /// `spec_decode` counters, per proposer).
    pub fn speculation(&self, proposer: &'static str, proposed: usize, accepted: usize) {
        counter!("tidal_spec_decode_num_drafts_total", "proposer" => proposer).increment(1);
        counter!("tidal_spec_decode_num_draft_tokens_total", "proposer" => proposer)
            .increment(proposed as u64);
        counter!("tidal_spec_decode_num_accepted_tokens_total", "proposer" => proposer)
            .increment(accepted as u64);
    }

    /// The acceptance rate and mean accepted length since the engine started.
    pub fn speculation_totals(&self, proposer: &'static str, totals: &SpeculationStats) {
        gauge!("tidal_spec_decode_acceptance_rate", "proposer" => proposer)
            .set(totals.acceptance_rate());
        gauge!("tidal_spec_decode_mean_accepted_length", "proposer" => proposer)
            .set(totals.mean_accepted_length());
    }

    /// Mirrors the scheduler's state into gauges and monotonic counters.
    pub fn publish(&self, stats: &SchedulerStats) {
        gauge!("tidal_requests_waiting").set(stats.num_waiting as f64);
        gauge!("tidal_requests_running").set(stats.num_running as f64);
        gauge!("tidal_kv_cache_usage_ratio").set(stats.kv_usage);
        gauge!("tidal_prefill_tokens_per_second").set(stats.prefill_tokens_per_s);
        counter!("tidal_prefix_cache_queries_total").absolute(stats.prefix_cache_queries);
        counter!("tidal_prefix_cache_hits_total").absolute(stats.prefix_cache_hits);
        counter!("tidal_preemptions_total").absolute(stats.preemptions);
    }
}
