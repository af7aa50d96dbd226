//! The conformance cases both brokers must pass. Each takes a fresh harness.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_queue::{
    Broker, CachedModel, CapacityType, ClaimedJob, FailedLoad, FinishReason, Idempotency, Job,
    ModelRecord, ModelState, PoolHeartbeat, PoolLoadedModel, Prices, QueueError, RequestRecord,
    ResponseEvent, Resume, Submitted, Usage, UsageEvent, Withdrawal, WorkerHeartbeat,
};
use uuid::Uuid;

use super::harness::{Harness, REQUEST_TTL, RESPONSE_TTL};

const NO_WAIT: Duration = Duration::ZERO;
const CLAIM_TIMEOUT: Duration = Duration::from_millis(300);

fn model() -> String {
    format!("ns/m-{}", Uuid::now_v7())
}

fn job(h: &dyn Harness, model: &str) -> Job {
    let now = h.now_ms();
    Job {
        id: Uuid::now_v7(),
        tenant: "acme".into(),
        model: model.into(),
        body: serde_json::json!({"prompt": "hello", "max_tokens": 8, "seed": 1}),
        enqueued_at_ms: now,
        deadline_ms: now + 60_000,
        resume: None,
    }
}

fn delta(seq: u64, text: &str, ids: &[u32]) -> ResponseEvent {
    ResponseEvent::delta(seq, text, ids.to_vec())
}

fn done(seq: u64) -> ResponseEvent {
    ResponseEvent::Done {
        seq,
        finish_reason: FinishReason::Stop,
        usage: Usage {
            prompt_tokens: 3,
            cached_prompt_tokens: 0,
            completion_tokens: 2,
        },
    }
}

fn usage(segment: u32) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        segment,
        tenant: "acme".into(),
        model: "m".into(),
        prompt_tokens: 10,
        cached_prompt_tokens: 4,
        completion_tokens: 7,
        worker: "w1".into(),
        capacity_type: CapacityType::Spot,
        started_at_ms: 1,
        ended_at_ms: 2,
        last: false,
    }
}

fn seqs(evs: &[ResponseEvent]) -> Vec<u64> {
    evs.iter().map(ResponseEvent::seq).collect()
}

async fn enqueue_all(b: &dyn Broker, jobs: &[Job]) -> Vec<String> {
    let mut ids = Vec::new();
    for j in jobs {
        ids.push(b.enqueue(j).await.unwrap());
    }
    ids
}

/// A claimed job is the enqueued one, pending until acked; a second ack is refused.
pub async fn enqueue_claim_ack(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    let entry = b.enqueue(&j).await.unwrap();
    let got = b.claim(&m, "w1", 4, NO_WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!(c.job, j);
    assert_eq!(c.entry_id, entry);
    assert_eq!((c.consumer.as_str(), c.attempt, c.segment()), ("w1", 1, 0));
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight, d.oldest_wait_ms), (0, 1, None));
    b.ack(c).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (0, 0));
    assert!(b.claim(&m, "w1", 4, NO_WAIT).await.unwrap().is_empty());
    assert!(matches!(b.ack(c).await, Err(QueueError::NotOwner { .. })));
}

/// Claims return at most N jobs, oldest first.
pub async fn claims_are_bounded_and_fifo(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let jobs: Vec<Job> = (0..5).map(|_| job(h, &m)).collect();
    enqueue_all(&*b, &jobs).await;
    let first = b.claim(&m, "w1", 2, NO_WAIT).await.unwrap();
    let rest = b.claim(&m, "w1", 10, NO_WAIT).await.unwrap();
    assert_eq!((first.len(), rest.len()), (2, 3));
    let order: Vec<Uuid> = first.iter().chain(&rest).map(|c| c.job.id).collect();
    let want: Vec<Uuid> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(order, want);
    assert!(b.claim(&m, "w1", 0, NO_WAIT).await.unwrap().is_empty());
}

