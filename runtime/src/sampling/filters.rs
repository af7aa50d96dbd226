//! Truncation filters on the candidate list `(id, value)`: top-k on scaled logits, then top-p
//! (nucleus) and min-p on unnormalised weights `exp(z - z_max)`, in vLLM's order (temperature
//! first, then the filters). Sorting the whole vocabulary each step would cost more than the
//! decode step of a small model, so top-k uses selection and top-p widens a selected prefix
//! only as far as the nucleus reaches.

use std::cmp::Ordering;

/// Most likely first; equal values by lower id, so every filter is deterministic.
fn by_likelihood(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the `k` most likely candidates (`k == 0`: all).
pub(crate) fn top_k(cands: &mut Vec<(u32, f32)>, k: usize) {
    if k == 0 || k >= cands.len() {
        return;
    }
    cands.select_nth_unstable_by(k - 1, by_likelihood);
    cands.truncate(k);
}

/// Replaces scaled logits by weights `exp(z - max)` (the most likely candidate gets 1).
pub(crate) fn to_weights(cands: &mut [(u32, f32)]) {
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    for c in cands.iter_mut() {
        c.1 = super::logprobs::exp_neg(c.1 - max);
    }
}

/// Keeps the smallest most-likely prefix whose weight reaches `p` of the total (at least one).
pub(crate) fn top_p(cands: &mut Vec<(u32, f32)>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    let total: f64 = cands.iter().map(|c| c.1 as f64).sum();
    let target = p as f64 * total;
    let mut n = cands.len().min(64);
    loop {
        if n < cands.len() {
            cands.select_nth_unstable_by(n - 1, by_likelihood);
        }
        cands[..n].sort_unstable_by(by_likelihood);
        let mut acc = 0.0f64;
        for i in 0..n {
            acc += cands[i].1 as f64;
            if acc >= target {
                cands.truncate(i + 1);
                return;
            }
        }
        if n == cands.len() {
            return; // rounding left the target just out of reach: keep everything
        }
        n = (n * 4).min(cands.len());
    }
}

/// Drops candidates whose weight is below `min_p` times the largest weight.
pub(crate) fn min_p(cands: &mut Vec<(u32, f32)>, min_p: f32) {
    if min_p <= 0.0 {
        return;
    }
    let max = cands.iter().map(|c| c.1).fold(0.0f32, f32::max);
    cands.retain(|c| c.1 >= min_p * max);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(c: &[(u32, f32)]) -> Vec<u32> {
        let mut v: Vec<u32> = c.iter().map(|c| c.0).collect();
        v.sort_unstable();
        v
    }

    fn cands(values: &[f32]) -> Vec<(u32, f32)> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u32, *v))
            .collect()
    }

    #[test]
    fn top_k_keeps_the_largest_with_ties_to_lower_ids() {
        let mut c = cands(&[1.0, 5.0, 3.0, 5.0, 3.0]);
        top_k(&mut c, 3);
        assert_eq!(ids(&c), vec![1, 2, 3]);
        let mut all = cands(&[1.0, 2.0]);
        top_k(&mut all, 0);
        assert_eq!(all.len(), 2);
        top_k(&mut all, 5);
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn weights_are_relative_to_the_max() {
        let mut c = cands(&[0.0, 2f32.ln(), f32::NEG_INFINITY]);
        to_weights(&mut c);
        assert!((c[0].1 - 0.5).abs() < 1e-6 && c[1].1 == 1.0 && c[2].1 == 0.0);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        let w = [0.1, 0.2, 0.3, 0.4];
        for (p, want) in [
            (0.35, vec![3]),
            (0.5, vec![2, 3]),
            (0.75, vec![1, 2, 3]),
            (0.95, vec![0, 1, 2, 3]),
        ] {
            let mut c = cands(&w);
            top_p(&mut c, p);
            assert_eq!(ids(&c), want, "top_p {p}");
        }
    }

    #[test]
    fn top_p_widens_past_the_first_selection() {
        // 1000 equal weights: half the mass needs 500 candidates, beyond the first 64.
        let mut c = cands(&[1.0; 1000]);
        top_p(&mut c, 0.5);
        assert_eq!(ids(&c), (0..500).collect::<Vec<u32>>());
    }

    #[test]
    fn min_p_is_relative_to_the_most_likely() {
        let mut c = cands(&[0.1, 0.2, 0.3, 0.4]);
        min_p(&mut c, 0.6);
        assert_eq!(ids(&c), vec![2, 3]);
        let mut one = cands(&[0.4, 0.4, 0.2]);
        min_p(&mut one, 1.0);
        assert_eq!(ids(&one), vec![0, 1]);
    }
}
