//! Protocol round-trip benchmark, called by `benches/queue.rs` and meant for `tidal bench`:
//! closed-loop clients enqueue a job and read its response stream until `done`, while
//! workers claim, write deltas and `done`, publish usage and ack — the gateway↔worker path
//! with a no-op model, so the numbers are the broker's share of per-request latency.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use uuid::Uuid;

use crate::broker::Broker;
use crate::clock::system_now_ms;
use crate::error::{QueueError, Result};
use crate::types::{CapacityType, ClaimedJob, FinishReason, Job, ResponseEvent, Usage, UsageEvent};

/// Load shape of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Model id the jobs go to (use a fresh one per run).
    pub model: String,
    /// Requests in total.
    pub requests: usize,
    /// Concurrent clients (each waits for its response before sending the next); ignored
    /// when `rate_per_s` is set.
    pub clients: usize,
    /// Open loop: start requests at this fixed rate regardless of completions.
    pub rate_per_s: Option<u32>,
    /// Worker tasks.
    pub workers: usize,
    /// Jobs one worker runs at once (its batch).
    pub batch: usize,
    /// Delta events per response (before `done`).
    pub deltas: u64,
}

/// Results of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Requests completed.
    pub requests: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Median enqueue-to-`done` latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Worst latency.
    pub max: Duration,
}

/// The `q` quantile (0..=1) of ascending `sorted` samples, nearest-rank; zero when empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs one claimed job like a no-op model: deltas, done, usage, ack.
async fn serve(b: Arc<dyn Broker>, c: ClaimedJob, deltas: u64) -> Result<()> {
    let started = system_now_ms();
    for seq in 1..=deltas {
        let ev = ResponseEvent::delta(seq, "tok", vec![seq as u32]);
        b.append_response(c.job.id, &ev).await?;
    }
    let usage = Usage {
        prompt_tokens: 8,
        cached_prompt_tokens: 0,
        completion_tokens: deltas,
    };
    let done = ResponseEvent::Done {
        seq: deltas + 1,
        finish_reason: FinishReason::Length,
        usage,
    };
    b.append_response(c.job.id, &done).await?;
    b.publish_usage(&UsageEvent {
        request_id: c.job.id,
        segment: c.segment(),
        tenant: c.job.tenant.clone(),
        model: c.job.model.clone(),
        prompt_tokens: usage.prompt_tokens,
        cached_prompt_tokens: 0,
        completion_tokens: usage.completion_tokens,
        worker: c.consumer.clone(),
        capacity_type: CapacityType::OnDemand,
        started_at_ms: started,
        ended_at_ms: system_now_ms(),
        last: false,
    })
    .await?;
    b.ack(&c).await
}

/// A worker: claims while it has batch capacity and serves its jobs concurrently.
async fn worker(
    b: Arc<dyn Broker>,
    opts: BenchOptions,
    name: String,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let mut running = JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        while let Some(done) = running.try_join_next() {
            flatten(done)?;
        }
        let free = opts.batch.saturating_sub(running.len());
        if free == 0 {
            if let Some(done) = running.join_next().await {
                flatten(done)?;
            }
            continue;
        }
        for c in b
            .claim(&opts.model, &name, free, Duration::from_millis(50))
            .await?
        {
            running.spawn(serve(b.clone(), c, opts.deltas));
        }
    }
    while let Some(done) = running.join_next().await {
        flatten(done)?;
    }
    Ok(())
}

fn flatten<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    r.map_err(|e| QueueError::Invalid(format!("bench task failed: {e}")))?
}

/// Sends one request and waits for its `done`; returns its latency.
async fn request(b: Arc<dyn Broker>, model: String, deltas: u64) -> Result<Duration> {
    let now = system_now_ms();
    let job = Job {
        id: Uuid::now_v7(),
        tenant: "bench".into(),
        model,
        body: serde_json::json!({"prompt": "bench", "max_tokens": deltas}),
        enqueued_at_ms: now,
        deadline_ms: now + 60_000,
        resume: None,
    };
    let t = Instant::now();
    b.enqueue(&job).await?;
    let mut last = 0;
    loop {
        let evs = b
            .read_responses(job.id, last, 256, Duration::from_secs(5))
            .await?;
        if evs.is_empty() {
            return Err(QueueError::Invalid(format!("request {} timed out", job.id)));
        }
        for ev in evs {
            last = ev.seq();
            if ev.is_terminal() {
                let lat = t.elapsed();
                b.delete_responses(job.id).await?;
                return Ok(lat);
            }
        }
    }
}