/// A blocking claim returns as soon as a job arrives, and empty after its timeout.
pub async fn claim_blocks_until_a_job_arrives(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let t = Instant::now();
    assert!(b
        .claim(&m, "w1", 1, Duration::from_millis(200))
        .await
        .unwrap()
        .is_empty());
    assert!(t.elapsed() >= Duration::from_millis(150));

    let j = job(h, &m);
    let b2 = b.clone();
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { b2.claim(&m2, "w1", 1, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    b.enqueue(&j).await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.id, j.id);
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// Concurrent consumers split the jobs: every job once, none twice.
pub async fn consumers_never_share_a_job(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let jobs: Vec<Job> = (0..40).map(|_| job(h, &m)).collect();
    enqueue_all(&*b, &jobs).await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let b = b.clone();
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = b.claim(&m, &format!("w{w}"), 3, NO_WAIT).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                for c in got {
                    mine.push(c.job.id);
                    b.ack(&c).await.unwrap();
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.len(), 40);
    let unique: HashSet<Uuid> = all.into_iter().collect();
    let want: HashSet<Uuid> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(unique, want);
}

/// A dead consumer's job is taken over after the claim timeout, not before; the presumed
/// dead consumer can then neither ack nor re-enqueue it.
pub async fn take_over_after_claim_timeout(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    b.enqueue(&j).await.unwrap();
    let dead = b.claim(&m, "dead", 1, NO_WAIT).await.unwrap().remove(0);
    assert!(b
        .take_over(&m, "live", CLAIM_TIMEOUT, 10)
        .await
        .unwrap()
        .is_empty());
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let taken = b.take_over(&m, "live", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    let t = &taken[0];
    assert_eq!(t.job, j);
    assert_eq!(t.entry_id, dead.entry_id);
    assert_eq!(
        (t.consumer.as_str(), t.attempt, t.segment()),
        ("live", 2, 1)
    );
    // Just taken over: not idle, nobody else gets it.
    assert!(b
        .take_over(&m, "third", CLAIM_TIMEOUT, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        b.ack(&dead).await,
        Err(QueueError::NotOwner { .. })
    ));
    assert!(matches!(
        b.requeue(&dead, Resume::default()).await,
        Err(QueueError::NotOwner { .. })
    ));
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 1);
    b.ack(t).await.unwrap();
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 0);
}

/// A draining worker re-enqueues with resume state; the next worker continues the same
/// response stream at the right seq, and the old holder is fenced off.
pub async fn requeue_resumes_the_stream(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    b.enqueue(&j).await.unwrap();
    let first = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    b.append_response(j.id, &delta(1, "Hel", &[10, 11]))
        .await
        .unwrap();
    b.append_response(j.id, &delta(2, "lo", &[12]))
        .await
        .unwrap();
    let written = b.read_responses(j.id, 0, 100, NO_WAIT).await.unwrap();
    let resume = Resume::from_events(&written);
    b.requeue(&first, resume.clone()).await.unwrap();
    assert!(matches!(
        b.ack(&first).await,
        Err(QueueError::NotOwner { .. })
    ));
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (1, 0));

    let second = b.claim(&m, "w2", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(second.job.id, j.id);
    let r = second.job.resume.clone().unwrap();
    assert_eq!(r.token_ids, vec![10, 11, 12]);
    assert_eq!((r.text_len, r.last_seq, r.segments), (5, 2, 1));
    assert_eq!(second.segment(), 1);
    // The old holder replaying seq 2 is refused; the resumer continues at 3.
    assert!(matches!(
        b.append_response(j.id, &delta(2, "lo", &[12])).await,
        Err(QueueError::SeqConflict {
            seq: 2,
            last: 2,
            ..
        })
    ));
    b.append_response(j.id, &delta(r.last_seq + 1, "!", &[13]))
        .await
        .unwrap();
    b.append_response(j.id, &done(4)).await.unwrap();
    let all = b.read_responses(j.id, 0, 100, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&all), vec![1, 2, 3, 4]);
    assert!(matches!(
        b.append_response(j.id, &delta(5, "x", &[1])).await,
        Err(QueueError::ResponseFinished { .. })
    ));
    // A second re-enqueue counts segments on.
    let third_entry = b.requeue(&second, r).await.unwrap();
    let third = b.claim(&m, "w3", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(third.entry_id, third_entry);
    assert_eq!(third.segment(), 2);
    b.ack(&third).await.unwrap();
}

/// Reading after seq S returns only later events, in order, each once; gaps and replays are
/// refused; a blocked reader wakes on the next append.
pub async fn read_after_seq_never_duplicates(h: &dyn Harness) {
    let b = h.broker();
    let id = Uuid::now_v7();
    assert!(b
        .read_responses(id, 0, 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
    for s in 1..=5 {
        b.append_response(id, &delta(s, "t", &[s as u32]))
            .await
            .unwrap();
    }
    assert_eq!(
        seqs(&b.read_responses(id, 0, 2, NO_WAIT).await.unwrap()),
        vec![1, 2]
    );
    assert_eq!(
        seqs(&b.read_responses(id, 2, 10, NO_WAIT).await.unwrap()),
        vec![3, 4, 5]
    );
    assert!(b
        .read_responses(id, 5, 10, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());
    for bad in [3, 5, 7] {
        assert!(matches!(
            b.append_response(id, &delta(bad, "t", &[])).await,
            Err(QueueError::SeqConflict { last: 5, .. })
        ));
    }
    let b2 = b.clone();
    let reader =
        tokio::spawn(async move { b2.read_responses(id, 5, 10, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    b.append_response(id, &done(6)).await.unwrap();
    let got = reader.await.unwrap().unwrap();
    assert_eq!(got, vec![done(6)]);
    assert!(t.elapsed() < Duration::from_secs(2));
    b.delete_responses(id).await.unwrap();
    assert!(b
        .read_responses(id, 0, 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
}

/// A response stream expires once its TTL passes without appends.
pub async fn response_streams_expire(h: &dyn Harness) {
    let b = h.broker();
    let id = Uuid::now_v7();
    b.append_response(id, &delta(1, "a", &[1])).await.unwrap();
    h.advance(RESPONSE_TTL / 2).await;
    b.append_response(id, &delta(2, "b", &[2])).await.unwrap();
    h.advance(RESPONSE_TTL * 3 / 4).await;
    // Renewed by the second append: still there.
    assert_eq!(b.read_responses(id, 0, 10, NO_WAIT).await.unwrap().len(), 2);
    h.advance(RESPONSE_TTL).await;
    assert!(b
        .read_responses(id, 0, 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
}

/// A withdrawn job is never claimed; withdrawing a started job is refused.
pub async fn withdraw_before_and_after_start(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let gone = job(h, &m);
    let kept = job(h, &m);
    let gone_entry = b.enqueue(&gone).await.unwrap();
    b.enqueue(&kept).await.unwrap();
    assert_eq!(
        b.withdraw(&m, gone.id, &gone_entry).await.unwrap(),
        Withdrawal::Withdrawn
    );
    assert_eq!(
        b.withdraw(&m, gone.id, &gone_entry).await.unwrap(),
        Withdrawal::Withdrawn
    );
    assert_eq!(b.depth(&m).await.unwrap().backlog, 1);
    let got = b.claim(&m, "w1", 10, NO_WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.id, kept.id);
    assert_eq!(
        b.withdraw(&m, kept.id, &got[0].entry_id).await.unwrap(),
        Withdrawal::AlreadyStarted
    );
    b.ack(&got[0]).await.unwrap();
    assert_eq!(
        b.withdraw(&m, kept.id, &got[0].entry_id).await.unwrap(),
        Withdrawal::AlreadyStarted
    );
    assert!(b.claim(&m, "w1", 10, NO_WAIT).await.unwrap().is_empty());
    // Withdrawn by request id with a stale entry id: still never handed out (the gate,
    // not the deletion, is what guarantees it).
    let stray = job(h, &m);
    b.enqueue(&stray).await.unwrap();
    assert_eq!(
        b.withdraw(&m, stray.id, &"1-1".to_owned()).await.unwrap(),
        Withdrawal::Withdrawn
    );
    assert!(b.claim(&m, "w1", 10, NO_WAIT).await.unwrap().is_empty());
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (0, 0));
}

/// Withdraw racing claim: exactly one wins, every time.
pub async fn withdraw_races_claim(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let mut outcomes = (0, 0);
    for _ in 0..40 {
        let j = job(h, &m);
        let entry = b.enqueue(&j).await.unwrap();
        let (bc, bw) = (b.clone(), b.clone());
        let (mc, mw) = (m.clone(), m.clone());
        let claim = tokio::spawn(async move { bc.claim(&mc, "w1", 1, NO_WAIT).await });
        let withdraw = tokio::spawn(async move { bw.withdraw(&mw, j.id, &entry).await });
        let claimed = claim.await.unwrap().unwrap();
        let w = withdraw.await.unwrap().unwrap();
        match w {
            Withdrawal::Withdrawn => {
                assert!(claimed.is_empty(), "withdrawn job was handed out");
                outcomes.0 += 1;
            }
            Withdrawal::AlreadyStarted => {
                assert_eq!(claimed.len(), 1);
                assert_eq!(claimed[0].job.id, j.id);
                b.ack(&claimed[0]).await.unwrap();
                outcomes.1 += 1;
            }
        }
        assert!(b.claim(&m, "w2", 1, NO_WAIT).await.unwrap().is_empty());
    }
    assert_eq!(outcomes.0 + outcomes.1, 40);
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (0, 0));
}

/// A job past its deadline before it started is never run, and withdrawing it still says so.
pub async fn expired_jobs_are_never_run(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let mut late = job(h, &m);
    late.deadline_ms = h.now_ms() + 200;
    let entry = b.enqueue(&late).await.unwrap();
    h.advance(Duration::from_millis(400)).await;
    assert!(b.claim(&m, "w1", 10, NO_WAIT).await.unwrap().is_empty());
    assert_eq!(
        b.withdraw(&m, late.id, &entry).await.unwrap(),
        Withdrawal::Withdrawn
    );
    // A started job keeps running past its deadline (its re-enqueue too).
    let mut slow = job(h, &m);
    slow.deadline_ms = h.now_ms() + 200;
    b.enqueue(&slow).await.unwrap();
    let c = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    h.advance(Duration::from_millis(400)).await;
    b.requeue(&c, Resume::default()).await.unwrap();
    let again = b.claim(&m, "w2", 1, NO_WAIT).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job.id, slow.id);
    b.ack(&again[0]).await.unwrap();
}

/// Cancel flags: a queued cancelled job is dropped; a running one is still handed over on
/// takeover (its worker checks the flag between steps).
pub async fn cancellation(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let queued = job(h, &m);
    assert!(!b.is_cancelled(queued.id).await.unwrap());
    b.enqueue(&queued).await.unwrap();
    b.cancel(queued.id, 0).await.unwrap();
    assert!(b.is_cancelled(queued.id).await.unwrap());
    assert!(b.claim(&m, "w1", 10, NO_WAIT).await.unwrap().is_empty());
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 0);

    let running = job(h, &m);
    b.enqueue(&running).await.unwrap();
    let c = b.claim(&m, "dead", 1, NO_WAIT).await.unwrap().remove(0);
    b.cancel(running.id, 0).await.unwrap();
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let t: Vec<ClaimedJob> = b.take_over(&m, "live", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].job.id, c.job.id);
    assert!(b.is_cancelled(t[0].job.id).await.unwrap());
    b.ack(&t[0]).await.unwrap();
}

/// Usage events: delivered at least once until acked; a dead billing consumer's events are
/// taken over.
pub async fn usage_events_at_least_once(h: &dyn Harness) {
    let b = h.broker();
    let evs: Vec<UsageEvent> = (0..3).map(usage).collect();
    for e in &evs {
        b.publish_usage(e).await.unwrap();
    }
    let got = b.read_usage("billing-1", 10, NO_WAIT).await.unwrap();
    assert_eq!(got.iter().map(|d| d.event.clone()).collect::<Vec<_>>(), evs);
    b.ack_usage(&[got[0].entry_id.clone(), got[1].entry_id.clone()])
        .await
        .unwrap();
    // Not acked: delivered again (as after a crash before the ack).
    let again = b.read_usage("billing-1", 10, NO_WAIT).await.unwrap();
    assert_eq!(again, vec![got[2].clone()]);
    b.ack_usage(&[got[2].entry_id.clone()]).await.unwrap();
    assert!(b
        .read_usage("billing-1", 10, Duration::from_millis(50))
        .await
        .unwrap()
        .is_empty());
    // Another consumer does not see billing-1's events.
    let late = usage(7);
    b.publish_usage(&late).await.unwrap();
    let one = b.read_usage("billing-1", 10, NO_WAIT).await.unwrap();
    assert_eq!(one.len(), 1);
    assert!(b
        .read_usage("billing-2", 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .take_over_usage("billing-2", CLAIM_TIMEOUT, 10)
        .await
        .unwrap()
        .is_empty());
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let taken = b
        .take_over_usage("billing-2", CLAIM_TIMEOUT, 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].event, late);
    b.ack_usage(&[taken[0].entry_id.clone()]).await.unwrap();
    assert!(b
        .read_usage("billing-1", 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .read_usage("billing-2", 10, NO_WAIT)
        .await
        .unwrap()
        .is_empty());
}

/// Backlog, in-flight and oldest wait as jobs arrive, wait, get claimed and withdrawn.
pub async fn depth_figures(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    assert_eq!(b.depth(&m).await.unwrap(), Default::default());
    let jobs: Vec<Job> = (0..4).map(|_| job(h, &m)).collect();
    let entries = enqueue_all(&*b, &jobs).await;
    h.advance(Duration::from_millis(500)).await;
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (4, 0));
    let wait = d.oldest_wait_ms.unwrap();
    assert!((500..5_000).contains(&wait), "oldest wait {wait}");
    let c = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (3, 1));
    // Withdrawing a queued job that is not the oldest (leaves a hole in the backlog).
    b.withdraw(&m, jobs[2].id, &entries[2]).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (2, 1));
    b.ack(&c[0]).await.unwrap();
    let rest = b.claim(&m, "w1", 10, NO_WAIT).await.unwrap();
    assert_eq!(rest.len(), 2);
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight, d.oldest_wait_ms), (0, 2, None));
}

fn beat(model: &str, worker: &str, running: u32, last_seen_ms: u64) -> WorkerHeartbeat {
    WorkerHeartbeat {
        worker: worker.into(),
        model: model.into(),
        running,
        waiting: 0,
        free_kv_blocks: 100,
        capacity_type: CapacityType::OnDemand,
        draining: false,
        last_seen_ms,
    }
}

/// Heartbeats are written, replaced, listed by worker and expired when stale.
pub async fn heartbeats(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let now = h.now_ms();
    assert!(b.workers(&m).await.unwrap().is_empty());
    b.heartbeat(&beat(&m, "w2", 1, now - 10_000)).await.unwrap();
    b.heartbeat(&beat(&m, "w1", 1, now)).await.unwrap();
    b.heartbeat(&beat(&m, "w1", 3, now)).await.unwrap();
    let ws = b.workers(&m).await.unwrap();
    assert_eq!(
        ws,
        vec![beat(&m, "w1", 3, now), beat(&m, "w2", 1, now - 10_000)]
    );
    let gone = b
        .expire_workers(&m, now, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(gone, vec!["w2".to_owned()]);
    assert_eq!(b.workers(&m).await.unwrap(), vec![beat(&m, "w1", 3, now)]);
    assert!(b.workers(&model()).await.unwrap().is_empty());
}

fn pool_beat(pool: &str, worker: &str, models: &[&str], last_seen_ms: u64) -> PoolHeartbeat {
    PoolHeartbeat {
        worker: worker.into(),
        pool: pool.into(),
        node: "node-1".into(),
        capacity_type: CapacityType::Spot,
        memory_total_bytes: 1 << 30,
        memory_free_bytes: (1 << 30) - (models.len() as u64) * (100 << 20),
        loaded: models
            .iter()
            .map(|m| PoolLoadedModel {
                model: (*m).into(),
                bytes: 100 << 20,
                running: 1,
                waiting: 0,
                last_used_ms: last_seen_ms,
                tokens_delivered: 3,
            })
            .collect(),
        loading: vec!["ns/loading".into()],
        unloading: vec![],
        cached: vec![CachedModel {
            model: "ns/cached".into(),
            bytes: 100 << 20,
            sha256: Some("ab".repeat(32)),
            warm: false,
        }],
        failed: vec![FailedLoad {
            model: "ns/broken".into(),
            error: "sha256 differs".into(),
        }],
        draining: false,
        last_seen_ms,
    }
}

/// Pool heartbeats: written, replaced, listed by worker, kept apart per pool, and expired
/// with their assignments.
pub async fn pool_heartbeats(h: &dyn Harness) {
    let b = h.broker();
    let pool = format!("p-{}", Uuid::now_v7());
    let other = format!("p-{}", Uuid::now_v7());
    let now = h.now_ms();
    assert!(b.pool_workers(&pool).await.unwrap().is_empty());
    b.pool_heartbeat(&pool_beat(&pool, "w2", &["ns/a"], now - 10_000))
        .await
        .unwrap();
    b.pool_heartbeat(&pool_beat(&pool, "w1", &["ns/a"], now))
        .await
        .unwrap();
    b.pool_heartbeat(&pool_beat(&pool, "w1", &["ns/a", "ns/b"], now))
        .await
        .unwrap();
    b.pool_heartbeat(&pool_beat(&other, "w9", &[], now - 10_000))
        .await
        .unwrap();
    assert_eq!(
        b.pool_workers(&pool).await.unwrap(),
        vec![
            pool_beat(&pool, "w1", &["ns/a", "ns/b"], now),
            pool_beat(&pool, "w2", &["ns/a"], now - 10_000)
        ]
    );
    b.set_pool_assignment(&pool, "w2", &["ns/a".into()])
        .await
        .unwrap();
    b.set_pool_assignment(&pool, "w1", &["ns/b".into()])
        .await
        .unwrap();
    let gone = b
        .expire_pool_workers(&pool, now, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(gone, vec!["w2".to_owned()]);
    assert_eq!(
        b.pool_workers(&pool).await.unwrap(),
        vec![pool_beat(&pool, "w1", &["ns/a", "ns/b"], now)]
    );
    // the stale worker's assignment went with it; the live one's stays
    assert_eq!(b.pool_assignment(&pool, "w2").await.unwrap(), None);
    assert_eq!(
        b.pool_assignment(&pool, "w1").await.unwrap(),
        Some(vec!["ns/b".to_owned()])
    );
    // nothing stale: nothing removed; other pools untouched
    assert!(b
        .expire_pool_workers(&pool, now, Duration::from_secs(5))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(b.pool_workers(&other).await.unwrap().len(), 1);
    // a beat that names no pool is refused
    let mut bad = pool_beat(&pool, "w3", &[], now);
    bad.pool = String::new();
    assert!(matches!(
        b.pool_heartbeat(&bad).await,
        Err(QueueError::Invalid(_))
    ));
}

/// Pool assignments: absent until written, replaced whole, listed per pool, checked.
pub async fn pool_assignments(h: &dyn Harness) {
    let b = h.broker();
    let pool = format!("p-{}", Uuid::now_v7());
    assert_eq!(b.pool_assignment(&pool, "w1").await.unwrap(), None);
    assert!(b.pool_assignments(&pool).await.unwrap().is_empty());
    let ab = vec!["ns/a".to_owned(), "ns/b".to_owned()];
    b.set_pool_assignment(&pool, "w1", &ab).await.unwrap();
    assert_eq!(b.pool_assignment(&pool, "w1").await.unwrap(), Some(ab));
    b.set_pool_assignment(&pool, "w1", &["ns/b".into()])
        .await
        .unwrap();
    b.set_pool_assignment(&pool, "w2", &[]).await.unwrap();
    // an empty assignment is kept: it says "hold nothing", unlike none at all
    assert_eq!(b.pool_assignment(&pool, "w2").await.unwrap(), Some(vec![]));
    let all = b.pool_assignments(&pool).await.unwrap();
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        vec![
            ("w1".to_owned(), vec!["ns/b".to_owned()]),
            ("w2".to_owned(), vec![])
        ]
    );
    for bad in [
        vec!["ns/a".to_owned(), "ns/a".to_owned()],
        vec![String::new()],
        vec!["a b".to_owned()],
    ] {
        assert!(
            matches!(
                b.set_pool_assignment(&pool, "w1", &bad).await,
                Err(QueueError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        b.set_pool_assignment("", "w1", &[]).await,
        Err(QueueError::Invalid(_))
    ));
    // refused writes changed nothing
    assert_eq!(
        b.pool_assignment(&pool, "w1").await.unwrap(),
        Some(vec!["ns/b".to_owned()])
    );
    let other = format!("p-{}", Uuid::now_v7());
    assert!(b.pool_assignments(&other).await.unwrap().is_empty());
}

fn record(id: &str, state: ModelState) -> ModelRecord {
    ModelRecord {
        id: id.into(),
        state,
        prices: Prices {
            currency: "USD".into(),
            input_per_mtok_micros: 150_000,
            cached_input_per_mtok_micros: 75_000,
            output_per_mtok_micros: 600_000,
        },
        max_queue_wait_ms: 30_000,
        backlog_cap: 1_000,
        context_length: 4096,
    }
}

/// Model records: put, get, list by id, replace, remove.
pub async fn model_records(h: &dyn Harness) {
    let b = h.broker();
    assert!(b.models().await.unwrap().is_empty());
    assert_eq!(b.model("ns/b").await.unwrap(), None);
    b.put_model(&record("ns/b", ModelState::Ready))
        .await
        .unwrap();
    b.put_model(&record("ns/a", ModelState::ScaledToZero))
        .await
        .unwrap();
    assert_eq!(
        b.model("ns/b").await.unwrap(),
        Some(record("ns/b", ModelState::Ready))
    );
    b.put_model(&record("ns/a", ModelState::Starting))
        .await
        .unwrap();
    assert_eq!(
        b.models().await.unwrap(),
        vec![
            record("ns/a", ModelState::Starting),
            record("ns/b", ModelState::Ready)
        ]
    );
    assert!(b.remove_model("ns/a").await.unwrap());
    assert!(!b.remove_model("ns/a").await.unwrap());
    assert_eq!(b.models().await.unwrap().len(), 1);
}

/// Purging a model removes its queue and heartbeats, nothing else.
pub async fn purge_model(h: &dyn Harness) {
    let b = h.broker();
    let (m, other) = (model(), model());
    b.enqueue(&job(h, &m)).await.unwrap();
    b.enqueue(&job(h, &other)).await.unwrap();
    b.heartbeat(&beat(&m, "w1", 0, h.now_ms())).await.unwrap();
    b.purge_model(&m).await.unwrap();
    assert_eq!(b.depth(&m).await.unwrap(), Default::default());
    assert!(b.workers(&m).await.unwrap().is_empty());
    assert!(b.claim(&m, "w1", 10, NO_WAIT).await.unwrap().is_empty());
    assert_eq!(b.depth(&other).await.unwrap().backlog, 1);
}

/// A worker killed mid-stream: the taker rebuilds resume state from the response stream and
/// the reader sees one uninterrupted stream.
pub async fn takeover_continues_the_stream(h: &dyn Harness) {
    let b: Arc<dyn Broker> = h.broker();
    let m = model();
    let j = job(h, &m);
    b.enqueue(&j).await.unwrap();
    let dead = b.claim(&m, "dead", 1, NO_WAIT).await.unwrap().remove(0);
    b.append_response(j.id, &delta(1, "a", &[1])).await.unwrap();
    // The reader has delivered seq 1.
    let seen = b.read_responses(j.id, 0, 10, NO_WAIT).await.unwrap();
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let live = b
        .take_over(&m, "live", CLAIM_TIMEOUT, 1)
        .await
        .unwrap()
        .remove(0);
    let so_far = b
        .read_responses(live.job.id, 0, 1000, NO_WAIT)
        .await
        .unwrap();
    let r = Resume::from_events(&so_far);
    assert_eq!((r.token_ids.clone(), r.last_seq), (vec![1], 1));
    b.append_response(j.id, &delta(2, "b", &[2])).await.unwrap();
    // The dead worker comes back to life and tries to continue: fenced.
    assert!(b.append_response(j.id, &delta(2, "x", &[9])).await.is_err());
    b.append_response(j.id, &done(3)).await.unwrap();
    b.ack(&live).await.unwrap();
    assert!(b.ack(&dead).await.is_err());
    let rest = b.read_responses(j.id, 1, 10, NO_WAIT).await.unwrap();
    let mut all = seen;
    all.extend(rest);
    assert_eq!(all, vec![delta(1, "a", &[1]), delta(2, "b", &[2]), done(3)]);
}

/// Re-enqueued jobs are claimed (and taken over) before fresh ones, and count in the depth.
pub async fn resumed_jobs_go_first(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let jobs: Vec<Job> = (0..3).map(|_| job(h, &m)).collect();
    enqueue_all(&*b, &jobs).await;
    let first = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(first.job.id, jobs[0].id);
    b.requeue(&first, Resume::default()).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight), (3, 0));
    let got = b.claim(&m, "dead", 2, NO_WAIT).await.unwrap();
    let ids: Vec<Uuid> = got.iter().map(|c| c.job.id).collect();
    assert_eq!(ids, vec![jobs[0].id, jobs[1].id]);
    assert_eq!((got[0].segment(), got[1].segment()), (1, 0));
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 2);
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let taken = b.take_over(&m, "live", CLAIM_TIMEOUT, 10).await.unwrap();
    let ids: Vec<Uuid> = taken.iter().map(|c| c.job.id).collect();
    assert_eq!(ids, vec![jobs[0].id, jobs[1].id]);
    assert_eq!((taken[0].attempt, taken[0].segment()), (2, 2));
    assert_eq!((taken[1].attempt, taken[1].segment()), (2, 1));
    assert!(matches!(
        b.ack(&got[0]).await,
        Err(QueueError::NotOwner { .. })
    ));
    for t in &taken {
        b.ack(t).await.unwrap();
    }
    let last = b.claim(&m, "live", 10, NO_WAIT).await.unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].job.id, jobs[2].id);
    b.ack(&last[0]).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    assert_eq!((d.backlog, d.in_flight, d.oldest_wait_ms), (0, 0, None));
}

/// A holder's keep-alive restarts its jobs' idle time, so a long generation is not taken
/// over; it is no new delivery. Once an entry is taken over (or gone), keep-alive says
/// the old holder lost it. Fresh and resumed jobs are answered in one call, in order.
pub async fn keep_alive_prevents_takeover(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let jobs: Vec<Job> = (0..3).map(|_| job(h, &m)).collect();
    enqueue_all(&*b, &jobs).await;
    let first = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    b.requeue(&first, Resume::default()).await.unwrap();
    // One resumed and two fresh jobs, all held by w1.
    let held = b.claim(&m, "w1", 3, NO_WAIT).await.unwrap();
    assert_eq!(held.len(), 3);
    assert!(held[0].job.resume.is_some());
    assert_eq!(b.keep_alive(&[]).await.unwrap(), Vec::<bool>::new());
    for _ in 0..2 {
        h.advance(CLAIM_TIMEOUT * 2 / 3).await;
        assert_eq!(b.keep_alive(&held).await.unwrap(), vec![true; 3]);
    }
    // Longer than the claim timeout since the claim, but not since the last keep-alive.
    assert!(b
        .take_over(&m, "w2", CLAIM_TIMEOUT, 10)
        .await
        .unwrap()
        .is_empty());
    // Only the holder can keep an entry alive.
    let mut impostor = held[1].clone();
    impostor.consumer = "w2".into();
    assert_eq!(b.keep_alive(&[impostor]).await.unwrap(), vec![false]);
    // w1 stops renewing job 1: it is taken over, as a second delivery.
    h.advance(CLAIM_TIMEOUT * 2 / 3).await;
    assert_eq!(
        b.keep_alive(&[held[0].clone(), held[2].clone()])
            .await
            .unwrap(),
        vec![true, true]
    );
    h.advance(CLAIM_TIMEOUT * 2 / 3).await;
    let taken = b.take_over(&m, "w2", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].job.id, taken[0].attempt), (held[1].job.id, 2));
    assert_eq!(b.keep_alive(&held).await.unwrap(), vec![true, false, true]);
    b.ack(&held[0]).await.unwrap();
    assert_eq!(b.keep_alive(&held).await.unwrap(), vec![false, false, true]);
    for c in [&held[2], &taken[0]] {
        b.ack(c).await.unwrap();
    }
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 0);
}

