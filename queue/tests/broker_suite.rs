//! The one conformance suite, run against the in-process broker and against Redis
//! (`TIDAL_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`; started if down).

mod support;

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = crate::support::harness::MemoryHarness::new();
                    crate::support::cases::$case(&h).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = crate::support::harness::RedisHarness::new().await;
                    crate::support::cases::$case(&h).await;
                }
            )*
        }
    };
}

suite!(
    enqueue_claim_ack,
    claims_are_bounded_and_fifo,
    claim_blocks_until_a_job_arrives,
    consumers_never_share_a_job,
    take_over_after_claim_timeout,
    requeue_resumes_the_stream,
    read_after_seq_never_duplicates,
    response_streams_expire,
    withdraw_before_and_after_start,
    withdraw_races_claim,
    expired_jobs_are_never_run,
    cancellation,
    usage_events_at_least_once,
    depth_figures,
    heartbeats,
    pool_heartbeats,
    pool_assignments,
    model_records,
    purge_model,
    takeover_continues_the_stream,
    resumed_jobs_go_first,
    keep_alive_prevents_takeover,
    cancel_flags_in_one_call,
    cancel_carries_the_delivered_seq,
    request_records,
    idempotent_submits,
    prompt_tokens_are_counted,
    decoding_jobs_are_counted,
    take_over_dead_consumers,
    held_appends_are_fenced,
    holders_of_entries,
);
