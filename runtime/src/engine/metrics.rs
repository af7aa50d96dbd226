use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::scheduler::SchedulerStats;

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