/// Cancel flags of many requests come back in one call, in order.
pub async fn cancel_flags_in_one_call(h: &dyn Harness) {
    let b = h.broker();
    let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    assert_eq!(b.cancelled(&[]).await.unwrap(), Vec::<Option<u64>>::new());
    assert_eq!(b.cancelled(&ids).await.unwrap(), vec![None; 4]);
    b.cancel(ids[1], 0).await.unwrap();
    b.cancel(ids[3], 7).await.unwrap();
    assert_eq!(
        b.cancelled(&ids).await.unwrap(),
        vec![None, Some(0), None, Some(7)]
    );
    assert_eq!(
        b.cancelled(&[ids[3], ids[0]]).await.unwrap(),
        vec![Some(7), None]
    );
}

/// A cancel carries the seq of the last response event the client was handed: the flag
/// keeps the largest such seq, the request's record goes, and its response stream stays so
/// that the worker can end it and bill the deltas up to that seq.
pub async fn cancel_carries_the_delivered_seq(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    enqueued(b.submit(&j, &record_of(h, &j)).await.unwrap());
    let c = b.claim(&m, "w", 1, NO_WAIT).await.unwrap().remove(0);
    for seq in 1..=3 {
        b.append_response(j.id, &delta(seq, "a", &[seq as u32]))
            .await
            .unwrap();
    }
    b.cancel(j.id, 2).await.unwrap();
    assert_eq!(b.cancelled(&[j.id]).await.unwrap(), vec![Some(2)]);
    assert!(b.is_cancelled(j.id).await.unwrap());
    assert_eq!(b.request(j.id).await.unwrap(), None, "the record goes");
    let stream = b.read_responses(j.id, 0, 10, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&stream), vec![1, 2, 3], "the stream stays");
    // Its worker goes on writing to it: the cancelled event ends it.
    let end = ResponseEvent::Error {
        seq: 4,
        status: 499,
        code: "cancelled".into(),
        param: None,
        message: "the request was cancelled".into(),
    };
    b.append_response(j.id, &end).await.unwrap();
    // Another reader going away later: the larger seq wins, a smaller one changes nothing.
    b.cancel(j.id, 1).await.unwrap();
    assert_eq!(b.cancelled(&[j.id]).await.unwrap(), vec![Some(2)]);
    b.cancel(j.id, 3).await.unwrap();
    assert_eq!(b.cancelled(&[j.id]).await.unwrap(), vec![Some(3)]);
    b.ack(&c).await.unwrap();
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 0);
}

