//! The queue worker on tiny models, against the in-process broker and real Redis, driven
//! the way the gateway drives it (enqueue `Job`s with `JobRequest` bodies, read response
//! streams) and checked the way billing reads usage.

mod worker_common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_queue::{clock::system_now_ms, Broker, ResponseEvent, UsageEvent, Withdrawal};
use tidal_runtime::server::LoadedModel;
use tidal_runtime::worker::{ClaimBudget, SharedPrefix};
use uuid::Uuid;
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
    jobs_stream_exactly_and_bill_once,
    cancellation_frees_the_sequence,
    a_cancel_bills_exactly_the_deltas_the_client_was_handed,
    a_job_taken_over_after_a_cancel_bills_what_was_handed,
    a_job_the_queue_lost_bills_what_was_delivered,
    tenants_never_share_cached_prompt_blocks,
    prepare_errors_are_one_error_event,
    jobs_wait_for_a_worker_and_withdrawn_jobs_never_run,
);

const LONG: Duration = Duration::from_secs(60);

/// Several concurrent jobs: each stream is the engine's greedy output, seqs consecutive,
/// one usage event per request with the prompt and every token; nothing left pending.
async fn jobs_stream_exactly_and_bill_once(h: Harness) {
    let (_dir, model) = tiny_model(&fast_spec());
    let b = h.broker.clone();
    let worker = spawn_worker(model.clone(), b.clone(), test_config("m", "w1"));
    let prompts = prompts(6);
    let jobs: Vec<_> = prompts.iter().map(|p| job("m", p, 16)).collect();
    for j in &jobs {
        b.enqueue(j).await.unwrap();
    }
    for (j, p) in jobs.iter().zip(&prompts) {
        let events = read_to_end(&*b, j.id, LONG).await;
        assert_complete(&events);
        let (ids, text) = delivered(&events);
        assert_eq!((ids, text), reference(&model, p, 16).await);
    }
    let summary = worker.shutdown().await;
    assert_eq!((summary.claimed, summary.completed), (6, 6));
    assert_eq!(summary.tokens_delivered, 6 * 16);
    let usage = usage_events(&*b).await;
    assert_eq!(usage.len(), 6, "{usage:?}");
    let by = usage_by_request(&usage);
    for (j, p) in jobs.iter().zip(&prompts) {
        assert_billed(&by, j.id, p.len() as u64, 16);
        let e = &by[&j.id][&0];
        assert_eq!((e.worker.as_str(), e.tenant.as_str()), ("w1", "bench"));
    }
    assert_eq!(b.depth("m").await.unwrap().in_flight, 0);
    let beats = b.workers("m").await.unwrap();
    assert_eq!(beats.len(), 1);
    assert!(beats[0].draining, "the last heartbeat says draining");
}

/// A cancelled request stops at once: `cancelled` ends its stream, its sequence and KV
/// blocks are freed, what was delivered is billed, and the job is acked.
async fn cancellation_frees_the_sequence(h: Harness) {
    let (_dir, model) = tiny_model(&slow_spec());
    let b = h.broker.clone();
    let worker = spawn_worker(model.clone(), b.clone(), test_config("m", "w1"));
    let j = job("m", &prompts(1)[0], 3000);
    b.enqueue(&j).await.unwrap();
    let status = worker.status.clone();
    wait_until("first tokens", LONG, || {
        status.summary().tokens_delivered > 0
    })
    .await;
    // a reader that was handed every event written
    b.cancel(j.id, u64::MAX).await.unwrap();
    let events = read_to_end(&*b, j.id, LONG).await;
    let (ids, _) = delivered(&events);
    assert!(ids.len() < 3000);
    match events.last() {
        Some(ResponseEvent::Error { code, status, .. }) => {
            assert_eq!((code.as_str(), *status), ("cancelled", 499))
        }
        other => panic!("expected cancelled, got {other:?}"),
    }
    let engine = model.engine.clone();
    wait_until("sequence freed", LONG, || {
        let s = engine.stats();
        s.num_running == 0 && s.num_waiting == 0 && s.num_free_blocks == s.num_blocks
    })
    .await;
    let summary = worker.shutdown().await;
    assert_eq!(summary.cancelled, 1);
    let by = usage_by_request(&usage_events(&*b).await);
    assert_billed(&by, j.id, 6, ids.len() as u64);
    assert_eq!(b.depth("m").await.unwrap().in_flight, 0);
}

