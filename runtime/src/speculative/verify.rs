//! The acceptance rule: keep proposals while the target draws them (see the module docs of
//! [`super`] for why this is the rejection rule of speculative sampling for a point-mass
//! proposal, and so exact).

/// Verifies `drafts`: `draw(i)` draws the target's token at draft position `i` (from the
/// logits of the position before it, given every token accepted so far) and returns it with
/// whatever the caller keeps per token. Returns the tokens to append, in order: the accepted
/// drafts, then the target's own token (a correction after a rejection, or one more after
/// all were accepted); between 1 and `drafts.len() + 1` of them.
pub fn verify<T>(drafts: &[u32], mut draw: impl FnMut(usize) -> (u32, T)) -> Vec<(u32, T)> {
    let mut out = Vec::with_capacity(drafts.len() + 1);
    for i in 0..=drafts.len() {
        let (token, extra) = draw(i);
        let accepted = drafts.get(i) == Some(&token);
        out.push((token, extra));
        if !accepted {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Sampler, SamplingParams};

    #[test]
    fn keeps_drafts_until_the_first_disagreement() {
        let target = [5, 6, 7, 8];
        let draw = |i: usize| (target[i], ());
        let ids = |v: Vec<(u32, ())>| v.into_iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(verify(&[5, 6, 7], draw)), vec![5, 6, 7, 8]);
        assert_eq!(ids(verify(&[5, 9, 7], draw)), vec![5, 6]);
        assert_eq!(ids(verify(&[1], draw)), vec![5]);
        assert_eq!(ids(verify(&[], draw)), vec![5]);
    }

    /// Chi-square critical value for `df` degrees of freedom at significance 0.001
    /// (Wilson–Hilferty).
    fn chi2_critical(df: f64) -> f64 {
        let z = 3.090; // upper 0.001 quantile of the standard normal
        let a = 2.0 / (9.0 * df);
        df * (1.0 - a + z * a.sqrt()).powi(3)
    }

    /// The first token of a sampled sequence with a proposal follows the target's
    /// distribution exactly, whether the proposal is likely, unlikely or impossible: the
    /// draws of 20,000 seeds against the softmax of the logits.
    #[test]
    fn a_verified_position_follows_the_target_distribution() {
        let logits: Vec<f32> = vec![2.0, 1.5, 0.0, -1.0, 1.0, 0.5, -3.0, f32::NEG_INFINITY];
        let params = SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        };
        let weights: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / 0.8).exp()).collect();
        let total: f64 = weights.iter().sum();
        let n = 20_000;
        for draft in [0u32, 3, 7] {
            let mut counts = [0usize; 8];
            let mut accepted = 0;
            for seed in 0..n {
                let mut sampler = Sampler::new(SamplingParams {
                    seed: Some(seed),
                    ..params.clone()
                });
                let out = verify(&[draft], |_| {
                    let mut row = logits.clone();
                    (sampler.sample(&mut row, &[], &[]).id, ())
                });
                counts[out[0].0 as usize] += 1;
                accepted += usize::from(out.len() == 2);
            }
            let mut chi2 = 0.0;
            let mut cells = 0;
            for (c, w) in counts.iter().zip(&weights) {
                let expected = n as f64 * w / total;
                if expected > 0.0 {
                    chi2 += (*c as f64 - expected).powi(2) / expected;
                    cells += 1;
                } else {
                    assert_eq!(*c, 0, "an impossible token was drawn");
                }
            }
            let critical = chi2_critical(f64::from(cells - 1));
            assert!(
                chi2 < critical,
                "draft {draft}: chi2 {chi2:.1} >= {critical:.1}"
            );
            let p_draft = weights[draft as usize] / total;
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - p_draft).abs() < 0.02,
                "draft {draft} accepted {rate:.3}, p = {p_draft:.3}"
            );
        }
    }
}