/// The record of job `j` as the gateway writes it (the broker fills in the entry id).
fn record_of(h: &dyn Harness, j: &Job) -> RequestRecord {
    RequestRecord {
        id: j.id,
        tenant: j.tenant.clone(),
        model: j.model.clone(),
        entry_id: String::new(),
        endpoint: "chat".into(),
        include_usage: true,
        logprobs: false,
        idempotency: None,
        deadline_ms: j.deadline_ms,
        created_at_ms: h.now_ms(),
    }
}

/// [`record_of`] sent with idempotency key `key`.
fn keyed(h: &dyn Harness, j: &Job, key: &str) -> RequestRecord {
    RequestRecord {
        idempotency: Some(Idempotency {
            key: key.into(),
            fingerprint: "f1".into(),
        }),
        ..record_of(h, j)
    }
}

fn enqueued(s: Submitted) -> String {
    match s {
        Submitted::Enqueued(entry) => entry,
        other => panic!("expected a new entry, got {other:?}"),
    }
}

/// A submitted request's job is claimable and its record reads back whole, with the job's
/// entry, until forgotten or expired; an id is recorded once.
pub async fn request_records(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let (kept, forgotten) = (job(h, &m), job(h, &m));
    assert_eq!(b.request(kept.id).await.unwrap(), None);
    let entry = enqueued(b.submit(&kept, &record_of(h, &kept)).await.unwrap());
    enqueued(
        b.submit(&forgotten, &record_of(h, &forgotten))
            .await
            .unwrap(),
    );
    let want = RequestRecord {
        entry_id: entry.clone(),
        ..record_of(h, &kept)
    };
    let got = b.request(kept.id).await.unwrap().unwrap();
    assert_eq!(
        RequestRecord {
            created_at_ms: want.created_at_ms,
            ..got.clone()
        },
        want
    );
    let again = b.submit(&kept, &record_of(h, &kept)).await.unwrap_err();
    assert!(matches!(again, QueueError::Invalid(_)), "{again:?}");
    assert_eq!(
        b.request(kept.id).await.unwrap(),
        Some(got.clone()),
        "unchanged"
    );
    let claimed = b.claim(&m, "w", 10, NO_WAIT).await.unwrap();
    let entries: Vec<&str> = claimed.iter().map(|c| c.entry_id.as_str()).collect();
    assert_eq!(claimed.len(), 2, "the refused duplicate enqueued nothing");
    assert!(entries.contains(&entry.as_str()));

    b.append_response(forgotten.id, &delta(1, "a", &[1]))
        .await
        .unwrap();
    assert!(b.forget_request(forgotten.id).await.unwrap());
    assert!(!b.forget_request(forgotten.id).await.unwrap());
    assert_eq!(b.request(forgotten.id).await.unwrap(), None);
    let stream = b
        .read_responses(forgotten.id, 0, 10, NO_WAIT)
        .await
        .unwrap();
    assert!(
        stream.is_empty(),
        "the response stream goes with the record"
    );
    assert_eq!(b.request(kept.id).await.unwrap(), Some(got));

    h.advance(REQUEST_TTL + Duration::from_millis(100)).await;
    assert_eq!(b.request(kept.id).await.unwrap(), None, "expired");
    assert!(!b.forget_request(kept.id).await.unwrap());
}

