//! Token sampling for one sequence: penalties, temperature, top-k / top-p / min-p, a seeded
//! random draw keyed by the token's position, and log-probabilities of the raw logits. The
//! pipeline follows vLLM's sampler (penalties, temperature, filters, draw); the penalties
//! follow llama.cpp and the OpenAI API (see `penalties`).

mod filters;
mod logprobs;
mod params;
mod penalties;

pub use params::{SamplingError, SamplingParams, MAX_TOP_LOGPROBS};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The token picked for one position.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub id: u32,
    /// Log-softmax of the raw (unpenalised, unscaled) logits at `id`.
    pub logprob: f32,
    /// The `params.top_logprobs` most likely tokens of the raw logits, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Samples the tokens of one sequence. The random number behind token `n` depends only on the
/// sequence's seed and `n`, so a seeded request gives the same tokens whatever else shares its
/// batch, and a request resumed on another worker after `n` delivered tokens
/// ([`Sampler::continue_at`]) draws what an undisturbed run would have drawn.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    /// `params.seed`, or a random one.
    seed: u64,
    /// Index of the next token to sample.
    position: u64,
    /// Candidate buffer reused across steps (one entry per vocabulary id).
    cands: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler seeded from `params.seed`, else from the thread RNG. `params` should have
    /// passed [`SamplingParams::validate`]; out-of-range values are not re-checked.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Self {
            params,
            seed,
            position: 0,
            cands: Vec::new(),
        }
    }

    /// Continues a sequence whose first `generated` tokens were sampled elsewhere (a job
    /// resumed after a worker stopped): the next token is sampled as token `generated`.
    pub fn continue_at(&mut self, generated: usize) {
        self.position = generated as u64;
    }

    /// The uniform number in [0, 1) of the token at `position`: one ChaCha block keyed by
    /// (seed, position), so distinct pairs never share a stream.
    fn uniform(&self) -> f64 {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&self.position.to_le_bytes());
        StdRng::from_seed(key).random::<f64>()
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// logits of one position (vocab-sized, may be modified); prompt and generated tokens for
    /// penalties. NaN logits are treated as `-inf`. An empty `logits` yields id 0 with a
    /// logprob of `-inf`.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> SampledToken {
        // NaN -> -inf, +inf -> f32::MAX; branch-free so the loop vectorises.
        for l in logits.iter_mut() {
            *l = if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l.min(f32::MAX)
            };
        }
        let lse = logprobs::log_sum_exp(logits);
        let top_logprobs = match self.params.top_logprobs {
            Some(n) if n > 0 => logprobs::top_logprobs(logits, n, lse),
            _ => Vec::new(),
        };
        let originals = penalties::apply_penalties(logits, prompt, generated, &self.params);
        // All logits -inf (lse = -inf) leaves nothing to weigh: argmax gives id 0.
        let greedy = self.params.temperature <= 0.0 || self.params.top_k == 1;
        let id = if greedy || lse == f32::NEG_INFINITY {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        self.position += 1;
        let raw = originals
            .iter()
            .find(|o| o.0 == id)
            .map(|o| o.1)
            .or_else(|| logits.get(id as usize).copied())
            .unwrap_or(f32::NEG_INFINITY);
        // All logits -inf: no distribution to report.
        let logprob = if lse == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            raw - lse
        };
        SampledToken {
            id,
            logprob,
            top_logprobs,
        }
    }

    /// Temperature, filters, then one draw from the remaining weights.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let inv_t = 1.0 / self.params.temperature;
        let uniform = self.uniform();
        let cands = &mut self.cands;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l * inv_t)),
        );
        filters::top_k(cands, self.params.top_k);
        filters::to_weights(cands);
        filters::top_p(cands, self.params.top_p);
        filters::min_p(cands, self.params.min_p);
        let total: f64 = cands.iter().map(|c| c.1 as f64).sum();
        if !(total > 0.0 && total.is_finite()) {
            return argmax(logits); // every logit -inf: nothing to weigh
        }
        let u = uniform * total;
        let mut acc = 0.0f64;
        for c in cands.iter() {
            acc += c.1 as f64;
            if u < acc {
                return c.0;
            }
        }
        // u rounded up to the total: the last candidate with any weight.
        cands.iter().rev().find(|c| c.1 > 0.0).map_or(0, |c| c.0)
    }
}

