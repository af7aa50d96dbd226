//! How many jobs a worker may claim now (pure). A worker pulls only what its engine can
//! start soon, so that jobs it cannot serve stay in the queue for other workers and the
//! queue's backlog stays an honest autoscaling signal.

use crate::scheduler::SchedulerStats;

/// Jobs to claim now, given `held` jobs (claimed and not finished), at most `max_jobs` at
/// once, the engine's last `stats`, and `blocks_per_job` KV blocks set aside per job the
/// engine has not admitted yet.
///
/// Nothing while the engine already has sequences waiting (it is out of KV blocks or
/// sequence slots). Otherwise the free slots, bounded by the free KV blocks left once every
/// held-but-unadmitted job got its share (the stats lag behind submissions by one step).
pub fn claimable(
    held: usize,
    max_jobs: usize,
    stats: &SchedulerStats,
    blocks_per_job: usize,
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
    slots.min(free / per_job)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(claimable(0, 8, &stats(0, 0, 1000), 16), 8);
        assert_eq!(claimable(0, 8, &stats(0, 0, 1000), 0), 8);
    }

    #[test]
    fn held_jobs_use_slots() {
        assert_eq!(claimable(5, 8, &stats(5, 0, 1000), 16), 3);
        assert_eq!(claimable(8, 8, &stats(8, 0, 1000), 16), 0);
        assert_eq!(claimable(9, 8, &stats(8, 0, 1000), 16), 0);
    }

    #[test]
    fn waiting_sequences_stop_claims() {
        assert_eq!(claimable(2, 8, &stats(1, 1, 1000), 16), 0);
    }

    #[test]
    fn free_blocks_bound_claims() {
        // 40 free blocks, 16 per job: two more jobs fit.
        assert_eq!(claimable(0, 8, &stats(0, 0, 40), 16), 2);
        // Two held jobs not yet admitted already spoke for 32 of them.
        assert_eq!(claimable(2, 8, &stats(0, 0, 40), 16), 0);
        // Once admitted, their blocks show in the stats instead.
        assert_eq!(claimable(2, 8, &stats(2, 0, 40), 16), 2);
        assert_eq!(claimable(0, 8, &stats(0, 0, 15), 16), 0);
    }
}
