//! Two `tidal runtime --queue` workers on the real default model; one is killed with
//! SIGKILL in the middle of 20 streaming greedy requests. The survivor takes its jobs over
//! after the claim timeout and resumes them: every client stream is complete and
//! uninterrupted, token for token the undisturbed run, and usage adds up to the prompt
//! once plus exactly the delivered tokens.

mod process;
mod worker_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use worker_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_and_duplicates_nothing() {
    let model = default_model();
    let queue = Queue::new("wkill").await;
    let jobs = jobs(20);
    let want = reference_run(&model, &jobs).await;

    let victim = WorkerProcess::start(&model, &queue, "victim", "30s", "2s");
    let survivor = WorkerProcess::start(&model, &queue, "survivor", "30s", "2s");
    wait_ready(&*queue.broker, &["victim", "survivor"]).await;
    for j in &jobs {
        queue.broker.enqueue(j).await.unwrap();
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let readers = {
        let (broker, jobs, delivered) = (queue.broker.clone(), jobs.clone(), delivered.clone());
        tokio::spawn(async move { read_all(broker, &jobs, delivered).await })
    };
    // Both hold 10 jobs; kill one once a fifth of all tokens went out.
    let total = (jobs.len() * MAX_TOKENS) as u64;
    while delivered.load(Ordering::Relaxed) < total / 5 {
        assert!(!readers.is_finished());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victim.signal(9);
    let got = readers.await.unwrap();
    wait_settled(&*queue.broker).await;
    let usage = usage_events(&*queue.broker).await;
    let segments = check_streams_and_billing(&jobs, &got, &want, &usage);
    assert!(
        segments.values().any(|&n| n > 1),
        "no request was taken over: {segments:?}\n{}",
        survivor.log_text()
    );
    assert!(survivor
        .log_text()
        .contains("took over a dead worker's job"));
    drop(victim);
}
