//! A dead worker's job (taken over after the claim timeout): bill what the dead holder
//! delivered, then re-enqueue the job with that resume state (or just ack it when its
//! stream had ended). The job is then claimed like any resumed job, ahead of fresh ones.
//!
//! Why not continue it in place: a holder that died published no usage for its segment,
//! and only the stream tells what it delivered. Within one jobs entry only its first holder
//! ever generates (a taker always re-enqueues), so everything the stream gained since the
//! entry was enqueued belongs to that holder's segment, whichever taker bills it and however
//! many takers died before finishing this step. If the holder did publish (it died between
//! its usage event and its ack), the taker's event carries the same key and the same
//! counts, and billing drops the duplicate. A cancelled request is billed, by holder and
//! taker alike, for the deltas up to the seq its client was handed (the cancel flag's
//! value), so a holder that died after its client went away bills no undelivered token.

use tidal_queue::clock::system_now_ms;
use tidal_queue::{ClaimedJob, ResponseEvent, Resume, UsageEvent};

use super::io::{self, Appended, Released};
use super::job::prepare_job;
use super::metrics::Outcome;
use super::segment::Runner;
use super::Shared;

/// The usage event of the dead holder of `claimed`'s entry, given the response stream
/// `events`, the request's `prompt_tokens` and, for a cancelled request, the seq its client
/// was handed up to (`cancelled`); `None` when it delivered nothing to bill.
pub fn dead_holder_usage(
    claimed: &ClaimedJob,
    events: &[ResponseEvent],
    prompt_tokens: u64,
    cancelled: Option<u64>,
    runner: &Runner<'_>,
    now_ms: u64,
) -> Option<UsageEvent> {
    let before = claimed.job.resume.as_ref();
    let segment = before.map_or(0, |r| r.segments);
    let entry_start = before.map_or(0, |r| r.token_ids.len() as u64);
    let handed = cancelled.map_or(events.len(), |seq| {
        events.partition_point(|e| e.seq() <= seq)
    });
    let delivered = Resume::from_events(&events[..handed]).token_ids.len() as u64;
    let completion = match events.last() {
        // `done` counts the end-of-generation token too, as the holder would have billed.
        Some(ResponseEvent::Done { usage, .. }) => usage.completion_tokens,
        _ => delivered,
    }
    .saturating_sub(entry_start);
    let prompt = if segment == 0 { prompt_tokens } else { 0 };
    if prompt == 0 && completion == 0 {
        return None;
    }
    Some(UsageEvent {
        request_id: claimed.job.id,
        segment,
        tenant: claimed.job.tenant.clone(),
        model: claimed.job.model.clone(),
        prompt_tokens: prompt,
        cached_prompt_tokens: 0,
        completion_tokens: completion,
        worker: runner.worker.to_owned(),
        capacity_type: runner.capacity_type,
        started_at_ms: now_ms,
        ended_at_ms: now_ms,
        // The request ends here unless the job is re-enqueued for another segment.
        last: cancelled.is_some() || events.last().is_some_and(ResponseEvent::is_terminal),
    })
}