/// A closed-loop client: one request at a time from the shared budget.
async fn client(
    b: Arc<dyn Broker>,
    opts: BenchOptions,
    left: Arc<AtomicUsize>,
) -> Result<Vec<Duration>> {
    let mut lat = Vec::new();
    while left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        lat.push(request(b.clone(), opts.model.clone(), opts.deltas).await?);
    }
    Ok(lat)
}

/// Open loop: starts `opts.requests` requests at `rate` per second.
async fn open_loop(b: Arc<dyn Broker>, opts: &BenchOptions, rate: u32) -> Result<Vec<Duration>> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = JoinSet::new();
    for _ in 0..opts.requests {
        tick.tick().await;
        tasks.spawn(request(b.clone(), opts.model.clone(), opts.deltas));
    }
    let mut lat = Vec::with_capacity(opts.requests);
    while let Some(r) = tasks.join_next().await {
        lat.push(flatten(r)?);
    }
    Ok(lat)
}

/// Runs the round trip against `broker` and reports throughput and latency.
pub async fn round_trip(broker: Arc<dyn Broker>, opts: BenchOptions) -> Result<BenchReport> {
    if opts.clients == 0 || opts.workers == 0 {
        return Err(QueueError::Invalid(
            "clients and workers must be positive".into(),
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..opts.workers)
        .map(|i| {
            tokio::spawn(worker(
                broker.clone(),
                opts.clone(),
                format!("bench-w{i}"),
                stop.clone(),
            ))
        })
        .collect();
    let t = Instant::now();
    let mut lat = Vec::with_capacity(opts.requests);
    let mut first_err = None;
    if let Some(rate) = opts.rate_per_s {
        match open_loop(broker.clone(), &opts, rate).await {
            Ok(l) => lat = l,
            Err(e) => first_err = Some(e),
        }
    } else {
        let left = Arc::new(AtomicUsize::new(opts.requests));
        let clients: Vec<_> = (0..opts.clients)
            .map(|_| tokio::spawn(client(broker.clone(), opts.clone(), left.clone())))
            .collect();
        for c in clients {
            match flatten(c.await) {
                Ok(l) => lat.extend(l),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
    }
    let elapsed = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        if let Err(e) = flatten(w.await) {
            first_err = first_err.or(Some(e));
        }
    }
    broker.purge_model(&opts.model).await?;
    if let Some(e) = first_err {
        return Err(e);
    }
    lat.sort_unstable();
    Ok(BenchReport {
        requests: lat.len(),
        elapsed,
        requests_per_s: lat.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50: quantile(&lat, 0.50),
        p99: quantile(&lat, 0.99),
        max: quantile(&lat, 1.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_millis(x)).collect()
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let s = ms(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(quantile(&s, 0.5), Duration::from_millis(5));
        assert_eq!(quantile(&s, 0.99), Duration::from_millis(10));
        assert_eq!(quantile(&s, 0.0), Duration::from_millis(1));
        assert_eq!(quantile(&s, 1.0), Duration::from_millis(10));
        assert_eq!(quantile(&ms(&[7]), 0.5), Duration::from_millis(7));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn round_trip_completes_every_request() {
        let b: Arc<dyn Broker> = Arc::new(crate::MemoryBroker::default());
        for rate_per_s in [None, Some(2000)] {
            let opts = BenchOptions {
                model: "bench".into(),
                requests: 50,
                clients: 8,
                rate_per_s,
                workers: 2,
                batch: 4,
                deltas: 3,
            };
            let r = round_trip(b.clone(), opts).await.unwrap();
            assert_eq!(r.requests, 50);
            assert!(r.p50 <= r.p99 && r.p99 <= r.max);
            let d = b.depth("bench").await.unwrap();
            assert_eq!((d.backlog, d.in_flight), (0, 0));
            // Every request published exactly one usage event.
            let usage = b.read_usage("check", 1000, Duration::ZERO).await.unwrap();
            assert_eq!(usage.len(), 50);
            let ids: Vec<_> = usage.iter().map(|u| u.entry_id.clone()).collect();
            b.ack_usage(&ids).await.unwrap();
        }
    }
}
