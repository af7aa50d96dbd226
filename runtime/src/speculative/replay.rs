//! Offline replay of recorded greedy answers: what prompt lookup can give on a workload,
//! free of timing noise.
//!
//! A greedy answer is the same with and without speculation, so one recorded answer says
//! what every proposal would have been and how much of it the target would have kept. Each
//! replayed decode step proposes what the engine would ([`lookup_proposal`] with the
//! sequence's [`Acceptance`]), keeps the proposal's longest prefix that the answer continues
//! with, and costs the step its [`StepCost`] entry (one for a step that verifies nothing).
//! Tokens over cost is then the speedup over one token per step, with every other cost of
//! the engine (scheduling, sampling, the proposer itself) left out.
//!
//! [`replay_oracle`] bounds proposers that know the answer: a step may propose any run of the
//! answer's next tokens found earlier in the sequence, and the lengths are chosen for the
//! least total time over the whole answer. With [`RunAnchor::Anywhere`] the run may start
//! anywhere, which bounds every proposer that copies earlier text; with
//! [`RunAnchor::AfterSuffix`] it must continue an occurrence of the sequence's last tokens,
//! as every prompt lookup's proposal does, so it bounds every lookup policy, whichever
//! occurrence and length it picks.

use super::adaptive::{lookup_proposal, Acceptance};
use super::ngram::NgramProposer;
use super::StepCost;

/// Totals of one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayTotals {
    /// Decode tokens replayed (the answer without its first token, which the prefill gives).
    pub tokens: usize,
    /// Their time in one-token decode steps.
    pub steps: f64,
    /// Steps that verified a proposal.
    pub verifications: usize,
    /// Proposed tokens.
    pub proposed: usize,
    /// Proposed tokens the answer kept.
    pub accepted: usize,
}

impl ReplayTotals {
    /// Nothing counted yet for `answer`, whose decode tokens are all but its first.
    fn of(answer: &[u32]) -> Self {
        Self {
            tokens: answer.len().saturating_sub(1),
            ..Self::default()
        }
    }

    /// Tokens per one-token step: the speedup over decoding without speculation.
    pub fn speedup(&self) -> f64 {
        if self.steps > 0.0 {
            self.tokens as f64 / self.steps
        } else {
            1.0
        }
    }

    /// Sums two replays (of different answers).
    pub fn add(&mut self, other: &Self) {
        self.tokens += other.tokens;
        self.steps += other.steps;
        self.verifications += other.verifications;
        self.proposed += other.proposed;
        self.accepted += other.accepted;
    }

    /// Counts one decode step that verified `proposed` tokens, `accepted` of them kept.
    fn step(&mut self, proposed: usize, accepted: usize, cost: &StepCost) {
        self.steps += cost.at(proposed);
        if proposed > 0 {
            self.verifications += 1;
            self.proposed += proposed;
            self.accepted += accepted;
        }
    }
}

/// How many of `proposal`'s tokens the answer continues with.
fn kept(proposal: &[u32], next: &[u32]) -> usize {
    proposal
        .iter()
        .zip(next)
        .take_while(|(p, n)| p == n)
        .count()
}

/// Replays `answer` to `prompt` through `proposer` as the engine runs it for one sequence:
/// at most `limit` proposed tokens per step, none past `max_tokens` generated.
pub fn replay_lookup(
    proposer: &NgramProposer,
    prompt: &[u32],
    answer: &[u32],
    limit: usize,
    max_tokens: usize,
    cost: &StepCost,
) -> ReplayTotals {
    let mut totals = ReplayTotals::of(answer);
    let mut acceptance = Acceptance::new();
    let mut tokens: Vec<u32> = prompt.iter().chain(answer.first()).copied().collect();
    let mut done = answer.len().min(1);
    let time = |k: usize| cost.at(k);
    while done < answer.len() {
        let room = max_tokens.saturating_sub(done + 1);
        let next = &answer[done..];
        let (proposed, accepted) =
            match lookup_proposal(proposer, &acceptance, &tokens, limit.min(room), time) {
                Some((proposal, kind)) => {
                    let accepted = kept(proposal, next);
                    acceptance.record(kind, proposal.len(), accepted);
                    (proposal.len(), accepted)
                }
                None => {
                    acceptance.idle();
                    (0, 0)
                }
            };
        totals.step(proposed, accepted, cost);
        let gained = (accepted + 1).min(next.len());
        tokens.extend_from_slice(&next[..gained]);
        done += gained;
    }
    totals
}

/// Where an oracle's proposed run may be found in the sequence before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAnchor {
    /// Anywhere.
    Anywhere,
    /// Right after an earlier occurrence of the sequence's last `n` tokens (`n` ≥ 1), as a
    /// prompt lookup with suffixes of at least `n` tokens proposes.
    AfterSuffix(usize),
}