/// Bills and re-enqueues (or acks, or cancels) a taken-over job.
pub(crate) async fn run(shared: &Shared, claimed: &ClaimedJob) -> Outcome {
    let id = claimed.job.id;
    let events = match io::read_all(shared, id).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(request_id = %id, error = %e, "cannot read a taken-over job's stream");
            return Outcome::Abandoned;
        }
    };
    let first_segment = claimed.job.resume.as_ref().is_none_or(|r| r.segments == 0);
    let prompt_tokens = if first_segment {
        prepare_job(&shared.model, &claimed.job).map_or(0, |p| p.request.prompt.len() as u64)
    } else {
        0
    };
    // Read before billing: a cancelled request bills only what its client was handed.
    let ids = [id];
    let cancelled = match io::retry(shared, "reading a cancel flag", || {
        shared.broker.cancelled(&ids)
    })
    .await
    {
        Ok(flags) => flags.into_iter().next().flatten(),
        Err(e) => {
            tracing::error!(request_id = %id, error = %e, "cannot read a taken-over job's cancel flag");
            return Outcome::Abandoned;
        }
    };
    let runner = Runner {
        worker: &shared.config.name,
        capacity_type: shared.config.capacity_type,
    };
    if let Some(usage) = dead_holder_usage(
        claimed,
        &events,
        prompt_tokens,
        cancelled,
        &runner,
        system_now_ms(),
    ) {
        if !io::publish_usage(shared, &usage).await {
            return Outcome::Abandoned;
        }
    }
    let resume = Resume::from_events(&events);
    let finished = events.last().is_some_and(ResponseEvent::is_terminal);
    tracing::info!(
        request_id = %id,
        attempt = claimed.attempt,
        delivered = resume.token_ids.len(),
        finished,
        "took over a dead worker's job"
    );
    let released = if finished {
        io::ack(shared, claimed).await
    } else if cancelled.is_some() {
        let event = ResponseEvent::Error {
            seq: resume.last_seq + 1,
            status: 499,
            code: "cancelled".into(),
            param: None,
            message: "the request was cancelled".into(),
        };
        match io::append(shared, claimed, &event).await {
            Appended::Written | Appended::Finished => io::ack(shared, claimed).await,
            Appended::Lost => Released::NotOwner,
            Appended::Failed => Released::Failed,
        }
    } else {
        io::requeue(shared, claimed, resume).await
    };
    match released {
        Released::Ok => Outcome::TakenOver,
        Released::NotOwner => Outcome::Lost,
        Released::Failed => Outcome::Abandoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_queue::{CapacityType, FinishReason, Job, Usage};
    use uuid::Uuid;

    const RUNNER: Runner<'static> = Runner {
        worker: "taker",
        capacity_type: CapacityType::OnDemand,
    };

    fn claimed(resume: Option<Resume>, attempt: u32) -> ClaimedJob {
        ClaimedJob {
            job: Job {
                id: Uuid::now_v7(),
                tenant: "acme".into(),
                model: "m".into(),
                body: serde_json::json!({}),
                enqueued_at_ms: 0,
                deadline_ms: 0,
                resume,
            },
            entry_id: "1-0".into(),
            consumer: "taker".into(),
            attempt,
        }
    }

    fn delta(seq: u64, ids: &[u32]) -> ResponseEvent {
        ResponseEvent::delta(seq, "x".repeat(ids.len()), ids.to_vec())
    }

    #[test]
    fn the_first_holder_bills_the_prompt_and_everything_it_delivered() {
        let c = claimed(None, 2);
        let evs = [delta(1, &[1, 2]), delta(2, &[3])];
        let u = dead_holder_usage(&c, &evs, 9, None, &RUNNER, 5).unwrap();
        assert_eq!((u.segment, u.prompt_tokens, u.completion_tokens), (0, 9, 3));
        // Re-enqueued for another segment: not the request's last.
        assert!(!u.last);
        // It died before writing anything: the prompt it was given is still billed once.
        let u = dead_holder_usage(&c, &[], 9, None, &RUNNER, 5).unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (9, 0));
    }

    #[test]
    fn a_resumed_holder_bills_only_what_it_added() {
        let before = Resume {
            token_ids: vec![1, 2],
            text_len: 2,
            last_seq: 1,
            segments: 3,
        };
        // Attempt 4: takers 2 and 3 died too, but takers never generate.
        let c = claimed(Some(before.clone()), 4);
        let evs = [delta(1, &[1, 2]), delta(2, &[3, 4, 5])];
        let u = dead_holder_usage(&c, &evs, 9, None, &RUNNER, 5).unwrap();
        assert_eq!((u.segment, u.prompt_tokens, u.completion_tokens), (3, 0, 3));
        // Nothing added: nothing to bill.
        let c = claimed(Some(before), 2);
        assert!(dead_holder_usage(&c, &evs[..1], 9, None, &RUNNER, 5).is_none());
    }

    #[test]
    fn a_cancelled_request_bills_only_the_deltas_its_client_was_handed() {
        let c = claimed(None, 2);
        let evs = [delta(1, &[1, 2]), delta(2, &[3]), delta(3, &[4, 5])];
        let bill = |evs: &[ResponseEvent], seq| {
            let u = dead_holder_usage(&c, evs, 9, Some(seq), &RUNNER, 5).unwrap();
            // A cancelled request ends with the taker's bill.
            assert!(u.last);
            (u.prompt_tokens, u.completion_tokens)
        };
        assert_eq!(bill(&evs, 2), (9, 3));
        assert_eq!(bill(&evs, 0), (9, 0));
        assert_eq!(bill(&evs, 7), (9, 5));
        // The holder ended the stream with `cancelled` before it died: the same count.
        let mut ended = evs.to_vec();
        ended.push(ResponseEvent::Error {
            seq: 4,
            status: 499,
            code: "cancelled".into(),
            param: None,
            message: "the request was cancelled".into(),
        });
        assert_eq!(bill(&ended, 2), (9, 3));
        // A resumed entry bills its own tokens up to the seq only.
        let before = Resume {
            token_ids: vec![1, 2],
            text_len: 2,
            last_seq: 1,
            segments: 1,
        };
        let c = claimed(Some(before), 2);
        let u = dead_holder_usage(&c, &evs, 9, Some(2), &RUNNER, 5).unwrap();
        assert_eq!((u.segment, u.prompt_tokens, u.completion_tokens), (1, 0, 1));
        assert!(dead_holder_usage(&c, &evs, 9, Some(1), &RUNNER, 5).is_none());
    }

    #[test]
    fn a_finished_stream_bills_the_done_count() {
        let c = claimed(None, 2);
        let evs = [
            delta(1, &[1, 2]),
            ResponseEvent::Done {
                seq: 2,
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: 9,
                    cached_prompt_tokens: 0,
                    completion_tokens: 3,
                },
            },
        ];
        let u = dead_holder_usage(&c, &evs, 9, None, &RUNNER, 5).unwrap();
        assert_eq!(u.completion_tokens, 3);
        assert!(u.last, "the stream ended: nothing resumes it");
    }
}
