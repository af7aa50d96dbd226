//! Two `tidal runtime --queue` workers on the real default model; one gets SIGTERM with a
//! short drain timeout in the middle of 20 streaming greedy requests. It re-enqueues its
//! unfinished jobs with what they delivered and exits cleanly; the other worker continues
//! the same streams: every stream complete, token for token the undisturbed run, and usage
//! adds up to the prompt once plus exactly the delivered tokens. The same again with the
//! drain started by the pod's preStop hook (`GET /drain`) instead of the signal.

mod process;
mod worker_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use worker_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drain_requeues_and_the_other_worker_continues() {
    drain_mid_stream(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_drain_requeues_and_the_other_worker_continues() {
    drain_mid_stream(true).await;
}

async fn drain_mid_stream(prestop: bool) {
    let model = default_model();
    let queue = Queue::new(if prestop { "wprestop" } else { "wdrain" }).await;
    let jobs = jobs(20);
    let want = reference_run(&model, &jobs).await;

    let mut leaving = WorkerProcess::start(&model, &queue, "leaving", "200ms", "30s");
    let staying = WorkerProcess::start(&model, &queue, "staying", "200ms", "30s");
    wait_ready(&*queue.broker, &["leaving", "staying"]).await;
    for j in &jobs {
        queue.broker.enqueue(j).await.unwrap();
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let readers = {
        let (broker, jobs, delivered) = (queue.broker.clone(), jobs.clone(), delivered.clone());
        tokio::spawn(async move { read_all(broker, &jobs, delivered).await })
    };
    let total = (jobs.len() * MAX_TOKENS) as u64;
    while delivered.load(Ordering::Relaxed) < total / 5 {
        assert!(!readers.is_finished());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if prestop {
        let r = reqwest::get(format!("http://127.0.0.1:{}/drain", leaving.port))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["jobs"], 0, "{body}");
    } else {
        leaving.signal(15);
    }
    // The leaving worker tells the others it is draining. Its last beat stays until the
    // others judge it dead (three missed beats), so look now, not after the streams end.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen_draining = false;
    while !seen_draining && std::time::Instant::now() < deadline {
        let beats = queue.broker.workers(MODEL_ID).await.unwrap();
        seen_draining = beats.iter().any(|b| b.worker == "leaving" && b.draining);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen_draining,
        "the leaving worker never advertised draining"
    );
    let code = tokio::task::block_in_place(|| leaving.wait(Duration::from_secs(60)));
    assert_eq!(code, Some(0), "{}", leaving.log_text());
    assert!(
        leaving.log_text().contains("re-enqueued job"),
        "nothing was re-enqueued:\n{}",
        leaving.log_text()
    );
    let got = readers.await.unwrap();
    wait_settled(&*queue.broker).await;
    let usage = usage_events(&*queue.broker).await;
    let segments = check_streams_and_billing(&jobs, &got, &want, &usage);
    assert!(segments.values().any(|&n| n > 1), "{segments:?}");
    drop(staying);
}
