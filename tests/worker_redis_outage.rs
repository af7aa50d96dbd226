//! Two `tidal runtime --queue` workers on the real default model stream 10 greedy requests
//! from a private Redis that goes down for 6 s mid-stream and comes back with its data (an
//! append-only file fsynced on every write, as a production Redis holding queued work
//! runs). The workers keep their sequences and retry their writes through the outage, so
//! every stream resumes within moments of Redis answering again, on the same worker (no job
//! is taken over: each worker's own heartbeats went unanswered too, so neither takes the
//! other for dead), and completes token for token as the undisturbed run, billed exactly.
//!
//! What this does not cover: a Redis restarted without persistence loses the queue and the
//! response streams themselves; a worker's next write is then refused and its client's
//! request ends with an error at the gateway (see `tests/fault_suite.rs`).

mod process;
mod services;
mod skip;
mod worker_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use services::PrivateRedis;
use worker_common::*;

/// How long Redis stays down: longer than the heartbeats' dead-after time (3 s) and than
/// a short retry loop (under a second): only `--broker-retry` rides it out.
const OUTAGE: Duration = Duration::from_secs(6);

/// Longest a stream may take, from the restart of Redis (its start-up included), to deliver
/// its next event.
const RESUME_LIMIT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_resume_promptly_after_a_redis_outage() {
    let model = default_model();
    let mut redis = match PrivateRedis::start(true).await {
        Ok(r) => r,
        Err(why) => {
            skip::skip(&why);
            return;
        }
    };
    let queue = Queue::on(&redis.url, "woutage").await;
    let jobs = jobs(10);
    let want = reference_run(&model, &jobs).await;

    let w1 = WorkerProcess::start(&model, &queue, "w1", "30s", "30s");
    let w2 = WorkerProcess::start(&model, &queue, "w2", "30s", "30s");
    wait_ready(&*queue.broker, &["w1", "w2"]).await;
    for j in &jobs {
        queue.broker.enqueue(j).await.unwrap();
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let readers = {
        let (broker, jobs, delivered) = (queue.broker.clone(), jobs.clone(), delivered.clone());
        tokio::spawn(async move { read_all_timed(broker, &jobs, delivered).await })
    };
    let total = (jobs.len() * MAX_TOKENS) as u64;
    while delivered.load(Ordering::Relaxed) < total / 5 {
        assert!(!readers.is_finished());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.stop();
    let down = Instant::now();
    tokio::time::sleep(OUTAGE).await;
    // Measured from the restart, not from the first PING answered (polled only every
    // 200 ms): a bound that includes the server's start-up.
    let restarted = Instant::now();
    redis.start_again().await;
    let timed = readers.await.unwrap();
    wait_settled(&*queue.broker).await;
    let usage = usage_events(&*queue.broker).await;
    let logs = || format!("{}\n{}", w1.log_text(), w2.log_text());
    let segments = check_streams_and_billing(&jobs, &untimed(&timed), &want, &usage);
    assert!(
        segments.values().all(|&n| n == 1),
        "a job was taken over or re-enqueued: {segments:?}\n{}",
        logs()
    );
    let longest =
        longest_resumption(&timed, down, restarted).expect("streams running at the outage");
    println!(
        "Redis down {:?}; longest wait from its restart to a stream's next event: {longest:?}",
        restarted - down
    );
    assert!(
        longest < RESUME_LIMIT,
        "a stream took {longest:?} to resume after Redis came back\n{}",
        logs()
    );
}