/// Reads request `id`'s stream until it holds at least `n` events.
async fn read_until(b: &dyn Broker, id: Uuid, n: usize) -> Vec<ResponseEvent> {
    let deadline = Instant::now() + LONG;
    let mut out: Vec<ResponseEvent> = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "{n} events of {id}: {out:?}");
        let after = out.last().map_or(0, ResponseEvent::seq);
        let page = b
            .read_responses(id, after, 100, Duration::from_millis(200))
            .await
            .unwrap();
        out.extend(page);
    }
    out
}

/// Usage events as billing reads them, waiting until at least one arrived.
async fn usage_arrived(b: &dyn Broker) -> Vec<UsageEvent> {
    let deadline = Instant::now() + LONG;
    let mut usage = Vec::new();
    while usage.is_empty() {
        assert!(Instant::now() < deadline, "no usage event");
        usage = usage_events(b).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    usage
}

fn assert_cancelled(events: &[ResponseEvent]) {
    match events.last() {
        Some(ResponseEvent::Error { code, status, .. }) => {
            assert_eq!((code.as_str(), *status), ("cancelled", 499))
        }
        other => panic!("expected cancelled, got {other:?}"),
    }
}

/// A client that goes away after being handed the first events of a stream (the cancel
/// carries the last seq it got) is billed the prompt and exactly the tokens of those events,
/// not those the engine made after: by the job's holder, at once (its claim timeout is far
/// beyond the test, so no takeover bills it), which acks the job.
async fn a_cancel_bills_exactly_the_deltas_the_client_was_handed(h: Harness) {
    let (_dir, model) = tiny_model(&slow_spec());
    let b = h.broker.clone();
    let mut config = test_config("m", "w1");
    config.claim_timeout = Duration::from_secs(600);
    let worker = spawn_worker(model.clone(), b.clone(), config);
    let prompt = prompts(1).remove(0);
    let j = job("m", &prompt, 3000);
    b.enqueue(&j).await.unwrap();
    // The gateway relayed two delta events; the worker has written more since.
    let events = read_until(&*b, j.id, 4).await;
    let handed = events[1].seq();
    let (handed_ids, _) = delivered(&events[..2]);
    b.cancel(j.id, handed).await.unwrap();
    let events = read_to_end(&*b, j.id, LONG).await;
    assert_cancelled(&events);
    let (written, _) = delivered(&events);
    assert!(written.len() > handed_ids.len(), "{events:?}");
    let by = usage_by_request(&usage_arrived(&*b).await);
    assert_billed(&by, j.id, prompt.len() as u64, handed_ids.len() as u64);
    assert_eq!(by[&j.id][&0].worker, "w1", "billed by its holder");
    let deadline = Instant::now() + LONG;
    while b.depth("m").await.unwrap().in_flight > 0 {
        assert!(Instant::now() < deadline, "the cancelled job was not acked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = worker.shutdown().await;
    assert_eq!(summary.cancelled, 1);
    assert!(usage_events(&*b).await.is_empty(), "billed once");
}

/// A worker that dies while it generates, and whose client then goes away, is billed by the
/// worker that takes its job over: the prompt and the tokens the client was handed, not the
/// rest of what the dead holder wrote.
async fn a_job_taken_over_after_a_cancel_bills_what_was_handed(h: Harness) {
    let (_dir, model) = tiny_model(&slow_spec());
    let b = h.broker.clone();
    let first = spawn_worker(model.clone(), b.clone(), test_config("m", "w1"));
    let prompt = prompts(1).remove(0);
    let j = job("m", &prompt, 3000);
    b.enqueue(&j).await.unwrap();
    let events = read_until(&*b, j.id, 4).await;
    first.crash().await;
    let handed = events[1].seq();
    let (handed_ids, _) = delivered(&events[..2]);
    b.cancel(j.id, handed).await.unwrap();
    let second = spawn_worker(model.clone(), b.clone(), test_config("m", "w2"));
    let events = read_to_end(&*b, j.id, LONG).await;
    assert_cancelled(&events);
    let (written, _) = delivered(&events);
    assert!(written.len() > handed_ids.len(), "{events:?}");
    let by = usage_by_request(&usage_arrived(&*b).await);
    assert_billed(&by, j.id, prompt.len() as u64, handed_ids.len() as u64);
    let summary = second.shutdown().await;
    assert_eq!((summary.claimed, summary.taken_over), (0, 1), "{summary:?}");
    assert_eq!(b.depth("m").await.unwrap().in_flight, 0);
}

/// The broker loses a running job with its data (its jobs stream and response stream gone,
/// as when Redis restarts without persistence): its worker's next write or keep-alive is
/// refused, and since no other worker holds the job, it bills the prompt and the tokens it
/// appended before it stops, once.
async fn a_job_the_queue_lost_bills_what_was_delivered(h: Harness) {
    let (_dir, model) = tiny_model(&slow_spec());
    let b = h.broker.clone();
    let worker = spawn_worker(model.clone(), b.clone(), test_config("m", "w1"));
    let prompt = prompts(1).remove(0);
    let j = job("m", &prompt, 3000);
    b.enqueue(&j).await.unwrap();
    read_until(&*b, j.id, 3).await;
    b.purge_model("m").await.unwrap();
    let status = worker.status.clone();
    wait_until("the worker let the job go", LONG, || {
        status.summary().lost == 1
    })
    .await;
    // Everything it appended is still in the response stream until that goes too.
    let events = b
        .read_responses(j.id, 0, 10_000, Duration::ZERO)
        .await
        .unwrap();
    assert!(!events.iter().any(ResponseEvent::is_terminal), "{events:?}");
    let (written, _) = delivered(&events);
    assert!(written.len() >= 3);
    b.forget_request(j.id).await.unwrap();
    let by = usage_by_request(&usage_arrived(&*b).await);
    assert_billed(&by, j.id, prompt.len() as u64, written.len() as u64);
    assert_eq!(by[&j.id][&0].worker, "w1", "billed by its holder");
    let summary = worker.shutdown().await;
    assert_eq!((summary.lost, summary.completed), (1, 0), "{summary:?}");
    assert!(usage_events(&*b).await.is_empty(), "billed once");
}

/// The done event's cached prompt tokens of `tenant`'s greedy job over `prompt`.
async fn cached_tokens(b: &dyn Broker, tenant: &str, prompt: &[u32]) -> u64 {
    let mut j = job("m", prompt, 4);
    j.tenant = tenant.into();
    b.enqueue(&j).await.unwrap();
    let events = read_to_end(b, j.id, LONG).await;
    assert_complete(&events);
    match events.last() {
        Some(ResponseEvent::Done { usage, .. }) => usage.cached_prompt_tokens,
        other => panic!("{other:?}"),
    }
}

/// The prefix cache is scoped per tenant: a tenant's repeat of a prompt is served from it,
/// another tenant's identical prompt is not (so `cached_tokens` tells no tenant anything
/// about another's prompts), except for the blocks inside an operator's shared prefix.
async fn tenants_never_share_cached_prompt_blocks(h: Harness) {
    let b = h.broker.clone();
    // 56 tokens: three full blocks of 16 can be served from the cache
    let prompt = prompts_of(1, 56).remove(0);
    let (_dir, model) = tiny_model(&fast_spec());
    let worker = spawn_worker(model, b.clone(), test_config("m", "w1"));
    assert_eq!(cached_tokens(&*b, "tenant-a", &prompt).await, 0);
    assert_eq!(cached_tokens(&*b, "tenant-b", &prompt).await, 0);
    assert_eq!(cached_tokens(&*b, "tenant-a", &prompt).await, 48);
    worker.shutdown().await;

    // A shared prefix of 40 tokens: its two whole blocks are every tenant's.
    let (_dir, model) = tiny_model(&fast_spec());
    let mut config = test_config("m", "w2");
    config.shared_prefixes = vec![SharedPrefix::Tokens(prompt[..40].to_vec())];
    let worker = spawn_worker(model, b.clone(), config);
    assert_eq!(cached_tokens(&*b, "tenant-a", &prompt).await, 0);
    assert_eq!(cached_tokens(&*b, "tenant-b", &prompt).await, 32);
    assert_eq!(cached_tokens(&*b, "tenant-a", &prompt).await, 48);
    // A prompt that does not start with the whole shared prefix is salted from its start.
    let mut other = prompt.clone();
    other[39] = if other[39] == 2 { 3 } else { 2 };
    assert_eq!(cached_tokens(&*b, "tenant-c", &other).await, 0);
    worker.shutdown().await;
}

/// Requests the model cannot take get exactly one error event with the 4xx status the
/// direct server would answer, are acked, and bill nothing.
async fn prepare_errors_are_one_error_event(h: Harness) {
    let (_dir, model) = tiny_model(&fast_spec());
    let b = h.broker.clone();
    let worker = spawn_worker(model, b.clone(), test_config("m", "w1"));
    let mut chat = job("m", &[5], 4);
    // The tiny model has no chat template.
    chat.body = serde_json::json!({"kind": "chat", "request": {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}});
    let mut too_long = job("m", &[5, 6], 4);
    too_long.body["request"]["max_tokens"] = serde_json::json!(100_000);
    let mut garbage = job("m", &[5], 4);
    garbage.body = serde_json::json!({"kind": "embedding", "request": {}});
    let cases = [
        (chat, "invalid_request_error", Some("messages")),
        (too_long, "context_length_exceeded", Some("messages")),
        (garbage, "invalid_request_error", None),
    ];
    for (j, _, _) in &cases {
        b.enqueue(j).await.unwrap();
    }
    for (j, want_code, want_param) in &cases {
        let events = read_to_end(&*b, j.id, LONG).await;
        assert_eq!(events.len(), 1, "{events:?}");
        match &events[0] {
            ResponseEvent::Error {
                seq,
                status,
                code,
                param,
                ..
            } => {
                assert_eq!((*seq, *status, code.as_str()), (1, 400, *want_code));
                assert_eq!(param.as_deref(), *want_param);
            }
            other => panic!("{other:?}"),
        }
    }
    let summary = worker.shutdown().await;
    assert_eq!(summary.rejected, 3);
    assert!(usage_events(&*b).await.is_empty());
    assert_eq!(b.depth("m").await.unwrap().in_flight, 0);
}

/// With no worker, jobs wait; a worker started later completes them. Jobs withdrawn
/// meanwhile (deadline passed, or withdrawn by the gateway) are never executed.
async fn jobs_wait_for_a_worker_and_withdrawn_jobs_never_run(h: Harness) {
    let (_dir, model) = tiny_model(&fast_spec());
    let b = h.broker.clone();
    let waiting: Vec<_> = prompts(3).iter().map(|p| job("m", p, 8)).collect();
    for j in &waiting {
        b.enqueue(j).await.unwrap();
    }
    let mut expired = job("m", &[7, 8, 9], 8);
    expired.deadline_ms = system_now_ms() + 200;
    b.enqueue(&expired).await.unwrap();
    let gone = job("m", &[9, 8, 7], 8);
    let entry = b.enqueue(&gone).await.unwrap();
    assert_eq!(
        b.withdraw("m", gone.id, &entry).await.unwrap(),
        Withdrawal::Withdrawn
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(b.depth("m").await.unwrap().backlog, 4);
    let worker = spawn_worker(model, b.clone(), test_config("m", "w1"));
    for j in &waiting {
        assert_complete(&read_to_end(&*b, j.id, LONG).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let summary = worker.shutdown().await;
    assert_eq!((summary.claimed, summary.completed), (3, 3));
    for j in [&expired, &gone] {
        let events = b.read_responses(j.id, 0, 10, Duration::ZERO).await.unwrap();
        assert!(events.is_empty(), "withdrawn job ran: {events:?}");
    }
    let depth = b.depth("m").await.unwrap();
    assert_eq!((depth.backlog, depth.in_flight), (0, 0));
    assert_eq!(usage_events(&*b).await.len(), 3);
}

/// Serves one job per prompt (4 tokens each) with a worker under `budget` on `model`, and
/// returns the most jobs it held at once.
async fn most_held(model: &Arc<LoadedModel>, prompts: &[Vec<u32>], budget: ClaimBudget) -> usize {
    let h = Harness::memory();
    let b = h.broker.clone();
    let jobs: Vec<_> = prompts.iter().map(|p| job("m", p, 4)).collect();
    for j in &jobs {
        b.enqueue(j).await.unwrap();
    }
    let mut config = test_config("m", "w1");
    config.claim_budget = budget;
    let worker = spawn_worker(model.clone(), b.clone(), config);
    let ids: Vec<_> = jobs.iter().map(|j| j.id).collect();
    let reader = {
        let b = b.clone();
        tokio::spawn(async move {
            for id in ids {
                assert_complete(&read_to_end(&*b, id, LONG).await);
            }
        })
    };
    reader.await.unwrap();
    let most = worker.status.most_held();
    let summary = worker.shutdown().await;
    let n = jobs.len() as u64;
    assert_eq!((summary.claimed, summary.completed), (n, n));
    most
}

/// With a prefill budget a worker holds only the jobs whose prefill it can start soon,
/// leaving the rest queued for other workers; without one it takes every job at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_budget_bounds_the_jobs_a_worker_holds() {
    // one token per engine step, so each 64-token prompt takes 64 steps to prefill
    let (_dir, model) = tiny_model_stepwise(&fast_spec());
    let long = prompts_of(6, 64);
    let tokens = ClaimBudget::Tokens(NonZeroUsize::MIN.saturating_add(31));
    for (budget, allowed) in [(tokens, 1..=2), (ClaimBudget::Off, 3..=6)] {
        // a budget of half a prompt: the job in prefill, and one more once that prefill is
        // done (while the first decodes, which a sample may miss); greedy: the six at once
        // (in one claim or two), held through the prefills
        let most = most_held(&model, &long, budget).await;
        assert!(allowed.contains(&most), "budget {budget:?}: held {most}");
    }
}

/// A budget in seconds of prefill is turned into tokens with the engine's measured rate:
/// a worker holds about that much prefill and leaves the rest queued, while a greedy worker
/// (or a budget the rate says all the jobs fit in) takes them all. One second of the tiny
/// model's prefill is more than its context holds, so the budgets here are the same rule
/// scaled to it: two prompts' and sixty-four prompts' worth at the rate measured on a
/// warm-up prompt. The rate keeps moving as the engine works (a loaded machine slows
/// steps), hence the wide bounds; they still cannot pass by accident: the small budget
/// holds at most half the jobs even if the rate triples, and the large one fills every slot
/// only if the measured rate is used (before it is known, a worker holds one job at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_in_seconds_follows_the_measured_prefill_rate() {
    const P: usize = 64;
    // the engine's max_num_seqs: greedy can hold them all
    const N: usize = 16;
    // one token per step of the slower tiny model: each prompt's prefill takes a while, so
    // the samples of `held` see what a worker holds
    let (_dir, model) = tiny_model_stepwise(&slow_spec());
    assert_eq!(model.engine.stats().prefill_tokens_per_s, 0.0);
    // distinct prompts for every run, so that none is served from the prefix cache
    let all = prompts_of(1 + 3 * N, 2 * P);
    let mut runs = all[1..]
        .chunks(N)
        .map(|c| c.iter().map(|p| p[..P].to_vec()).collect());
    reference(&model, &all[0], 1).await; // 2P steps of prefill
    let rate = model.engine.stats().prefill_tokens_per_s;
    assert!(rate > 0.0, "no prefill rate measured");
    let prompts_worth =
        |n: usize| ClaimBudget::Prefill(Duration::from_secs_f64((n * P) as f64 / rate));

    // Budgets far from the boundaries: the rate keeps moving with the machine's load (other
    // tests run beside this one), and each assertion must hold for a several-fold change.
    let small: Vec<Vec<u32>> = runs.next().unwrap();
    let held = most_held(&model, &small, prompts_worth(1)).await;
    assert!(
        (1..=N / 2).contains(&held),
        "one prompt's worth at {rate:.0} tokens/s: held {held}"
    );
    let large: Vec<Vec<u32>> = runs.next().unwrap();
    let held = most_held(&model, &large, prompts_worth(1024)).await;
    assert!(
        held >= N - 2,
        "1,024 prompts' worth at {rate:.0} tokens/s: held {held}"
    );
    let greedy: Vec<Vec<u32>> = runs.next().unwrap();
    let held = most_held(&model, &greedy, ClaimBudget::Off).await;
    assert!(held >= N - 2, "greedy: held {held}");
}

/// The scale-up benchmark's driver: a burst served by a worker that was up and one that
/// starts later, every stream read to its end, every job claimed by one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_bench_serves_the_burst_with_both_workers() {
    use tidal_runtime::worker::bench::bench_scale_up;
    let (_a, first) = tiny_model_stepwise(&fast_spec());
    let (_b, second) = tiny_model_stepwise(&fast_spec());
    let burst = prompts_of(4, 48);
    let tokens = ClaimBudget::Tokens(NonZeroUsize::MIN.saturating_add(23));
    for budget in [ClaimBudget::Off, tokens, ClaimBudget::default()] {
        let h = Harness::memory();
        let r = bench_scale_up(
            first.clone(),
            second.clone(),
            h.broker.clone(),
            &burst,
            4,
            Duration::from_millis(20),
            budget,
        )
        .await
        .unwrap();
        assert_eq!(r.claimed_by_first + r.claimed_by_second, 4, "{r:?}");
        assert!(r.median_time_to_first_token <= r.p90_time_to_first_token);
        assert!(r.p90_time_to_first_token <= r.max_time_to_first_token);
        assert!(r.max_time_to_first_token <= r.wall_time);
        assert_eq!((r.requests, r.claim_budget), (4, budget));
        assert!(r.prefill_tokens_per_s[0] > 0.0, "{r:?}");
    }
}
