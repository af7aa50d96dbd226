//! Preemption-safe generation with in-process workers on a tiny model, against the
//! in-process broker and real Redis: a drained worker re-enqueues its unfinished jobs and a
//! crashed worker's jobs are taken over; either way every client stream is one complete,
//! uninterrupted greedy output (checked against the engine alone) and the usage events add
//! up to the prompt once plus exactly the delivered tokens. A worker that generates longer
//! than the claim timeout keeps its jobs.

mod worker_common;

use std::time::Duration;

use tidal_runtime::model::TinySpec;
use worker_common::*;

macro_rules! both_brokers {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Harness::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Harness::redis().await).await;
                }
            )*
        }
    };
}

both_brokers!(
    drained_jobs_resume_on_another_worker,
    crashed_workers_jobs_are_taken_over_and_resumed,
    long_generations_are_kept_alive,
);

const LONG: Duration = Duration::from_secs(120);
const JOBS: usize = 4;
const MAX_TOKENS: usize = 160;

/// Runs JOBS long jobs on worker `w1` until it delivered some tokens, stops it with `stop`,
/// finishes them with worker `w2`, and checks every stream and the billing.
async fn interrupt_and_resume(h: Harness, crash: bool) {
    let (_dir, model) = tiny_model_stepwise(&slow_spec());
    let b = h.broker.clone();
    let prompts = prompts(JOBS);
    let mut want = Vec::new();
    for p in &prompts {
        want.push(reference(&model, p, MAX_TOKENS).await);
    }
    let jobs: Vec<_> = prompts.iter().map(|p| job("m", p, MAX_TOKENS)).collect();
    let first = spawn_worker(model.clone(), b.clone(), test_config("m", "w1"));
    for j in &jobs {
        b.enqueue(j).await.unwrap();
    }
    let status = first.status.clone();
    // every job claimed by w1 (on a busy machine it can deliver 8 tokens a job on average
    // before it has claimed the last one) and some tokens delivered
    wait_until("w1 delivering", LONG, || {
        let s = status.summary();
        s.claimed >= JOBS as u64 && s.tokens_delivered >= (JOBS * 8) as u64
    })
    .await;
    let stopped = if crash {
        first.crash().await
    } else {
        first.shutdown().await
    };
    assert!(
        stopped.completed < JOBS as u64,
        "w1 finished everything: {stopped:?}"
    );
    if !crash {
        assert!(stopped.requeued > 0, "{stopped:?}");
        assert_eq!(stopped.requeued + stopped.completed, JOBS as u64);
    }
    let second = spawn_worker(model.clone(), b.clone(), test_config("m", "w2"));
    for (j, (ids, text)) in jobs.iter().zip(&want) {
        let events = read_to_end(&*b, j.id, LONG).await;
        assert_complete(&events);
        let (got_ids, got_text) = delivered(&events);
        let first_diff = got_ids.iter().zip(ids).position(|(a, b)| a != b);
        assert!(
            first_diff.is_none() && got_ids.len() == ids.len() && &got_text == text,
            "request {}: {} tokens, want {}, first difference at {first_diff:?}",
            j.id,
            got_ids.len(),
            ids.len()
        );
    }
    let summary = second.shutdown().await;
    if crash {
        assert!(summary.taken_over > 0, "{summary:?}");
    }
    let usage = usage_events(&*b).await;
    let by = usage_by_request(&usage);
    for (j, p) in jobs.iter().zip(&prompts) {
        assert_billed(&by, j.id, p.len() as u64, MAX_TOKENS as u64);
    }
    // Some request ran in more than one segment.
    assert!(by.values().any(|segs| segs.len() > 1), "{by:?}");
    let d = b.depth("m").await.unwrap();
    assert_eq!((d.backlog, d.in_flight, d.decoding), (0, 0, 0));
}

async fn drained_jobs_resume_on_another_worker(h: Harness) {
    interrupt_and_resume(h, false).await;
}

async fn crashed_workers_jobs_are_taken_over_and_resumed(h: Harness) {
    interrupt_and_resume(h, true).await;
}

/// Short enough that the generation below outlives it several times; long enough that a
/// keep-alive (every quarter of it) is not missed four times in a row on a loaded 2-core
/// machine (200 ms was, once, in a full `cargo test` run).
const CLAIM_TIMEOUT: Duration = Duration::from_millis(800);

/// Tokens the generation below asks for: nearly the whole 4,096-token context.
const LONG_GENERATION: usize = 4000;

/// A generation that runs several claim timeouts is renewed by its worker: a second
/// worker scanning for dead workers' jobs never takes it.
async fn long_generations_are_kept_alive(h: Harness) {
    // Twice the layers of `slow_spec`: on an idle fast machine 3,000 tokens of it took
    // 2.3 s, under the three claim timeouts this test needs; this takes about 6 s there.
    let (_dir, model) = tiny_model(&TinySpec {
        layers: 8,
        ..slow_spec()
    });
    let b = h.broker.clone();
    let mut config = test_config("m", "w1");
    config.claim_timeout = CLAIM_TIMEOUT;
    let w1 = spawn_worker(model.clone(), b.clone(), config.clone());
    let j = job("m", &prompts(1)[0], LONG_GENERATION);
    b.enqueue(&j).await.unwrap();
    let status = w1.status.clone();
    wait_until("w1 claimed", LONG, || status.held() == 1).await;
    // once its first token is out, the broker counts it as decoding (for the autoscaler)
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let d = b.depth("m").await.unwrap();
        if (d.in_flight, d.decoding) == (1, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never decoding: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    config.name = "w2".into();
    let w2 = spawn_worker(model.clone(), b.clone(), config);
    let started = std::time::Instant::now();
    let events = read_to_end(&*b, j.id, LONG).await;
    assert!(
        started.elapsed() > 3 * CLAIM_TIMEOUT,
        "the generation was too short to test keep-alive: {:?}",
        started.elapsed()
    );
    assert_complete(&events);
    let s1 = w1.shutdown().await;
    let s2 = w2.shutdown().await;
    assert_eq!((s1.completed, s1.lost), (1, 0));
    assert_eq!((s2.taken_over, s2.claimed), (0, 0));
    let by = usage_by_request(&usage_events(&*b).await);
    assert_eq!(by[&j.id].len(), 1);
    assert_billed(&by, j.id, 6, LONG_GENERATION as u64);
    assert_eq!(b.depth("m").await.unwrap().decoding, 0, "acked");
}