/// With an idempotency key, a tenant's second submit enqueues nothing and names the first
/// request (with its record while kept); the key is per tenant and lives `request_ttl`.
pub async fn idempotent_submits(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let first = job(h, &m);
    let entry = enqueued(b.submit(&first, &keyed(h, &first, "k1")).await.unwrap());
    let retry = job(h, &m);
    match b.submit(&retry, &keyed(h, &retry, "k1")).await.unwrap() {
        Submitted::Duplicate { id, record } => {
            assert_eq!(id, first.id);
            let record = record.expect("the first request's record");
            assert_eq!(
                (record.id, record.entry_id.as_str()),
                (first.id, entry.as_str())
            );
        }
        other => panic!("a retry must not enqueue: {other:?}"),
    }
    assert_eq!(
        b.request(retry.id).await.unwrap(),
        None,
        "the retry is not recorded"
    );
    // Another key, another tenant with the same key, and no key at all: new requests.
    let other_key = job(h, &m);
    enqueued(
        b.submit(&other_key, &keyed(h, &other_key, "k2"))
            .await
            .unwrap(),
    );
    let other_tenant = Job {
        tenant: "globex".into(),
        ..job(h, &m)
    };
    enqueued(
        b.submit(&other_tenant, &keyed(h, &other_tenant, "k1"))
            .await
            .unwrap(),
    );
    let keyless = job(h, &m);
    enqueued(b.submit(&keyless, &record_of(h, &keyless)).await.unwrap());
    let claimed = b.claim(&m, "w", 10, NO_WAIT).await.unwrap();
    let ids: HashSet<Uuid> = claimed.iter().map(|c| c.job.id).collect();
    let want: HashSet<Uuid> = [first.id, other_key.id, other_tenant.id, keyless.id].into();
    assert_eq!(ids, want, "exactly one job per key and tenant");

    // Released only by the request it names, and only while that request is recorded.
    b.release_idempotency_key("acme", "k1", retry.id)
        .await
        .unwrap();
    assert!(matches!(
        b.submit(&retry, &keyed(h, &retry, "k1")).await.unwrap(),
        Submitted::Duplicate { .. }
    ));
    b.release_idempotency_key("acme", "k1", first.id)
        .await
        .unwrap();
    let fresh = job(h, &m);
    enqueued(b.submit(&fresh, &keyed(h, &fresh, "k1")).await.unwrap());
    // Answered and forgotten: the key still names that request, without a record, and can
    // no longer be released (a late retry must not run it again).
    b.forget_request(fresh.id).await.unwrap();
    b.release_idempotency_key("acme", "k1", fresh.id)
        .await
        .unwrap();
    let again = job(h, &m);
    assert_eq!(
        b.submit(&again, &keyed(h, &again, "k1")).await.unwrap(),
        Submitted::Duplicate {
            id: fresh.id,
            record: None
        }
    );
    // After `request_ttl` a key is free again.
    let late = job(h, &m);
    h.advance(REQUEST_TTL + Duration::from_millis(100)).await;
    enqueued(b.submit(&late, &keyed(h, &late, "k2")).await.unwrap());
}

