//! How many jobs a worker may claim now (pure). A worker pulls only what its engine can
//! start soon, so that jobs it cannot serve stay in the queue for other workers and the
//! queue's backlog stays an honest autoscaling signal.

use super::config::ClaimBudget;
use crate::scheduler::SchedulerStats;

/// The prefill budget in prompt tokens that `budget` means now, for [`claimable`]: `None`
/// for [`ClaimBudget::Off`]; a duration is the engine's measured prefill rate times it (at
/// least one token). Before the engine has measured its rate, one token: a fresh worker
/// claims one job at a time until its first prefill step tells it how fast it is, so a new
/// replica that comes up into a burst does not take the whole burst at once.
pub fn budget_tokens(budget: &ClaimBudget, stats: &SchedulerStats) -> Option<usize> {
    match *budget {
        ClaimBudget::Off => None,
        ClaimBudget::Tokens(n) => Some(n.get()),
        ClaimBudget::Prefill(d) => {
            let tokens = stats.prefill_tokens_per_s * d.as_secs_f64();
            // `as` saturates (and maps NaN to 0), so any rate gives a usable count.
            Some((tokens as usize).max(1))
        }
    }
}

/// Jobs to claim now, given `held` jobs (claimed and not finished), at most `max_jobs` at
/// once, the engine's last `stats`, `blocks_per_job` KV blocks set aside per job the engine
/// has not admitted yet, and an optional `prefill_budget` in prompt tokens
/// ([`budget_tokens`]).
///
/// Nothing while the engine already has sequences waiting (it is out of KV blocks or
/// sequence slots). Otherwise the free slots, bounded by the free KV blocks left once every
/// held-but-unadmitted job got its share (the stats lag behind submissions by one step).
///
/// With a prefill budget, also only as many jobs as the budget has room for: the engine's
/// queued prefill plus an estimate for each unadmitted job (the recent mean prompt) is
/// subtracted, and each new job is expected to bring the recent mean prompt too (the whole
/// budget before the engine has seen a prompt). At least one job while anything of the budget
/// is left, so a long prompt is never refused. A worker holding prefill work thus leaves the
/// rest of the queue to workers that are free (the simulator's `--claim-prefill-budget-s`
/// finding, docs/autoscaling.md).
pub fn claimable(
    held: usize,
    max_jobs: usize,
    stats: &SchedulerStats,
    blocks_per_job: usize,
    prefill_budget: Option<usize>,
) -> usize {
    if stats.num_waiting > 0 {
        return 0;
    }
    let per_job = blocks_per_job.max(1);
    let slots = max_jobs.saturating_sub(held);
    let unadmitted = held.saturating_sub(stats.num_running);
    let free = stats
        .num_free_blocks
        .saturating_sub(unadmitted.saturating_mul(per_job));
    let room = slots.min(free / per_job);
    match prefill_budget {
        None => room,
        Some(budget) => {
            let prompt = match stats.recent_prompt_tokens {
                0 => budget.max(1),
                recent => recent,
            };
            let queued = stats
                .num_prefill_tokens_pending
                .saturating_add(unadmitted.saturating_mul(prompt));
            match budget.checked_sub(queued) {
                Some(left) if left > 0 => room.min(left.div_ceil(prompt)),
                _ => 0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;
    use std::time::Duration;

    use super::*;

    fn rate(tokens_per_s: f64) -> SchedulerStats {
        SchedulerStats {
            prefill_tokens_per_s: tokens_per_s,
            ..SchedulerStats::default()
        }
    }

    #[test]
    fn budgets_in_tokens() {
        let second = ClaimBudget::Prefill(Duration::from_secs(1));
        let tokens = ClaimBudget::Tokens(NonZeroUsize::new(1469).unwrap());
        for r in [0.0, 1.0, 400.0, 1e9] {
            assert_eq!(budget_tokens(&ClaimBudget::Off, &rate(r)), None);
            assert_eq!(budget_tokens(&tokens, &rate(r)), Some(1469));
        }
        // one second of the measured rate
        assert_eq!(budget_tokens(&second, &rate(400.0)), Some(400));
        assert_eq!(budget_tokens(&second, &rate(12_345.6)), Some(12_345));
        let half = ClaimBudget::Prefill(Duration::from_millis(500));
        assert_eq!(budget_tokens(&half, &rate(400.0)), Some(200));
        // not measured yet: one token, so one job at a time
        assert_eq!(budget_tokens(&second, &rate(0.0)), Some(1));
        // never zero (a slow engine, a short budget), and no overflow or NaN surprises
        assert_eq!(budget_tokens(&second, &rate(0.3)), Some(1));
        let tiny = ClaimBudget::Prefill(Duration::from_nanos(1));
        assert_eq!(budget_tokens(&tiny, &rate(400.0)), Some(1));
        assert_eq!(
            budget_tokens(&second, &rate(f64::INFINITY)),
            Some(usize::MAX)
        );
        assert_eq!(budget_tokens(&second, &rate(f64::NAN)), Some(1));
    }

    #[test]
    fn a_fresh_worker_claims_one_job_at_a_time() {
        let budget = budget_tokens(&ClaimBudget::default(), &prefill(0, 0));
        assert_eq!(budget, Some(1));
        // nothing seen yet: one job
        assert_eq!(claimable(0, 8, &prefill(0, 0), 16, budget), 1);
        // that job claimed, not yet admitted: nothing more
        assert_eq!(claimable(1, 8, &prefill(0, 0), 16, budget), 0);
        // admitted and prefilling: nothing more
        let mut st = prefill(1000, 1000);
        st.num_running = 1;
        assert_eq!(claimable(1, 8, &st, 16, budget), 0);
        // its prefill done (it decodes): the next one
        st.num_prefill_tokens_pending = 0;
        assert_eq!(claimable(1, 8, &st, 16, budget), 1);
    }

    #[test]
    fn a_measured_rate_sets_how_much_prefill_a_worker_holds() {
        // 1,000-token prompts at 2,500 tokens/s: a second of prefill is 2.5 prompts
        let mut st = prefill(0, 1000);
        st.prefill_tokens_per_s = 2500.0;
        let budget = budget_tokens(&ClaimBudget::default(), &st);
        assert_eq!(claimable(0, 16, &st, 16, budget), 3);
        // 2,000 tokens still queued: one more
        st.num_prefill_tokens_pending = 2000;
        assert_eq!(claimable(0, 16, &st, 16, budget), 1);
        // 2,600 queued: none, while greedy takes every slot
        st.num_prefill_tokens_pending = 2600;
        assert_eq!(claimable(0, 16, &st, 16, budget), 0);
        let greedy = budget_tokens(&ClaimBudget::Off, &st);
        assert_eq!(claimable(0, 16, &st, 16, greedy), 16);
        // a faster engine holds more of the same prompts
        st.prefill_tokens_per_s = 10_000.0;
        let budget = budget_tokens(&ClaimBudget::default(), &st);
        assert_eq!(claimable(0, 16, &st, 16, budget), 8);
    }

    fn prefill(pending: usize, recent_prompt: usize) -> SchedulerStats {
        SchedulerStats {
            num_prefill_tokens_pending: pending,
            recent_prompt_tokens: recent_prompt,
            ..stats(0, 0, 1000)
        }
    }

    #[test]
    fn a_prefill_budget_claims_what_it_has_room_for() {
        let budget = Some(4096);
        // idle, prompts of ~1,000 tokens lately: five (the fifth may cross the budget, as one
        // job always may)
        assert_eq!(claimable(0, 8, &prefill(0, 1000), 16, budget), 5);
        // 3,500 tokens queued: one more job (at least one while budget is left)
        assert_eq!(claimable(0, 8, &prefill(3500, 1000), 16, budget), 1);
        // the budget is spent: nothing, however many slots are free
        assert_eq!(claimable(0, 8, &prefill(4096, 1000), 16, budget), 0);
        assert_eq!(claimable(0, 8, &prefill(9000, 1000), 16, budget), 0);
        // short prompts: the slots bound it
        assert_eq!(claimable(0, 8, &prefill(0, 20), 16, budget), 8);
        // jobs claimed but not yet in the engine count as one recent prompt each
        let mut st = prefill(1000, 1000);
        st.num_running = 1;
        assert_eq!(claimable(3, 8, &st, 16, budget), 2);
        assert_eq!(claimable(4, 8, &st, 16, budget), 1);
        assert_eq!(claimable(5, 8, &st, 16, budget), 0);
        // before the engine saw any prompt, one job at a time
        assert_eq!(claimable(0, 8, &prefill(0, 0), 16, budget), 1);
        // no budget: as before
        assert_eq!(claimable(0, 8, &prefill(9000, 1000), 16, None), 8);
    }

    fn stats(running: usize, waiting: usize, free: usize) -> SchedulerStats {
        SchedulerStats {
            num_running: running,
            num_waiting: waiting,
            num_free_blocks: free,
            num_blocks: 1000,
            ..SchedulerStats::default()
        }
    }

    #[test]
    fn an_idle_engine_takes_up_to_max_jobs() {
        assert_eq!(claimable(0, 8, &stats(0, 0, 1000), 16, None), 8);
        assert_eq!(claimable(0, 8, &stats(0, 0, 1000), 0, None), 8);
    }

    #[test]
    fn held_jobs_use_slots() {
        assert_eq!(claimable(5, 8, &stats(5, 0, 1000), 16, None), 3);
        assert_eq!(claimable(8, 8, &stats(8, 0, 1000), 16, None), 0);
        assert_eq!(claimable(9, 8, &stats(8, 0, 1000), 16, None), 0);
    }

    #[test]
    fn waiting_sequences_stop_claims() {
        assert_eq!(claimable(2, 8, &stats(1, 1, 1000), 16, None), 0);
    }

    #[test]
    fn free_blocks_bound_claims() {
        // 40 free blocks, 16 per job: two more jobs fit.
        assert_eq!(claimable(0, 8, &stats(0, 0, 40), 16, None), 2);
        // Two held jobs not yet admitted already spoke for 32 of them.
        assert_eq!(claimable(2, 8, &stats(0, 0, 40), 16, None), 0);
        // Once admitted, their blocks show in the stats instead.
        assert_eq!(claimable(2, 8, &stats(2, 0, 40), 16, None), 2);
        assert_eq!(claimable(0, 8, &stats(0, 0, 15), 16, None), 0);
    }
}
