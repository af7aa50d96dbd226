//! Ending a claimed job with an error its client receives (model deleted, platform stopping):
//! one place for the fencing rules of the response stream and the ownership rule of acks.

use crate::broker::Broker;
use crate::error::{QueueError, Result};
use crate::types::{ClaimedJob, ResponseEvent};

/// What the client of a failed job is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFailure {
    /// HTTP status the client gets when nothing was streamed yet.
    pub status: u16,
    /// OpenAI-style code.
    pub code: String,
    /// The offending request field, if any.
    pub param: Option<String>,
    /// Human-readable message.
    pub message: String,
}

/// Appends `failure` as the job's last response event (after whatever a previous holder
/// streamed; nothing if its stream already ended) and acks the entry. A job another consumer
/// took over meanwhile is left to it.
pub async fn fail_job(broker: &dyn Broker, job: &ClaimedJob, failure: &JobFailure) -> Result<()> {
    let mut seq = job.job.resume.as_ref().map_or(0, |r| r.last_seq) + 1;
    // A dead holder may have streamed past the resume point: retry after its last seq.
    for _ in 0..4 {
        let event = ResponseEvent::Error {
            seq,
            status: failure.status,
            code: failure.code.clone(),
            param: failure.param.clone(),
            message: failure.message.clone(),
        };
        match broker.append_response(job.job.id, &event).await {
            Ok(()) | Err(QueueError::ResponseFinished { .. }) => break,
            Err(QueueError::SeqConflict { last, .. }) => seq = last + 1,
            Err(e) => return Err(e),
        }
    }
    match broker.ack(job).await {
        Ok(()) | Err(QueueError::NotOwner { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;
    use crate::types::{Job, Resume};
    use crate::MemoryBroker;

    fn failure() -> JobFailure {
        JobFailure {
            status: 503,
            code: "shutting_down".into(),
            param: None,
            message: "stopping".into(),
        }
    }

    fn job(resume: Option<Resume>) -> Job {
        Job {
            id: Uuid::now_v7(),
            tenant: "t".into(),
            model: "m".into(),
            body: serde_json::json!({}),
            enqueued_at_ms: 0,
            deadline_ms: 0,
            resume,
        }
    }

    fn delta(seq: u64) -> ResponseEvent {
        ResponseEvent::delta(seq, "x", vec![1])
    }

    async fn claimed(broker: &MemoryBroker, job: &Job) -> ClaimedJob {
        broker.enqueue(job).await.unwrap();
        let mut got = broker.claim("m", "c", 1, Duration::ZERO).await.unwrap();
        got.pop().unwrap()
    }

    async fn events(broker: &MemoryBroker, id: Uuid) -> Vec<ResponseEvent> {
        broker
            .read_responses(id, 0, 100, Duration::ZERO)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_error_follows_what_a_dead_holder_streamed_past_the_resume_point() {
        let broker = MemoryBroker::default();
        // Resumed at seq 1, but a later holder streamed seqs 2 and 3 before dying.
        let j = job(Some(Resume {
            last_seq: 1,
            ..Resume::default()
        }));
        for seq in 1..=3 {
            broker.append_response(j.id, &delta(seq)).await.unwrap();
        }
        let c = claimed(&broker, &j).await;
        fail_job(&broker, &c, &failure()).await.unwrap();
        let evs = events(&broker, j.id).await;
        assert_eq!(evs.len(), 4);
        assert!(
            matches!(&evs[3], ResponseEvent::Error { seq: 4, status: 503, code, .. } if code == "shutting_down")
        );
        assert_eq!(broker.depth("m").await.unwrap().in_flight, 0, "acked");
    }

    #[tokio::test]
    async fn a_finished_stream_is_left_as_it_is_and_the_job_acked() {
        let broker = MemoryBroker::default();
        let j = job(None);
        broker.append_response(j.id, &delta(1)).await.unwrap();
        let done = ResponseEvent::Done {
            seq: 2,
            finish_reason: crate::types::FinishReason::Stop,
            usage: crate::types::Usage::default(),
        };
        broker.append_response(j.id, &done).await.unwrap();
        let c = claimed(&broker, &j).await;
        fail_job(&broker, &c, &failure()).await.unwrap();
        assert_eq!(events(&broker, j.id).await, vec![delta(1), done]);
        assert_eq!(broker.depth("m").await.unwrap().in_flight, 0);
    }
}