/// Every job enqueued or submitted adds its prompt-token estimate to the model's counter (the
/// autoscaler's prefill sizing), and so does every job re-enqueued or taken over, which its
/// next worker prefills again (a re-enqueued job with the tokens it delivered); a duplicate
/// submit adds nothing.
pub async fn prompt_tokens_are_counted(h: &dyn Harness) {
    let b = h.broker();
    let (m, other) = (model(), model());
    assert_eq!(b.depth(&m).await.unwrap().arrived_prompt_tokens, 0);
    let plain = job(h, &m); // "hello": 5 bytes, 2 tokens
    b.enqueue(&plain).await.unwrap();
    let long = Job {
        body: serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(396)}]}),
        ..job(h, &m)
    };
    // 4 bytes of role + 396 of content: 100 tokens
    enqueued(b.submit(&long, &keyed(h, &long, "p1")).await.unwrap());
    let retry = Job {
        body: long.body.clone(),
        ..job(h, &m)
    };
    assert!(matches!(
        b.submit(&retry, &keyed(h, &retry, "p1")).await.unwrap(),
        Submitted::Duplicate { .. }
    ));
    b.enqueue(&job(h, &other)).await.unwrap();
    assert_eq!(b.depth(&m).await.unwrap().arrived_prompt_tokens, 102);
    let claimed = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(claimed.job.id, plain.id);
    let delivered = Resume {
        token_ids: vec![7, 8, 9],
        ..Resume::default()
    };
    b.requeue(&claimed, delivered).await.unwrap();
    let d = b.depth(&m).await.unwrap();
    // "hello" again, and the 3 tokens delivered before the requeue
    assert_eq!((d.backlog, d.arrived_prompt_tokens), (2, 107));
    // both claimed (the resumed job first) by a worker that dies, and taken over: its
    // successor prefills the long prompt (100) and the resumed one (2 + 3) again
    let dead = b.claim(&m, "dead", 2, NO_WAIT).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert_eq!(b.depth(&m).await.unwrap().arrived_prompt_tokens, 107);
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let taken = b.take_over(&m, "live", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(taken.len(), 2);
    assert_eq!(b.depth(&m).await.unwrap().arrived_prompt_tokens, 212);
    assert_eq!(b.depth(&other).await.unwrap().arrived_prompt_tokens, 2);
}

