//! Broker calls of a job task, with retries of transient failures (a Redis blip must not
//! lose a request) and the one ambiguity a retry creates: an append whose reply was lost
//! may have been written, which a re-read of that seq settles.

use std::future::Future;
use std::time::{Duration, Instant};

use tidal_queue::{QueueError, ResponseEvent, Resume, UsageEvent};
use uuid::Uuid;

use super::Shared;

/// Tries of one broker call before the job is left to a takeover.
const TRIES: u32 = 5;

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.min(4))
}

fn transient(e: &QueueError) -> bool {
    matches!(e, QueueError::Redis(_))
}

/// Runs `op` until it succeeds, fails for a reason a retry cannot change, or `TRIES` runs
/// failed transiently.
pub async fn retry<T, F, Fut>(what: &str, mut op: F) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if transient(&e) && attempt + 1 < TRIES => {
                tracing::warn!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// How appending a response event went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Written at its seq.
    Written,
    /// Another worker wrote that seq: the request is no longer ours.
    Lost,
    /// The stream had already ended.
    Finished,
    /// The broker kept failing.
    Failed,
}

/// Appends `event` to request `id`'s stream.
pub async fn append(shared: &Shared, id: Uuid, event: &ResponseEvent) -> Appended {
    let broker = &shared.broker;
    let started = Instant::now();
    let mut unsure = false;
    for attempt in 0..TRIES {
        match broker.append_response(id, event).await {
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
                let stored = retry("re-reading a response event", || {
                    broker.read_responses(id, event.seq() - 1, 1, Duration::ZERO)
                })
                .await;
                return match stored {
                    Ok(evs) if evs.first() == Some(event) => Appended::Written,
                    Ok(_) => Appended::Lost,
                    Err(_) => Appended::Failed,
                };
            }
            Err(QueueError::SeqConflict { .. }) => return Appended::Lost,
            Err(QueueError::ResponseFinished { .. }) => return Appended::Finished,
            Err(e) if transient(&e) && attempt + 1 < TRIES => {
                tracing::warn!(request_id = %id, error = %e, attempt, "append failed; retrying");
                unsure = true;
                tokio::time::sleep(backoff(attempt)).await;
            }
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "cannot append a response event");
                return Appended::Failed;
            }
        }
    }
    Appended::Failed
}

/// Publishes a segment's usage event unless it bills nothing; whether it is published.
pub async fn publish_usage(shared: &Shared, event: &UsageEvent) -> bool {
    if event.prompt_tokens == 0 && event.completion_tokens == 0 {
        return true;
    }
    match retry("publishing usage", || shared.broker.publish_usage(event)).await {
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
pub async fn ack(shared: &Shared, job: &tidal_queue::ClaimedJob) -> Released {
    let r = retry("ack", || shared.broker.ack(job)).await;
    released("ack", job.job.id, r)
}

/// Re-enqueues an unfinished job with what was delivered.
pub async fn requeue(shared: &Shared, job: &tidal_queue::ClaimedJob, resume: Resume) -> Released {
    let r = retry("re-enqueue", || shared.broker.requeue(job, resume.clone()))
        .await
        .map(|_| ());
    released("re-enqueue", job.job.id, r)
}

/// Every event of request `id`'s response stream so far.
pub async fn read_all(shared: &Shared, id: Uuid) -> Result<Vec<ResponseEvent>, QueueError> {
    let mut out: Vec<ResponseEvent> = Vec::new();
    loop {
        let after = out.last().map_or(0, ResponseEvent::seq);
        let page = retry("reading a response stream", || {
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
