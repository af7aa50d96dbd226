//! Repetition penalties applied to the logits before sampling.
//!
//! Repetition penalty as llama.cpp's `penalties` sampler and HF's
//! `RepetitionPenaltyLogitsProcessor`: each token seen in prompt or output has its logit divided
//! by the penalty when positive and multiplied when negative. Presence and frequency penalties
//! as the OpenAI API defines them, over the generated tokens only:
//! `logit -= count * frequency + (count > 0) * presence`.

use std::collections::HashMap;

use super::SamplingParams;

/// Applies the penalties of `params` to `logits` in place and returns the original value of
/// every logit it changed (so log-probabilities can still be reported on the raw logits). Ids
/// outside the vocabulary are ignored.
pub(crate) fn apply_penalties(
    logits: &mut [f32],
    prompt: &[u32],
    generated: &[u32],
    params: &SamplingParams,
) -> Vec<(u32, f32)> {
    let rep = params.repetition_penalty;
    let (pres, freq) = (params.presence_penalty, params.frequency_penalty);
    let use_rep = rep != 1.0;
    let use_openai = pres != 0.0 || freq != 0.0;
    if !use_rep && !use_openai {
        return Vec::new();
    }
    // id -> occurrences in `generated` (0 for prompt-only tokens).
    let mut counts: HashMap<u32, u32> = HashMap::new();
    if use_rep {
        for &t in prompt {
            counts.entry(t).or_insert(0);
        }
    }
    for &t in generated {
        *counts.entry(t).or_insert(0) += 1;
    }
    let mut originals = Vec::with_capacity(counts.len());
    for (&id, &count) in &counts {
        let Some(logit) = logits.get_mut(id as usize) else {
            continue;
        };
        originals.push((id, *logit));
        if use_rep {
            *logit = if *logit > 0.0 {
                *logit / rep
            } else {
                *logit * rep
            };
        }
        if count > 0 {
            *logit -= count as f32 * freq + pres;
        }
    }
    originals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rep: f32, pres: f32, freq: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: rep,
            presence_penalty: pres,
            frequency_penalty: freq,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn repetition_penalty_covers_prompt_and_output_and_respects_sign() {
        let mut l = vec![2.0, -2.0, 1.0, 4.0];
        let orig = apply_penalties(&mut l, &[0, 0], &[1], &params(2.0, 0.0, 0.0));
        assert_eq!(l, vec![1.0, -4.0, 1.0, 4.0]);
        let mut orig = orig;
        orig.sort_by_key(|o| o.0);
        assert_eq!(orig, vec![(0, 2.0), (1, -2.0)]);
    }

    #[test]
    fn presence_and_frequency_count_generated_tokens_only() {
        let mut l = vec![0.0; 4];
        apply_penalties(&mut l, &[3, 3], &[1, 2, 2, 2], &params(1.0, 0.5, 0.25));
        // token 1: once -> 0.25 + 0.5; token 2: three times -> 0.75 + 0.5; prompt token 3 untouched.
        assert_eq!(l, vec![0.0, -0.75, -1.25, 0.0]);
    }

    #[test]
    fn negative_openai_penalties_encourage_repeats() {
        let mut l = vec![0.0; 2];
        apply_penalties(&mut l, &[], &[1, 1], &params(1.0, -1.0, -0.5));
        assert_eq!(l, vec![0.0, 2.0]);
    }

    #[test]
    fn all_penalties_combine_like_llama_cpp() {
        // llama.cpp: repetition first, then frequency/presence.
        let mut l = vec![3.0];
        apply_penalties(&mut l, &[], &[0, 0], &params(1.5, 0.5, 0.25));
        assert_eq!(l, vec![3.0 / 1.5 - 0.5 - 0.5]);
    }

    #[test]
    fn neutral_params_and_out_of_vocab_ids_change_nothing() {
        let mut l = vec![1.0, 2.0];
        assert!(apply_penalties(&mut l, &[0, 1], &[1], &params(1.0, 0.0, 0.0)).is_empty());
        apply_penalties(&mut l, &[7], &[9], &params(2.0, 1.0, 1.0));
        assert_eq!(l, vec![1.0, 2.0]);
    }
}