/// Index of the largest logit, ties to the lowest id (0 for an empty slice).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    logprobs::first_index_of(logits, logprobs::max_value(logits)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(seed),
            ..SamplingParams::default()
        }
    }

    /// Draws `n` tokens from fresh copies of `logits` and counts them per id.
    fn counts(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(p);
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[s.sample(&mut logits.to_vec(), &[], &[]).id as usize] += 1;
        }
        c
    }

    /// Asserts counts match `probs` within 5 binomial standard deviations (zero where 0).
    fn assert_distribution(c: &[usize], probs: &[f64]) {
        let n: usize = c.iter().sum();
        for (i, (&got, &p)) in c.iter().zip(probs).enumerate() {
            let mean = p * n as f64;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            if p == 0.0 {
                assert_eq!(got, 0, "id {i} must never be drawn");
            } else {
                assert!(
                    (got as f64 - mean).abs() <= 5.0 * sd + 1.0,
                    "id {i}: {got} draws, expected {mean:.0}"
                );
            }
        }
    }

    fn ln(ps: &[f64]) -> Vec<f32> {
        ps.iter().map(|p| p.ln() as f32).collect()
    }

    #[test]
    fn greedy_takes_argmax_with_ties_to_lowest_id() {
        let mut s = Sampler::new(params(0.0, 1));
        assert_eq!(s.sample(&mut [1.0, 3.0, 2.0, 3.0], &[], &[]).id, 1);
        assert_eq!(s.sample(&mut [f32::NAN, -1.0, f32::NAN], &[], &[]).id, 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let p = SamplingParams {
            top_k: 1,
            ..params(1.5, 3)
        };
        assert_eq!(counts(p, &[0.0, 0.1, 0.1, 0.0], 200), vec![0, 200, 0, 0]);
    }

    #[test]
    fn penalties_steer_greedy_choice() {
        let p = SamplingParams {
            frequency_penalty: 1.0,
            ..params(0.0, 1)
        };
        let mut s = Sampler::new(p);
        // Token 0 generated twice: 5 - 2 = 3 < 4.
        assert_eq!(s.sample(&mut [5.0, 4.0], &[], &[0, 0]).id, 1);
        let r = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0, 1)
        };
        // Token 0 in the prompt: 5 / 2 = 2.5 < 4.
        assert_eq!(Sampler::new(r).sample(&mut [5.0, 4.0], &[0], &[]).id, 1);
    }

    #[test]
    fn logprobs_come_from_raw_logits() {
        let raw = vec![2.0f32, 1.0, 0.5, -1.0];
        let lse = logprobs::log_sum_exp(&raw);
        let p = SamplingParams {
            presence_penalty: 2.0,
            top_logprobs: Some(2),
            ..params(0.0, 1)
        };
        let t = Sampler::new(p).sample(&mut raw.clone(), &[], &[0]);
        assert_eq!(t.id, 1, "penalty moves the choice away from token 0");
        assert!((t.logprob - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(t.top_logprobs.len(), 2);
        assert_eq!((t.top_logprobs[0].0, t.top_logprobs[1].0), (0, 1));
        assert!(
            (t.top_logprobs[0].1 - (2.0 - lse)).abs() < 1e-6,
            "top logprobs ignore penalties"
        );
        let none = Sampler::new(params(1.0, 1)).sample(&mut raw.clone(), &[], &[]);
        assert!(none.top_logprobs.is_empty());
    }

    #[test]
    fn logprob_of_sampled_token_ignores_temperature() {
        let raw = vec![0.0f32, 1.0];
        let lse = logprobs::log_sum_exp(&raw);
        let mut s = Sampler::new(params(0.3, 9));
        for _ in 0..20 {
            let t = s.sample(&mut raw.clone(), &[], &[]);
            assert!((t.logprob - (raw[t.id as usize] - lse)).abs() < 1e-6);
        }
    }

    #[test]
    fn same_seed_same_tokens_whatever_else_is_sampled() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let draw = |s: &mut Sampler| s.sample(&mut logits.clone(), &[], &[]).id;
        let mut alone = Sampler::new(params(1.0, 42));
        let solo: Vec<u32> = (0..100).map(|_| draw(&mut alone)).collect();
        // Interleaved with other sequences, as in a batch.
        let mut a = Sampler::new(params(1.0, 42));
        let mut other = Sampler::new(params(1.0, 7));
        let mut unseeded = Sampler::new(SamplingParams::default());
        let batched: Vec<u32> = (0..100)
            .map(|_| {
                draw(&mut other);
                draw(&mut unseeded);
                draw(&mut a)
            })
            .collect();
        assert_eq!(solo, batched);
        let mut b = Sampler::new(params(1.0, 43));
        let different: Vec<u32> = (0..100).map(|_| draw(&mut b)).collect();
        assert_ne!(solo, different);
    }

    #[test]
    fn a_resumed_sampler_draws_what_an_undisturbed_one_would() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let mut whole = Sampler::new(params(0.9, 5));
        let undisturbed: Vec<u32> = (0..60)
            .map(|_| whole.sample(&mut logits.clone(), &[], &[]).id)
            .collect();
        for cut in [1, 17, 59] {
            let mut resumed = Sampler::new(params(0.9, 5));
            resumed.continue_at(cut);
            let rest: Vec<u32> = (cut..60)
                .map(|_| resumed.sample(&mut logits.clone(), &[], &[]).id)
                .collect();
            assert_eq!(rest, undisturbed[cut..], "resumed after {cut} tokens");
        }
        // Without continue_at the draws would restart: a different continuation.
        let mut restarted = Sampler::new(params(0.9, 5));
        let again: Vec<u32> = (17..60)
            .map(|_| restarted.sample(&mut logits.clone(), &[], &[]).id)
            .collect();
        assert_ne!(again, undisturbed[17..]);
    }

    #[test]
    fn plain_sampling_follows_softmax() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        assert_distribution(&counts(params(1.0, 11), &ln(&probs), 20_000), &probs);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        // T = 2: p ∝ sqrt(p); T = 0.5: p ∝ p².
        for (t, pow) in [(2.0f32, 0.5f64), (0.5, 2.0)] {
            let w: Vec<f64> = probs.iter().map(|p: &f64| p.powf(pow)).collect();
            let z: f64 = w.iter().sum();
            let want: Vec<f64> = w.iter().map(|x| x / z).collect();
            assert_distribution(&counts(params(t, 12), &ln(&probs), 20_000), &want);
        }
    }

    #[test]
    fn top_k_top_p_min_p_truncate_and_renormalise() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let l = ln(&probs);
        let k = SamplingParams {
            top_k: 2,
            ..params(1.0, 13)
        };
        assert_distribution(&counts(k, &l, 20_000), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
        let p = SamplingParams {
            top_p: 0.75,
            ..params(1.0, 14)
        };
        assert_distribution(
            &counts(p, &l, 20_000),
            &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
        );
        let m = SamplingParams {
            min_p: 0.6,
            ..params(1.0, 15)
        };
        assert_distribution(&counts(m, &l, 20_000), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
        let tiny = SamplingParams {
            top_p: 1e-6,
            ..params(1.0, 16)
        };
        assert_eq!(counts(tiny, &l, 100), vec![0, 0, 0, 100]);
    }

    #[test]
    fn never_draws_masked_or_nan_tokens() {
        let l = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0];
        let c = counts(params(1.0, 17), &l, 2_000);
        assert_eq!((c[0], c[2]), (0, 0));
        let all_masked = [f32::NEG_INFINITY; 3];
        let t = Sampler::new(params(1.0, 18)).sample(&mut all_masked.to_vec(), &[], &[]);
        assert_eq!((t.id, t.logprob), (0, f32::NEG_INFINITY));
        let empty = Sampler::new(params(1.0, 19)).sample(&mut [], &[], &[]);
        assert_eq!((empty.id, empty.logprob), (0, f32::NEG_INFINITY));
    }
}
