//! Prompt lookup decoding (Saxena, 2023; vLLM's `ngram` proposer): the last few tokens of a
//! sequence often occurred before, in the prompt or in the output, when the answer quotes its
//! material (summaries, extraction, code edits, retrieval answers, chat that repeats
//! itself). What followed that occurrence is the proposal. No model runs.

/// Proposes the continuation of the latest earlier occurrence of the sequence's last n
/// tokens, for the longest n in `min_n..=max_n` that occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    /// A proposer matching suffixes of `min_n..=max_n` tokens (`1 <= min_n <= max_n`; other
    /// values are clamped into that shape).
    pub fn new(min_n: usize, max_n: usize) -> Self {
        let min_n = min_n.max(1);
        Self {
            min_n,
            max_n: max_n.max(min_n),
        }
    }

    /// The shortest suffix this proposer matches.
    pub fn min_n(&self) -> usize {
        self.min_n
    }

    /// Up to `k` tokens that may follow `tokens` (prompt and output so far), or none.
    pub fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        self.lookup(tokens, k)
            .map_or_else(Vec::new, |found| found.continuation.to_vec())
    }

    /// The continuation of up to `k` tokens that follows the best earlier occurrence of the
    /// suffix of `tokens`, with how long the matched suffix is; `None` when nothing matches.
    ///
    /// One backward scan: every earlier position holding the last token is a candidate,
    /// its match length is how far the tokens before it agree with the suffix (at most
    /// `max_n`), and the longest match wins, the latest among equals (recent text predicts
    /// the next words best). The scan stops at the first match of `max_n`.
    pub fn lookup<'t>(&self, tokens: &'t [u32], k: usize) -> Option<Lookup<'t>> {
        let len = tokens.len();
        if k == 0 || len < self.min_n + 1 {
            return None;
        }
        let last = tokens[len - 1];
        let max_n = self.max_n.min(len - 1);
        // (match length, end of the matched occurrence)
        let mut best: Option<(usize, usize)> = None;
        for end in (0..len - 1).rev() {
            if tokens[end] != last {
                continue;
            }
            let reach = max_n.min(end + 1);
            let n = (0..reach)
                .take_while(|&j| tokens[end - j] == tokens[len - 1 - j])
                .count();
            if n >= self.min_n && best.is_none_or(|(b, _)| n > b) {
                best = Some((n, end));
                if n == max_n {
                    break;
                }
            }
        }
        let (matched, end) = best?;
        Some(Lookup {
            continuation: &tokens[end + 1..len.min(end + 1 + k)],
            matched,
        })
    }
}

/// What a lookup found: the tokens that followed the matched occurrence, and the length of
/// the suffix it matched (longer matches are accepted more often: see
/// [`super::adaptive::ProposalKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup<'t> {
    /// The proposed tokens (at least one).
    pub continuation: &'t [u32],
    /// How many tokens at the end of the sequence the occurrence matched.
    pub matched: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: for n from max down to min, the latest earlier occurrence of the
    /// suffix of n tokens with something after it.
    fn reference(p: NgramProposer, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (p.min_n..=p.max_n).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            for start in (0..len - n).rev() {
                if &tokens[start..start + n] == suffix {
                    let from = start + n;
                    return tokens[from..len.min(from + k)].to_vec();
                }
            }
        }
        Vec::new()
    }

    #[test]
    fn continues_a_quoted_passage() {
        let p = NgramProposer::new(2, 4);
        // "a b c d e ... a b c" → propose "d e"
        let tokens = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(p.propose(&tokens, 2), vec![4, 5]);
        assert_eq!(p.propose(&tokens, 10), vec![4, 5, 9, 9, 1, 2, 3]);
        assert_eq!(p.propose(&tokens, 0), Vec::<u32>::new());
    }

    #[test]
    fn prefers_the_longest_then_the_latest_match() {
        let p = NgramProposer::new(1, 3);
        // suffix [7, 8]: occurs at 0..2 (then 1) and at 4..6 (then 2); [6, 7, 8] only at 3..6.
        let tokens = [7, 8, 1, 6, 7, 8, 2, 5, 6, 7, 8];
        assert_eq!(p.propose(&tokens, 1), vec![2]);
        // Equal lengths: the latest.
        let tokens = [5, 1, 9, 5, 2, 9, 5];
        assert_eq!(p.propose(&tokens, 1), vec![2]);
    }

    #[test]
    fn a_lookup_says_how_long_its_match_is() {
        let p = NgramProposer::new(1, 3);
        let tokens = [7, 8, 1, 6, 7, 8, 2, 5, 6, 7, 8];
        let found = p.lookup(&tokens, 2).unwrap();
        assert_eq!((found.continuation, found.matched), (&[2, 5][..], 3));
        // Only the last token recurs.
        let found = p.lookup(&[4, 9, 5, 9], 3).unwrap();
        assert_eq!((found.continuation, found.matched), (&[5, 9][..], 1));
        assert_eq!(p.lookup(&[1, 2, 3], 3), None);
        assert_eq!(p.lookup(&tokens, 0), None);
    }

    #[test]
    fn too_short_a_match_proposes_nothing() {
        let p = NgramProposer::new(3, 4);
        assert!(p.propose(&[1, 2, 9, 1, 2], 4).is_empty());
        assert!(p.propose(&[1, 2], 4).is_empty());
        assert!(p.propose(&[], 4).is_empty());
        // A repeating pattern continues itself.
        assert_eq!(
            NgramProposer::new(2, 2).propose(&[1, 2, 1, 2, 1], 4),
            vec![2, 1]
        );
    }

    #[test]
    fn agrees_with_the_reference_on_random_sequences() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        for case in 0..3_000 {
            let len = rng.random_range(0..40);
            let alphabet = rng.random_range(1..6);
            let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..alphabet)).collect();
            let min_n = rng.random_range(1..4);
            let p = NgramProposer::new(min_n, min_n + rng.random_range(0..3));
            let k = rng.random_range(0..6);
            assert_eq!(
                p.propose(&tokens, k),
                reference(p, &tokens, k),
                "case {case}: {tokens:?} {p:?} k={k}"
            );
        }
    }
}
