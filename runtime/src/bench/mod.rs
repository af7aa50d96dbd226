//! Benchmark drivers behind `tidal bench`: they run the real engine in-process (no HTTP) and
//! return plain reports; the CLI prints them. Timings are wall-clock medians or totals of one
//! run, so compare figures taken side by side in the same run.

mod perplexity;
pub mod speculative;

pub use perplexity::{kv_capacity, perplexity, KvCapacity, PerplexityOptions, PerplexityReport};

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::engine::{Engine, EngineError, GenerationEvent, GenerationRequest};
use crate::sampling::SamplingParams;

/// The median of `v` (the mean of the middle two for an even count; 0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Greedy sampling that ignores end-of-generation, so every run generates exactly `n` tokens.
fn fixed_length_request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        resume: None,
        cache_scope: Default::default(),
        num_speculative_tokens: None,
    }
}

/// Timeline of one request as the client sees it.
#[derive(Debug, Clone, Serialize)]
pub struct RequestTiming {
    pub time_to_first_token: Duration,
    pub total: Duration,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

/// Submits a request and waits for it on the calling thread.
pub fn run_request(
    engine: &Engine,
    request: GenerationRequest,
) -> Result<RequestTiming, EngineError> {
    let started = Instant::now();
    let mut events = engine.submit(request)?;
    let mut first = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Delta { token_ids, .. } => {
                if first.is_none() && !token_ids.is_empty() {
                    first = Some(started.elapsed());
                }
            }
            GenerationEvent::Done { usage, .. } => {
                let total = started.elapsed();
                return Ok(RequestTiming {
                    time_to_first_token: first.unwrap_or(total),
                    total,
                    completion_tokens: usage.completion_tokens,
                    cached_tokens: usage.cached_tokens,
                });
            }
            GenerationEvent::Error { message } => return Err(EngineError::Invalid(message)),
        }
    }
    Err(EngineError::Stopped)
}

/// Batch-1 decode speed.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeReport {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt tokens per second of the prefill (time to first token).
    pub prefill_tokens_per_second: f64,
    /// Generated tokens per second after the first.
    pub decode_tokens_per_second: f64,
}

/// One request alone: prefill then `generate` decode steps; the best of one run per prompt.
/// The prompts should share no prefix-cache block: a repeated prompt is a cache hit, and its
/// "prefill" would measure the cache.
pub fn decode(
    engine: &Engine,
    prompts: &[Vec<u32>],
    generate: usize,
) -> Result<DecodeReport, EngineError> {
    let mut best: Option<DecodeReport> = None;
    for prompt in prompts {
        let t = run_request(engine, fixed_length_request(prompt.clone(), generate))?;
        let decode_time = t.total.saturating_sub(t.time_to_first_token).as_secs_f64();
        let report = DecodeReport {
            prompt_tokens: prompt.len(),
            generated_tokens: t.completion_tokens,
            prefill_tokens_per_second: prompt.len() as f64
                / t.time_to_first_token.as_secs_f64().max(1e-9),
            decode_tokens_per_second: t.completion_tokens.saturating_sub(1) as f64
                / decode_time.max(1e-9),
        };
        if best
            .as_ref()
            .is_none_or(|b| report.decode_tokens_per_second > b.decode_tokens_per_second)
        {
            best = Some(report);
        }
    }
    best.ok_or(EngineError::Stopped)
}

/// Aggregate throughput of `concurrency` simultaneous requests.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrencyReport {
    pub concurrency: usize,
    pub prompt_tokens: usize,
    pub generated_tokens_per_request: usize,
    /// All generated tokens divided by the wall time of the whole batch.
    pub aggregate_tokens_per_second: f64,
    pub median_time_to_first_token: Duration,
    pub wall_time: Duration,
}

/// Starts `concurrency` requests at once, each a distinct prompt of `prompt_tokens` tokens.
pub fn concurrency(
    engine: &Engine,
    concurrency: usize,
    prompts: &[Vec<u32>],
    generate: usize,
) -> Result<ConcurrencyReport, EngineError> {
    let started = Instant::now();
    let handles: Vec<_> = (0..concurrency)
        .map(|i| {
            let engine = engine.clone();
            let prompt = prompts[i % prompts.len()].clone();
            std::thread::spawn(move || run_request(&engine, fixed_length_request(prompt, generate)))
        })
        .collect();
    let mut timings = Vec::with_capacity(concurrency);
    for h in handles {
        timings.push(h.join().map_err(|_| EngineError::Stopped)??);
    }
    let wall_time = started.elapsed();
    let generated: usize = timings.iter().map(|t| t.completion_tokens).sum();
    let mut ttft: Vec<Duration> = timings.iter().map(|t| t.time_to_first_token).collect();
    ttft.sort();
    Ok(ConcurrencyReport {
        concurrency,
        prompt_tokens: prompts.first().map_or(0, Vec::len),
        generated_tokens_per_request: generate,
        aggregate_tokens_per_second: generated as f64 / wall_time.as_secs_f64().max(1e-9),
        median_time_to_first_token: ttft[ttft.len() / 2],
        wall_time,
    })
}

/// Time to first token with a shared system prompt, without and with a prefix-cache hit.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixReport {
    pub shared_prefix_tokens: usize,
    pub cold_time_to_first_token: Duration,
    pub hit_time_to_first_token: Duration,
    pub hit_cached_tokens: usize,
}

/// Runs `prefix + question_a` cold, then `prefix + question_b`, which should reuse the prefix.
pub fn prefix_cache(
    engine: &Engine,
    prefix: &[u32],
    question_a: &[u32],
    question_b: &[u32],
) -> Result<PrefixReport, EngineError> {
    let cold = run_request(
        engine,
        fixed_length_request([prefix, question_a].concat(), 1),
    )?;
    let hit = run_request(
        engine,
        fixed_length_request([prefix, question_b].concat(), 1),
    )?;
    Ok(PrefixReport {
        shared_prefix_tokens: prefix.len(),
        cold_time_to_first_token: cold.time_to_first_token,
        hit_time_to_first_token: hit.time_to_first_token,
        hit_cached_tokens: hit.cached_tokens,
    })
}

/// Memory read bandwidth in GB/s: every rayon thread sums its share of a buffer much larger
/// than the caches; best of a few passes.
pub fn memory_bandwidth_gb_per_s(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let words = vec![1u64; bytes / 8];
    let mut best = 0.0f64;
    for _ in 0..5 {
        let started = Instant::now();
        let sum: u64 = words
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .sum();
        let secs = started.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(bytes as f64 / secs / 1e9);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
