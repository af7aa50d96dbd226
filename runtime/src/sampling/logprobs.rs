//! Log-probabilities reported to the client: the log-softmax of the model's raw logits (before
//! penalties, temperature and filters), as OpenAI and vLLM (default `raw_logprobs`) report them.

/// `log(sum(exp(logits)))`, computed stably (max-subtracted, f64 accumulation). Returns
/// `-inf` for an empty or all `-inf` slice.
pub(crate) fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

/// The `n` most likely tokens as `(id, logprob)`, most likely first, ties to the lower id.
/// One pass with a small sorted buffer: `n` is at most 20.
pub(crate) fn top_logprobs(logits: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (id, &l) in logits.iter().enumerate() {
        if best.len() == n && best.last().is_some_and(|b| l <= b.1) {
            continue;
        }
        // Insert after every entry that is at least as large: earlier (lower) ids win ties.
        let at = best.partition_point(|b| b.1 >= l);
        best.insert(at, (id as u32, l));
        best.truncate(n);
    }
    best.into_iter().map(|(id, l)| (id, l - lse)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_sum_exp_matches_definition_and_is_stable() {
        let l = [1.0f32, 2.0, 3.0];
        let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() as f32;
        assert!((log_sum_exp(&l) - want).abs() < 1e-6);
        assert!((log_sum_exp(&[1000.0, 1000.0]) - (1000.0 + 2f32.ln())).abs() < 1e-3);
        assert_eq!(log_sum_exp(&[]), f32::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
    }

    #[test]
    fn top_logprobs_are_sorted_with_ties_to_lower_id() {
        let l = [0.5f32, 3.0, 1.0, 3.0, -1.0, 1.0];
        let lse = log_sum_exp(&l);
        let top = top_logprobs(&l, 4, lse);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2, 5]);
        assert!((top[0].1 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(top_logprobs(&l, 0, lse), vec![]);
        assert_eq!(top_logprobs(&l, 10, lse).len(), 6);
    }

    #[test]
    fn top_logprobs_agree_with_a_full_sort() {
        let l: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 997) as f32 * 0.01)
            .collect();
        let lse = log_sum_exp(&l);
        let mut ids: Vec<u32> = (0..1000).collect();
        ids.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
        let got: Vec<u32> = top_logprobs(&l, 20, lse).iter().map(|t| t.0).collect();
        assert_eq!(got, ids[..20]);
    }
}