/// A job whose first token is out counts as decoding until it is acked, re-enqueued or taken
/// over; only its holder can mark it, and purging the model forgets the marks.
pub async fn decoding_jobs_are_counted(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let decoding = |d: tidal_queue::QueueDepth| (d.in_flight, d.decoding);
    for _ in 0..4 {
        b.enqueue(&job(h, &m)).await.unwrap();
    }
    let held = b.claim(&m, "w1", 4, NO_WAIT).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (4, 0));
    for j in &held[..3] {
        b.mark_decoding(j).await.unwrap();
    }
    // marking twice counts once
    b.mark_decoding(&held[0]).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (4, 3));
    // another consumer cannot mark a job it does not hold
    let stranger = ClaimedJob {
        consumer: "w2".into(),
        ..held[3].clone()
    };
    assert!(matches!(
        b.mark_decoding(&stranger).await,
        Err(QueueError::NotOwner { .. })
    ));
    b.ack(&held[0]).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (3, 2));
    // re-enqueued: the next worker prefills it again, and the resumed job is not decoding
    b.requeue(&held[1], Resume::default()).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (2, 1));
    let resumed = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(resumed.job.id, held[1].job.id);
    b.mark_decoding(&resumed).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (3, 2));
    // w1 dies: the taker prefills all three again
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    let taken = b.take_over(&m, "w3", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(taken.len(), 3);
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (3, 0));
    // the dead worker's late mark is refused, the taker's counts
    assert!(b.mark_decoding(&held[2]).await.is_err());
    b.mark_decoding(&taken[0]).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (3, 1));
    b.purge_model(&m).await.unwrap();
    assert_eq!(decoding(b.depth(&m).await.unwrap()), (0, 0));
}

/// A consumer whose heartbeat is stale has its pending jobs taken over at once, however
/// recently it renewed them (resumed jobs first, at most `max` per call); a consumer with a
/// fresh heartbeat keeps its jobs, the taker never takes its own, and a consumer that never
/// wrote a heartbeat is left to the claim-timeout takeover.
pub async fn take_over_dead_consumers(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let jobs: Vec<Job> = (0..4).map(|_| job(h, &m)).collect();
    enqueue_all(&*b, &jobs).await;
    let first = b.claim(&m, "dead", 1, NO_WAIT).await.unwrap().remove(0);
    b.requeue(&first, Resume::default()).await.unwrap();
    // dead holds the resumed job 0 and job 1, fresh holds job 2, ghost job 3
    let dead = b.claim(&m, "dead", 2, NO_WAIT).await.unwrap();
    let ids: Vec<Uuid> = dead.iter().map(|c| c.job.id).collect();
    assert_eq!(ids, vec![jobs[0].id, jobs[1].id]);
    let fresh = b.claim(&m, "fresh", 1, NO_WAIT).await.unwrap().remove(0);
    let ghost = b.claim(&m, "ghost", 1, NO_WAIT).await.unwrap().remove(0);
    let now = h.now_ms();
    let dead_after = Duration::from_secs(3);
    b.heartbeat(&beat(&m, "dead", 2, now - 3_001))
        .await
        .unwrap();
    b.heartbeat(&beat(&m, "fresh", 1, now - 3_000))
        .await
        .unwrap();
    // Nobody is stale yet at the moment dead last beat plus dead_after.
    assert!(b
        .take_over_dead(&m, "fresh", now - 1, dead_after, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(b.keep_alive(&dead).await.unwrap(), vec![true, true]);
    let one = b
        .take_over_dead(&m, "fresh", now, dead_after, 1)
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0].job.id, one[0].consumer.as_str(), one[0].attempt),
        (jobs[0].id, "fresh", 2)
    );
    assert_eq!(one[0].segment(), 2);
    let names = |beats: Vec<tidal_queue::WorkerHeartbeat>| {
        let mut n: Vec<String> = beats.into_iter().map(|b| b.worker).collect();
        n.sort();
        n
    };
    // dead still holds job 1: its heartbeat stays
    assert_eq!(names(b.workers(&m).await.unwrap()), ["dead", "fresh"]);
    let rest = b
        .take_over_dead(&m, "fresh", now, dead_after, 10)
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!((rest[0].job.id, rest[0].attempt), (jobs[1].id, 2));
    // dead holds nothing now: forgotten, so dead workers do not pile up
    assert_eq!(names(b.workers(&m).await.unwrap()), ["fresh"]);
    // fresh's own job and the ghost's are where they were; the dead one lost both
    assert_eq!(
        b.keep_alive(&[fresh.clone(), ghost.clone()]).await.unwrap(),
        vec![true, true]
    );
    assert_eq!(b.keep_alive(&dead).await.unwrap(), vec![false, false]);
    assert!(matches!(
        b.ack(&dead[1]).await,
        Err(QueueError::NotOwner { .. })
    ));
    // fresh is now the holder nobody may take from while it beats; the dead one has nothing
    assert!(b
        .take_over_dead(&m, "third", now, dead_after, 10)
        .await
        .unwrap()
        .is_empty());
    // once fresh goes stale too, a third consumer takes everything it holds
    let later = now + 5_000;
    b.heartbeat(&beat(&m, "third", 0, later)).await.unwrap();
    let all = b
        .take_over_dead(&m, "third", later, dead_after, 10)
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = all.iter().map(|c| c.job.id).collect();
    ids.sort();
    let mut want = vec![jobs[0].id, jobs[1].id, jobs[2].id];
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(names(b.workers(&m).await.unwrap()), ["third"]);
    // the ghost never beat: only the claim timeout hands its job on
    h.advance(CLAIM_TIMEOUT + Duration::from_millis(100)).await;
    assert_eq!(b.keep_alive(&all).await.unwrap(), vec![true; 3]);
    let backstop = b.take_over(&m, "third", CLAIM_TIMEOUT, 10).await.unwrap();
    assert_eq!(backstop.len(), 1);
    assert_eq!((backstop[0].job.id, backstop[0].attempt), (ghost.job.id, 2));
    for c in all.iter().chain(&backstop) {
        b.ack(c).await.unwrap();
    }
    assert_eq!(b.depth(&m).await.unwrap().in_flight, 0);
}