impl RunAnchor {
    /// Whether a run starting at `before[start]` may be proposed after `before`.
    fn allows(self, before: &[u32], start: usize) -> bool {
        match self {
            Self::Anywhere => true,
            Self::AfterSuffix(n) => {
                let n = n.max(1);
                start >= n
                    && start < before.len()
                    && before[start - n..start] == before[before.len() - n..]
            }
        }
    }
}

/// Replays `answer` with an oracle for a proposer, the fewest steps a proposer drawing on
/// `anchor`'s runs could take: a step at position p may propose any such run of the answer's
/// next tokens (at most `limit`, none past `max_tokens`, the answer's last token left to the
/// target) in the sequence before p, and the lengths are chosen over the whole answer at
/// once (a shortest path, so no proposer with the same runs to draw on takes less time).
pub fn replay_oracle(
    prompt: &[u32],
    answer: &[u32],
    limit: usize,
    max_tokens: usize,
    cost: &StepCost,
    anchor: RunAnchor,
) -> ReplayTotals {
    let len = answer.len();
    let mut totals = ReplayTotals::of(answer);
    if len < 2 {
        return totals;
    }
    let sequence: Vec<u32> = prompt.iter().chain(answer).copied().collect();
    // found[p]: the longest allowed run starting at answer[p] that occurs before it.
    let found: Vec<usize> = (0..len)
        .map(|p| {
            let room = max_tokens.saturating_sub(p + 1).min(len - p - 1);
            let next = &answer[p..p + limit.min(room)];
            let before = &sequence[..prompt.len() + p];
            (0..before.len())
                .filter(|&start| anchor.allows(before, start))
                .map(|start| kept(&before[start..], next))
                .max()
                .unwrap_or(0)
        })
        .collect();
    // least[p]: the least time to produce answer[p..]; choice[p]: the first step's k.
    let mut least = vec![0.0; len + 1];
    let mut choice = vec![0; len + 1];
    for p in (1..len).rev() {
        (least[p], choice[p]) = (0..=found[p])
            .map(|k| (cost.at(k) + least[p + k + 1], k))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or((1.0 + least[p + 1], 0));
    }
    let mut p = 1;
    while p < len {
        let k = choice[p];
        totals.step(k, k, cost);
        p += k + 1;
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(per_token: f64) -> StepCost {
        StepCost::linear(per_token, 8)
    }

    #[test]
    fn an_answer_with_nothing_to_find_costs_a_step_a_token() {
        let p = NgramProposer::new(1, 4);
        let t = replay_lookup(&p, &[1, 2, 3], &[10, 11, 12, 13], 8, 100, &flat(0.1));
        assert_eq!((t.tokens, t.verifications), (3, 0));
        assert!((t.speedup() - 1.0).abs() < 1e-12);
        for anchor in [RunAnchor::Anywhere, RunAnchor::AfterSuffix(1)] {
            let o = replay_oracle(&[1, 2, 3], &[10, 11, 12, 13], 8, 100, &flat(0.1), anchor);
            assert!((o.speedup() - 1.0).abs() < 1e-12);
            assert_eq!(
                replay_oracle(&[1], &[5], 8, 100, &flat(0.1), anchor).speedup(),
                1.0
            );
        }
        // Nothing to replay.
        assert_eq!(replay_lookup(&p, &[1], &[], 8, 100, &flat(0.1)).tokens, 0);
    }

    #[test]
    fn a_quoted_prompt_is_proposed_and_kept() {
        let p = NgramProposer::new(1, 4);
        let passage: Vec<u32> = (100..140).collect();
        let mut prompt = vec![1, 2];
        prompt.extend(&passage);
        prompt.extend([3, 4]);
        // The answer quotes the passage from its start, after the same first token.
        let answer = passage.clone();
        let cost = flat(0.05);
        let t = replay_lookup(&p, &prompt, &answer, 8, 100, &cost);
        assert_eq!(t.tokens, answer.len() - 1);
        assert!(t.verifications > 0 && t.accepted > 0);
        assert_eq!(
            t.accepted, t.proposed,
            "every proposed token is the quote's"
        );
        assert!(t.speedup() > 3.0, "{t:?}");
        // The oracle can only do better, and is bounded by 1 + limit tokens per step.
        let o = replay_oracle(&prompt, &answer, 8, 100, &cost, RunAnchor::Anywhere);
        assert!(o.speedup() >= t.speedup() - 1e-9, "{o:?} vs {t:?}");
        assert!(o.speedup() <= 9.0 / cost.at(8) + 1e-9);
    }

    #[test]
    fn the_step_count_follows_what_was_kept() {
        let p = NgramProposer::new(1, 4);
        // "5 6 7 8 9" in the prompt; the answer starts "5 6 7 8 0": after the first token the
        // lookup proposes "6 7 8 9 ...", and the answer keeps three of them.
        let prompt = [5, 6, 7, 8, 9, 1];
        let answer = [5, 6, 7, 8, 0];
        let t = replay_lookup(&p, &prompt, &answer, 4, 100, &flat(0.0));
        // Free verification: one step takes 6 7 8 and the target's 0.
        assert_eq!((t.tokens, t.verifications, t.accepted), (4, 1, 3));
        assert!((t.steps - 1.0).abs() < 1e-12);
        // max_tokens leaves room for the last token only: nothing is proposed.
        let t = replay_lookup(&p, &prompt, &answer, 4, 2, &flat(0.0));
        assert_eq!(t.verifications, 0);
        assert!((t.steps - 4.0).abs() < 1e-12);
    }

    #[test]
    fn no_lookup_takes_less_time_than_the_oracle() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(5);
        for case in 0..400 {
            let alphabet = rng.random_range(2..6);
            let mut draw =
                |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..alphabet)).collect() };
            let (prompt, answer) = (draw(1 + case % 30), draw(case % 25));
            // A rising curve with bends, as measured ones have.
            let mut points = Vec::new();
            let mut r = 1.0;
            for k in 1..=6 {
                r += [0.0, 0.05, 0.3, 0.6][(case + k) % 4];
                points.push((k, r));
            }
            let cost = StepCost::from_measured(&points, 6).unwrap();
            let (min_n, max_n) = (1 + case % 2, 2 + case % 3);
            let p = NgramProposer::new(min_n, max_n);
            let limit = 1 + case % 6;
            let max_tokens = 5 + case % 40;
            let t = replay_lookup(&p, &prompt, &answer, limit, max_tokens, &cost);
            let o = replay_oracle(
                &prompt,
                &answer,
                limit,
                max_tokens,
                &cost,
                RunAnchor::Anywhere,
            );
            let anchored = RunAnchor::AfterSuffix(min_n);
            let s = replay_oracle(&prompt, &answer, limit, max_tokens, &cost, anchored);
            assert_eq!(o.tokens, t.tokens);
            assert!(
                o.steps <= s.steps + 1e-9 && s.steps <= t.steps + 1e-9,
                "case {case}: oracle {o:?} suffix oracle {s:?} lookup {t:?}"
            );
            // Never worse than no speculation.
            assert!(o.steps <= o.tokens as f64 + 1e-9, "case {case}: {o:?}");
        }
    }

    #[test]
    fn a_suffix_oracle_proposes_only_after_a_matching_suffix() {
        // The answer resumes the prompt's "5 6 7 8" after a token (9) the prompt never had
        // before them: a run found anywhere, but after no occurrence of the last token.
        let prompt = [1, 5, 6, 7, 8, 2];
        let answer = [9, 5, 6, 7, 8];
        let cost = flat(0.0);
        let anywhere = replay_oracle(&prompt, &answer, 8, 100, &cost, RunAnchor::Anywhere);
        assert_eq!((anywhere.verifications, anywhere.accepted), (1, 3));
        assert!((anywhere.steps - 1.0).abs() < 1e-12, "{anywhere:?}");
        // After the suffix: only once the target has given 5 itself, then "6 7" and its 8.
        let after = replay_oracle(&prompt, &answer, 8, 100, &cost, RunAnchor::AfterSuffix(1));
        assert_eq!((after.verifications, after.accepted), (1, 2), "{after:?}");
        assert!((after.steps - 2.0).abs() < 1e-12, "{after:?}");
        // With the prompt holding "9 5 6 7 8", one token of suffix (9) anchors the whole run;
        // two tokens first occur once the target has given 5 (9 5), so "5" is not proposed.
        let prompt = [9, 5, 6, 7, 8, 2];
        let one = replay_oracle(&prompt, &answer, 8, 100, &cost, RunAnchor::AfterSuffix(1));
        assert_eq!(one.accepted, 3);
        let two = replay_oracle(&prompt, &answer, 8, 100, &cost, RunAnchor::AfterSuffix(2));
        assert_eq!(two.accepted, 2, "{two:?}");
        // The anchor test itself: the last two tokens (3 4) occur before index 2 only.
        let before = [3, 4, 7, 3, 4];
        assert!(RunAnchor::AfterSuffix(2).allows(&before, 2));
        assert!(!RunAnchor::AfterSuffix(2).allows(&before, 1));
        assert!(
            !RunAnchor::AfterSuffix(2).allows(&before, 5),
            "nothing follows the end"
        );
        assert!(
            !RunAnchor::AfterSuffix(9).allows(&before, 2),
            "longer than the sequence"
        );
    }

    #[test]
    fn totals_add_up() {
        let a = ReplayTotals {
            tokens: 3,
            steps: 2.0,
            verifications: 1,
            proposed: 2,
            accepted: 1,
        };
        let mut sum = a;
        sum.add(&a);
        assert_eq!((sum.tokens, sum.proposed, sum.accepted), (6, 4, 2));
        assert!((sum.speedup() - 1.5).abs() < 1e-12);
        assert_eq!(ReplayTotals::default().speedup(), 1.0);
    }
}
