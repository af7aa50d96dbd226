//! Broker calls of a job task, with retries of transient failures and the one ambiguity a
//! retry creates: an append whose reply was lost may have been written, which a re-read of
//! that seq settles.
//!
//! A Redis outage must not cost a request its place: a call that fails transiently is
//! retried with short, capped pauses (so a broker that is back is noticed within half a
//! second) until `broker_retry` has passed since its first failure. Only then is the job
//! left pending for a takeover. Meanwhile the engine keeps the sequence and its new tokens
//! queue up for the next append. Retrying is safe: every write is fenced (seq and holder),
//! so a worker whose jobs were taken over during the outage learns so at its first write.

use std::future::Future;
use std::time::{Duration, Instant};

use tidal_queue::{ClaimedJob, QueueError, ResponseEvent, Resume, UsageEvent};
use uuid::Uuid;

use super::Shared;

/// Pause after the first failure; each further one doubles it up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// The pause before retrying a call that failed `attempt + 1` times over `failing` since
/// its first failure, or `None` once it has failed for `give_up_after` (pure).
pub fn retry_pause(attempt: u32, failing: Duration, give_up_after: Duration) -> Option<Duration> {
    if failing >= give_up_after {
        return None;
    }
    Some((FIRST_PAUSE * 2u32.pow(attempt.min(8))).min(MAX_PAUSE))
}

/// Runs `op` until it succeeds, fails for a reason a retry cannot change, or has failed
/// transiently for the worker's `broker_retry`.
pub async fn retry<T, F, Fut>(shared: &Shared, what: &str, mut op: F) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    let give_up_after = shared.config.broker_retry_for();
    let mut failing_since: Option<Instant> = None;
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.is_transient() => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                let Some(pause) = retry_pause(attempt, since.elapsed(), give_up_after) else {
                    return Err(e);
                };
                log_retry(what, &e, attempt);
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            other => {
                if attempt > 0 {
                    tracing::info!(attempt, "{what} went through after failures");
                }
                return other;
            }
        }
    }
}

/// The first failure of a call is a warning; its retries are routine until it gives up.
fn log_retry(what: &str, e: &QueueError, attempt: u32) {
    if attempt == 0 {
        tracing::warn!(error = %e, "{what} failed; retrying");
    } else {
        tracing::debug!(error = %e, attempt, "{what} failed again; retrying");
    }
}

/// How appending a response event went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Written at its seq.
    Written,
    /// Another worker holds the job or wrote that seq: the request is no longer ours.
    Lost,
    /// The stream had already ended.
    Finished,
    /// The broker kept failing.
    Failed,
}

/// Appends `event` to the stream of `job`'s request, while this worker holds `job`.
pub async fn append(shared: &Shared, job: &ClaimedJob, event: &ResponseEvent) -> Appended {
    let broker = &shared.broker;
    let id = job.job.id;
    let give_up_after = shared.config.broker_retry_for();
    let started = Instant::now();
    let mut failing_since: Option<Instant> = None;
    let mut unsure = false;
    let mut attempt = 0;
    loop {
        match broker.append_held(job, event).await {
            Ok(()) => {
                if let ResponseEvent::Delta { token_ids, .. } = event {
                    shared.counters.delivered(
                        &shared.config.model_id,
                        token_ids.len(),
                        started.elapsed(),
                    );
                }
                return Appended::Written;
            }
            Err(QueueError::SeqConflict { last, .. }) if unsure && last >= event.seq() => {
                // A failed try may have written it: ours if the stored event is this one.
                let stored = retry(shared, "re-reading a response event", || {
                    broker.read_responses(id, event.seq() - 1, 1, Duration::ZERO)
                })
                .await;
                return match stored {
                    Ok(evs) if evs.first() == Some(event) => Appended::Written,
                    Ok(_) => Appended::Lost,
                    Err(_) => Appended::Failed,
                };
            }
            Err(QueueError::SeqConflict { .. } | QueueError::NotOwner { .. }) => {
                return Appended::Lost
            }
            Err(QueueError::ResponseFinished { .. }) => return Appended::Finished,
            Err(e) if e.is_transient() => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if let Some(pause) = retry_pause(attempt, since.elapsed(), give_up_after) {
                    log_retry("appending a response event", &e, attempt);
                    unsure = true;
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    continue;
                }
                tracing::error!(request_id = %id, error = %e, "cannot append a response event");
                return Appended::Failed;
            }
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "cannot append a response event");
                return Appended::Failed;
            }
        }
    }
}

/// Publishes a segment's usage event unless it bills nothing; whether it is published.
pub async fn publish_usage(shared: &Shared, event: &UsageEvent) -> bool {
    if event.prompt_tokens == 0 && event.completion_tokens == 0 {
        return true;
    }
    match retry(shared, "publishing usage", || {
        shared.broker.publish_usage(event)
    })
    .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(request_id = %event.request_id, segment = event.segment, error = %e, "cannot publish usage");
            false
        }
    }
}

/// How acking or re-enqueueing went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Done.
    Ok,
    /// The entry is no longer ours (taken over).
    NotOwner,
    /// The broker kept failing; the entry stays pending for a takeover.
    Failed,
}

fn released(what: &str, id: Uuid, r: Result<(), QueueError>) -> Released {
    match r {
        Ok(()) => Released::Ok,
        Err(QueueError::NotOwner { .. }) => {
            tracing::warn!(request_id = %id, "{what}: the job was taken over meanwhile");
            Released::NotOwner
        }
        Err(e) => {
            tracing::error!(request_id = %id, error = %e, "{what} failed");
            Released::Failed
        }
    }
}

/// Acks a finished job.
pub async fn ack(shared: &Shared, job: &ClaimedJob) -> Released {
    let r = retry(shared, "ack", || shared.broker.ack(job)).await;
    released("ack", job.job.id, r)
}

/// Re-enqueues an unfinished job with what was delivered.
pub async fn requeue(shared: &Shared, job: &ClaimedJob, resume: Resume) -> Released {
    let r = retry(shared, "re-enqueue", || {
        shared.broker.requeue(job, resume.clone())
    })
    .await
    .map(|_| ());
    released("re-enqueue", job.job.id, r)
}

/// Every event of request `id`'s response stream so far.
pub async fn read_all(shared: &Shared, id: Uuid) -> Result<Vec<ResponseEvent>, QueueError> {
    let mut out: Vec<ResponseEvent> = Vec::new();
    loop {
        let after = out.last().map_or(0, ResponseEvent::seq);
        let page = retry(shared, "reading a response stream", || {
            shared
                .broker
                .read_responses(id, after, 1000, Duration::ZERO)
        })
        .await?;
        let done = page.is_empty() || page.iter().any(ResponseEvent::is_terminal);
        out.extend(page);
        if done {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_to_half_a_second_until_the_deadline() {
        let deadline = Duration::from_secs(30);
        let pause = |attempt, failing_ms| {
            retry_pause(attempt, Duration::from_millis(failing_ms), deadline).map(|p| p.as_millis())
        };
        let first: Vec<_> = (0..6).filter_map(|a| pause(a, 0)).collect();
        assert_eq!(first, [50, 100, 200, 400, 500, 500]);
        // a long outage is still polled twice a second, up to the deadline
        assert_eq!(pause(u32::MAX, 29_999), Some(500));
        assert_eq!(pause(3, 30_000), None);
        assert_eq!(retry_pause(0, Duration::ZERO, Duration::ZERO), None);
    }
}