/// A holder's appends succeed only while it holds the entry: once the job is taken over,
/// acked or re-enqueued, the old holder's write is refused with `NotOwner` and the stream
/// is unchanged, so a worker presumed dead stops at its next write. The seq and end rules
/// still hold for the holder.
pub async fn held_appends_are_fenced(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    b.enqueue(&j).await.unwrap();
    let w1 = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    b.append_held(&w1, &delta(1, "a", &[1])).await.unwrap();
    assert!(matches!(
        b.append_held(&w1, &delta(3, "c", &[3])).await,
        Err(QueueError::SeqConflict { last: 1, .. })
    ));
    // an impostor naming the entry is refused
    let impostor = ClaimedJob {
        consumer: "w9".into(),
        ..w1.clone()
    };
    assert!(matches!(
        b.append_held(&impostor, &delta(2, "x", &[9])).await,
        Err(QueueError::NotOwner { .. })
    ));
    // w1 stops beating and w2 takes the job over: w1's next write is refused
    b.heartbeat(&beat(&m, "w1", 1, h.now_ms() - 10_000))
        .await
        .unwrap();
    let w2 = b
        .take_over_dead(&m, "w2", h.now_ms(), Duration::from_secs(3), 1)
        .await
        .unwrap()
        .remove(0);
    assert!(matches!(
        b.append_held(&w1, &delta(2, "x", &[9])).await,
        Err(QueueError::NotOwner { .. })
    ));
    assert_eq!(
        seqs(&b.read_responses(j.id, 0, 10, NO_WAIT).await.unwrap()),
        [1]
    );
    // the taker re-enqueues it: the entry is gone, so nobody writes through it any more
    let so_far = b.read_responses(j.id, 0, 10, NO_WAIT).await.unwrap();
    b.requeue(&w2, Resume::from_events(&so_far)).await.unwrap();
    assert!(matches!(
        b.append_held(&w2, &delta(2, "x", &[9])).await,
        Err(QueueError::NotOwner { .. })
    ));
    let w3 = b.claim(&m, "w3", 1, NO_WAIT).await.unwrap().remove(0);
    b.append_held(&w3, &delta(2, "b", &[2])).await.unwrap();
    b.append_held(&w3, &done(3)).await.unwrap();
    assert!(matches!(
        b.append_held(&w3, &delta(4, "x", &[9])).await,
        Err(QueueError::ResponseFinished { .. })
    ));
    b.ack(&w3).await.unwrap();
    assert!(matches!(
        b.append_held(&w3, &delta(4, "x", &[9])).await,
        Err(QueueError::NotOwner { .. })
    ));
    let all = b.read_responses(j.id, 0, 10, NO_WAIT).await.unwrap();
    assert_eq!(all, vec![delta(1, "a", &[1]), delta(2, "b", &[2]), done(3)]);
}

/// `holder` names the consumer a job's entry is pending for, through claim, takeover,
/// re-enqueue (the old entry is no one's; the resumed one is its claimer's) and ack, and
/// `None` once the entry is gone, even with its whole stream (data lost).
pub async fn holders_of_entries(h: &dyn Harness) {
    let b = h.broker();
    let m = model();
    let j = job(h, &m);
    b.enqueue(&j).await.unwrap();
    let w1 = b.claim(&m, "w1", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(b.holder(&w1).await.unwrap().as_deref(), Some("w1"));
    b.heartbeat(&beat(&m, "w1", 1, h.now_ms() - 10_000))
        .await
        .unwrap();
    let w2 = b
        .take_over_dead(&m, "w2", h.now_ms(), Duration::from_secs(3), 1)
        .await
        .unwrap()
        .remove(0);
    // the same entry, asked about by its old holder or its taker
    assert_eq!(b.holder(&w1).await.unwrap().as_deref(), Some("w2"));
    assert_eq!(b.holder(&w2).await.unwrap().as_deref(), Some("w2"));
    b.requeue(&w2, Resume::default()).await.unwrap();
    assert_eq!(b.holder(&w1).await.unwrap(), None);
    let w3 = b.claim(&m, "w3", 1, NO_WAIT).await.unwrap().remove(0);
    assert!(w3.job.resume.is_some());
    assert_eq!(b.holder(&w3).await.unwrap().as_deref(), Some("w3"));
    b.ack(&w3).await.unwrap();
    assert_eq!(b.holder(&w3).await.unwrap(), None);
    // the model's streams gone altogether
    let k = job(h, &m);
    b.enqueue(&k).await.unwrap();
    let w4 = b.claim(&m, "w4", 1, NO_WAIT).await.unwrap().remove(0);
    assert_eq!(b.holder(&w4).await.unwrap().as_deref(), Some("w4"));
    b.purge_model(&m).await.unwrap();
    assert_eq!(b.holder(&w4).await.unwrap(), None);
    // a model that never had a stream
    let never = ClaimedJob {
        job: job(h, &model()),
        ..w4
    };
    assert_eq!(b.holder(&never).await.unwrap(), None);
}
