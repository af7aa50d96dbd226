//! What a step that verifies k proposed tokens of one sequence costs, relative to the
//! sequence's one-token step: the price the choice of k weighs acceptance against.
//!
//! The price is rarely linear in k: it bends where the matrix products change kernel. As the
//! engine measured it for SmolLM2-135M on a 2-core AMX Xeon, a step of 1 + k tokens took 1.15,
//! 1.24, 1.38, 1.60, 1.82, 1.96, 2.08 and 2.54 one-token steps for k = 1 to 8 (a fifth row
//! opens a second quad of the block-per-lane kernel; nine rows take the 16-row GEMM): the
//! least-squares line through those points makes k = 3 9 % dearer than it is and k = 8 8 %
//! cheaper. So the engine keeps the measured curve, one entry per k, and a flag's single
//! figure becomes a straight line.

/// Relative step time for each k in `0..=max` (entry 0 is the one-token step, 1.0).
#[derive(Debug, Clone, PartialEq)]
pub struct StepCost {
    relative: Vec<f64>,
}

impl StepCost {
    /// Each verified token adds `per_token` of a one-token step.
    pub fn linear(per_token: f64, max: usize) -> Self {
        let per_token = if per_token.is_finite() {
            per_token.max(0.0)
        } else {
            0.0
        };
        Self {
            relative: (0..=max).map(|k| 1.0 + per_token * k as f64).collect(),
        }
    }

    /// From measured `(k, relative step time)` points (any order; k = 0 and non-finite or
    /// negative times are ignored): straight lines between neighbouring points, through
    /// (0, 1) below the first, and the last point's mean price per token beyond the last. A
    /// longer step never costs less than a shorter one (a noisy point is raised to the
    /// largest before it). `None` without a usable point.
    pub fn from_measured(points: &[(usize, f64)], max: usize) -> Option<Self> {
        let mut known: Vec<(usize, f64)> = points
            .iter()
            .copied()
            .filter(|&(k, r)| k > 0 && r.is_finite() && r >= 0.0)
            .collect();
        known.sort_by_key(|&(k, _)| k);
        known.dedup_by_key(|p| p.0);
        let &(last_k, last_r) = known.last()?;
        known.insert(0, (0, 1.0));
        let beyond = (last_r - 1.0).max(0.0) / last_k as f64;
        let mut relative = Vec::with_capacity(max + 1);
        for k in 0..=max {
            let r = match known.windows(2).find(|w| k <= w[1].0) {
                Some(w) => {
                    let ((k0, r0), (k1, r1)) = (w[0], w[1]);
                    r0 + (r1 - r0) * (k - k0) as f64 / (k1 - k0) as f64
                }
                None => last_r + beyond * (k - last_k) as f64,
            };
            let floor = relative.last().copied().unwrap_or(1.0);
            relative.push(if k == 0 { 1.0 } else { r.max(floor) });
        }
        Some(Self { relative })
    }

    /// Relative time of a step that verifies `k` proposed tokens (the last entry's mean
    /// price per token carries on past `max`).
    pub fn at(&self, k: usize) -> f64 {
        let max = self.max();
        match self.relative.get(k) {
            Some(&r) => r,
            None => self.relative[max] + self.per_token() * (k - max) as f64,
        }
    }

    /// The largest k the curve was built for.
    pub fn max(&self) -> usize {
        self.relative.len() - 1
    }

    /// Mean price of one verified token at the largest k (what one straight line would say).
    pub fn per_token(&self) -> f64 {
        let max = self.max();
        if max == 0 {
            return 0.0;
        }
        (self.relative[max] - 1.0) / max as f64
    }

    /// The curve, entry k for a step that verifies k tokens.
    pub fn relative(&self) -> &[f64] {
        &self.relative
    }
}

/// A curve with a bend, of the shape a change of kernel gives: steep to three proposed
/// tokens, flat from three to six, rising again after.
#[cfg(test)]
pub(crate) const BENT_CURVE: [(usize, f64); 6] = [
    (1, 1.03),
    (2, 1.13),
    (3, 1.38),
    (4, 1.38),
    (6, 1.38),
    (8, 1.41),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn linear_adds_the_same_price_per_token() {
        let c = StepCost::linear(0.25, 4);
        assert!(close(c.relative(), &[1.0, 1.25, 1.5, 1.75, 2.0]));
        assert_eq!(c.max(), 4);
        assert!((c.per_token() - 0.25).abs() < 1e-12);
        assert!((c.at(6) - 2.5).abs() < 1e-12);
        // A nonsensical price is free rather than a poisoned curve.
        assert!(close(StepCost::linear(f64::NAN, 2).relative(), &[1.0; 3]));
        assert!(close(StepCost::linear(-1.0, 2).relative(), &[1.0; 3]));
        assert_eq!(StepCost::linear(0.5, 0).per_token(), 0.0);
    }

    #[test]
    fn measured_points_are_joined_and_extended() {
        let points = BENT_CURVE;
        let c = StepCost::from_measured(&points, 10).unwrap();
        let want = [
            1.0, 1.03, 1.13, 1.38, 1.38, 1.38, 1.38, 1.395, 1.41, 1.46125, 1.5125,
        ];
        assert!(close(c.relative(), &want), "{:?}", c.relative());
        // Shorter than the points: cut.
        let c = StepCost::from_measured(&points, 2).unwrap();
        assert!(close(c.relative(), &[1.0, 1.03, 1.13]));
        // Below the first point: a line from (0, 1).
        let c = StepCost::from_measured(&[(4, 2.0)], 4).unwrap();
        assert!(close(c.relative(), &[1.0, 1.25, 1.5, 1.75, 2.0]));
    }

    #[test]
    fn noise_never_makes_a_longer_step_cheaper() {
        let c = StepCost::from_measured(&[(2, 1.5), (1, 1.2), (3, 1.4), (4, 0.9)], 5).unwrap();
        let r = c.relative();
        assert!(r.windows(2).all(|w| w[1] >= w[0]), "{r:?}");
        assert!(close(&r[..3], &[1.0, 1.2, 1.5]));
    }

    #[test]
    fn unusable_points_give_none() {
        assert!(StepCost::from_measured(&[], 4).is_none());
        assert!(StepCost::from_measured(&[(0, 1.0), (2, f64::NAN), (3, -1.0)], 4).is_none());
        // Duplicates keep the first.
        let c = StepCost::from_measured(&[(2, 1.2), (2, 9.0)], 2).unwrap();
        assert!(close(c.relative(), &[1.0, 1.1, 1.2]));
    }
}
