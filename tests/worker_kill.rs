//! Two `tidal runtime --queue` workers on the real default model; one is killed with
//! SIGKILL in the middle of 20 streaming greedy requests. The survivor sees the victim's
//! heartbeats stop and takes its jobs over within seconds (the claim timeout is 30 s here,
//! so only the heartbeats can make it that quick) and resumes them: every client stream is
//! complete and uninterrupted, token for token the undisturbed run, usage adds up to the
//! prompt once plus exactly the delivered tokens, and no stream waits long for its next
//! token.

mod process;
mod worker_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use worker_common::*;

/// Longest a stream may wait for its next token after the kill: the victim is presumed
/// dead 3 s after its last heartbeat (1 s beats, 3 missed), found within a scan interval,
/// and its jobs re-prefilled on the survivor once it has room.
const RESUME_LIMIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_and_duplicates_nothing() {
    let model = default_model();
    let queue = Queue::new("wkill").await;
    let jobs = jobs(20);
    let want = reference_run(&model, &jobs).await;

    let victim = WorkerProcess::start(&model, &queue, "victim", "30s", "30s");
    let survivor = WorkerProcess::start(&model, &queue, "survivor", "30s", "30s");
    wait_ready(&*queue.broker, &["victim", "survivor"]).await;
    for j in &jobs {
        queue.broker.enqueue(j).await.unwrap();
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let readers = {
        let (broker, jobs, delivered) = (queue.broker.clone(), jobs.clone(), delivered.clone());
        tokio::spawn(async move { read_all_timed(broker, &jobs, delivered).await })
    };
    // Both hold 10 jobs; kill one once a fifth of all tokens went out.
    let total = (jobs.len() * MAX_TOKENS) as u64;
    while delivered.load(Ordering::Relaxed) < total / 5 {
        assert!(!readers.is_finished());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victim.signal(9);
    let killed = Instant::now();
    let timed = readers.await.unwrap();
    wait_settled(&*queue.broker).await;
    let usage = usage_events(&*queue.broker).await;
    let segments = check_streams_and_billing(&jobs, &untimed(&timed), &want, &usage);
    assert!(
        segments.values().any(|&n| n > 1),
        "no request was taken over: {segments:?}\n{}",
        survivor.log_text()
    );
    let survivor_log = survivor.log_text();
    assert!(survivor_log.contains("took over a dead worker's job"));
    // The live worker was never taken for dead: it lost no job and was never fenced.
    assert!(
        !survivor_log.contains("no longer held by this worker")
            && !survivor_log.contains("another worker writes this request now"),
        "{survivor_log}"
    );
    let longest = longest_resumption(&timed, killed, killed).expect("streams running at the kill");
    println!("longest wait from the kill to a stream's next token: {longest:?}");
    assert!(
        longest < RESUME_LIMIT,
        "a stream waited {longest:?} for its next token after the kill\n{}",
        survivor.log_text()
    );
    drop(victim);
}
