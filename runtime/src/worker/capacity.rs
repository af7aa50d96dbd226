//! How many jobs a worker may claim now (pure). A worker pulls only what its engine can
//! start soon, so that jobs it cannot serve stay in the queue for other workers and the
//! queue's backlog stays an honest autoscaling signal.

use crate::scheduler::SchedulerStats;

/// Jobs to claim now, given `held` jobs (claimed and not finished), at most `max_jobs` at
/// once, the engine's last `stats`, `blocks_per_job` KV blocks set aside per job the engine
/// has not admitted yet, and an optional `prefill_budget` in prompt tokens.
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
    use super::*;

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
