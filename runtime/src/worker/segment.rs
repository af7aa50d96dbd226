//! One segment of a request (its stretch of generation on this worker), as pure
//! bookkeeping: which seq the next response event takes, what this segment delivered, the
//! events that end the stream, the segment's usage event and the resume record for the
//! next worker. The I/O lives in `job.rs`.
//!
//! Billing rules (design.md, "Preemption-safe generation"): the request's first segment
//! bills the prompt once it reached the engine; every segment bills the completion tokens
//! it delivered (on `done`, the engine's count, which includes the end-of-generation token
//! that is never shown); a resumed segment bills no prompt (the re-prefill is our cost).

use tidal_protocol::chat::TokenLogprob;
use tidal_queue::{
    CapacityType, ClaimedJob, FinishReason, ResponseEvent, Resume, Usage, UsageEvent,
};
use uuid::Uuid;

use crate::engine;

/// Who ran a segment, for its usage event.
#[derive(Debug, Clone)]
pub struct Runner<'a> {
    /// Worker name.
    pub worker: &'a str,
    /// Capacity it runs on.
    pub capacity_type: CapacityType,
}

/// Bookkeeping of the segment this worker runs for one claimed job.
#[derive(Debug, Clone)]
pub struct Segment {
    request_id: Uuid,
    tenant: String,
    model: String,
    segment: u32,
    bills_prompt: bool,
    /// What earlier segments delivered.
    before: Resume,
    next_seq: u64,
    delivered: Vec<u32>,
    /// Seq and token count of each delta this segment wrote, in order.
    deltas: Vec<(u64, u64)>,
    text_len: u64,
    started_at_ms: u64,
}

impl Segment {
    /// The segment of `job` starting at `now_ms`.
    pub fn new(job: &ClaimedJob, now_ms: u64) -> Self {
        let before = job.job.resume.clone().unwrap_or_default();
        Segment {
            request_id: job.job.id,
            tenant: job.job.tenant.clone(),
            model: job.job.model.clone(),
            segment: job.segment(),
            bills_prompt: job.job.resume.is_none() && job.attempt <= 1,
            next_seq: before.last_seq + 1,
            before,
            delivered: Vec::new(),
            deltas: Vec::new(),
            text_len: 0,
            started_at_ms: now_ms,
        }
    }

    /// The segment number (the usage event's idempotency key with the request id).
    pub fn number(&self) -> u32 {
        self.segment
    }

    /// Whether this segment bills the prompt.
    pub fn bills_prompt(&self) -> bool {
        self.bills_prompt
    }

    /// What earlier segments delivered (the engine resumes from it).
    pub fn resumed_from(&self) -> engine::ResumeFrom {
        engine::ResumeFrom {
            token_ids: self.before.token_ids.clone(),
            text_len: usize::try_from(self.before.text_len).unwrap_or(usize::MAX),
        }
    }

    /// Whether earlier segments delivered anything.
    pub fn is_resumed(&self) -> bool {
        !self.before.token_ids.is_empty() || self.before.text_len > 0 || self.before.last_seq > 0
    }

    /// Completion tokens this segment delivered so far.
    pub fn delivered_tokens(&self) -> u64 {
        self.delivered.len() as u64
    }

    /// Completion tokens of this segment's deltas with seq up to `seq`: what a client that
    /// was handed the events up to `seq` received from this segment (a cancelled request
    /// bills these and no more).
    pub fn delivered_through(&self, seq: u64) -> u64 {
        self.deltas
            .iter()
            .take_while(|(s, _)| *s <= seq)
            .map(|(_, n)| n)
            .sum()
    }

    /// The next delta event (not yet written).
    pub fn delta(
        &self,
        text: String,
        token_ids: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    ) -> ResponseEvent {
        ResponseEvent::Delta {
            seq: self.next_seq,
            text,
            token_ids,
            logprobs,
        }
    }

    /// The `done` event: totals over all segments, as the client sees them. A resumed
    /// request reports no cached prompt tokens (the first segment's figure is not carried).
    pub fn done(&self, finish: engine::FinishReason, usage: &engine::Usage) -> ResponseEvent {
        ResponseEvent::Done {
            seq: self.next_seq,
            finish_reason: match finish {
                engine::FinishReason::Stop => FinishReason::Stop,
                engine::FinishReason::Length => FinishReason::Length,
            },
            usage: Usage {
                prompt_tokens: usage.prompt_tokens as u64,
                cached_prompt_tokens: if self.bills_prompt {
                    usage.cached_tokens as u64
                } else {
                    0
                },
                completion_tokens: usage.completion_tokens as u64,
            },
        }
    }

    /// An `error` event.
    pub fn error(
        &self,
        status: u16,
        code: impl Into<String>,
        param: Option<String>,
        message: impl Into<String>,
    ) -> ResponseEvent {
        ResponseEvent::Error {
            seq: self.next_seq,
            status,
            code: code.into(),
            param,
            message: message.into(),
        }
    }

    /// Records that `event` (built by this segment) was written.
    pub fn written(&mut self, event: &ResponseEvent) {
        if let ResponseEvent::Delta {
            text, token_ids, ..
        } = event
        {
            self.delivered.extend_from_slice(token_ids);
            self.deltas.push((event.seq(), token_ids.len() as u64));
            self.text_len += text.len() as u64;
        }
        self.next_seq = event.seq() + 1;
    }

    /// What the next worker resumes from: everything delivered, by every segment.
    /// (`segments` is set by [`tidal_queue::Broker::requeue`].)
    pub fn resume(&self) -> Resume {
        let mut token_ids = self.before.token_ids.clone();
        token_ids.extend_from_slice(&self.delivered);
        Resume {
            token_ids,
            text_len: self.before.text_len + self.text_len,
            last_seq: self.next_seq - 1,
            segments: 0,
        }
    }

    /// Completion tokens to bill for this segment when the engine finished the request
    /// with `usage` (its count covers the whole request and the stop token).
    pub fn completion_at_done(&self, usage: &engine::Usage) -> u64 {
        (usage.completion_tokens as u64).saturating_sub(self.before.token_ids.len() as u64)
    }

    /// The segment's usage event: `prompt` tokens (`cached` of them from the prefix cache)
    /// if this segment bills the prompt, and `completion` tokens; `last` when the request
    /// ends with this segment (no other worker resumes it).
    pub fn usage(
        &self,
        runner: &Runner<'_>,
        prompt: u64,
        cached: u64,
        completion: u64,
        now_ms: u64,
        last: bool,
    ) -> UsageEvent {
        let (prompt, cached) = if self.bills_prompt {
            (prompt, cached)
        } else {
            (0, 0)
        };
        UsageEvent {
            request_id: self.request_id,
            segment: self.segment,
            tenant: self.tenant.clone(),
            model: self.model.clone(),
            prompt_tokens: prompt,
            cached_prompt_tokens: cached,
            completion_tokens: completion,
            worker: runner.worker.to_owned(),
            capacity_type: runner.capacity_type,
            started_at_ms: self.started_at_ms,
            ended_at_ms: now_ms.max(self.started_at_ms),
            last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_queue::Job;

    fn claimed(resume: Option<Resume>, attempt: u32) -> ClaimedJob {
        ClaimedJob {
            job: Job {
                id: Uuid::now_v7(),
                tenant: "acme".into(),
                model: "m".into(),
                body: serde_json::json!({}),
                enqueued_at_ms: 1,
                deadline_ms: 0,
                resume,
            },
            entry_id: "1-0".into(),
            consumer: "w".into(),
            attempt,
        }
    }

    const RUNNER: Runner<'static> = Runner {
        worker: "w",
        capacity_type: CapacityType::Spot,
    };

    #[test]
    fn a_fresh_segment_numbers_events_from_one_and_bills_the_prompt() {
        let mut s = Segment::new(&claimed(None, 1), 100);
        assert_eq!(
            (s.number(), s.bills_prompt(), s.is_resumed()),
            (0, true, false)
        );
        let d = s.delta("Hel".into(), vec![1, 2], vec![]);
        assert_eq!(d.seq(), 1);
        s.written(&d);
        let d = s.delta("lo".into(), vec![3], vec![]);
        assert_eq!(d.seq(), 2);
        s.written(&d);
        let usage = engine::Usage {
            prompt_tokens: 7,
            cached_tokens: 4,
            completion_tokens: 4, // three shown plus the end-of-generation token
        };
        let done = s.done(engine::FinishReason::Stop, &usage);
        assert_eq!(
            done,
            ResponseEvent::Done {
                seq: 3,
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: 7,
                    cached_prompt_tokens: 4,
                    completion_tokens: 4
                }
            }
        );
        assert_eq!(s.completion_at_done(&usage), 4);
        let u = s.usage(&RUNNER, 7, 4, s.completion_at_done(&usage), 150, true);
        assert_eq!(
            (
                u.segment,
                u.prompt_tokens,
                u.cached_prompt_tokens,
                u.completion_tokens
            ),
            (0, 7, 4, 4)
        );
        assert_eq!((u.started_at_ms, u.ended_at_ms), (100, 150));
        assert_eq!(s.delivered_tokens(), 3);
        let r = s.resume();
        assert_eq!((r.token_ids, r.text_len, r.last_seq), (vec![1, 2, 3], 5, 2));
    }

    #[test]
    fn a_resumed_segment_continues_seqs_and_bills_only_its_own_tokens() {
        let before = Resume {
            token_ids: vec![1, 2, 3],
            text_len: 5,
            last_seq: 2,
            segments: 1,
        };
        let mut s = Segment::new(&claimed(Some(before), 1), 0);
        assert_eq!(
            (s.number(), s.bills_prompt(), s.is_resumed()),
            (1, false, true)
        );
        assert_eq!(
            s.resumed_from(),
            engine::ResumeFrom {
                token_ids: vec![1, 2, 3],
                text_len: 5
            }
        );
        let d = s.delta("!".into(), vec![4], vec![]);
        assert_eq!(d.seq(), 3);
        s.written(&d);
        let usage = engine::Usage {
            prompt_tokens: 7,
            cached_tokens: 6,
            completion_tokens: 4,
        };
        let ResponseEvent::Done { seq, usage: u, .. } =
            s.done(engine::FinishReason::Length, &usage)
        else {
            panic!()
        };
        assert_eq!(
            (seq, u.cached_prompt_tokens, u.completion_tokens),
            (4, 0, 4)
        );
        assert_eq!(s.completion_at_done(&usage), 1);
        let ev = s.usage(&RUNNER, 7, 6, 1, 10, false);
        assert_eq!((ev.prompt_tokens, ev.cached_prompt_tokens), (0, 0));
        let r = s.resume();
        assert_eq!(
            (r.token_ids, r.text_len, r.last_seq),
            (vec![1, 2, 3, 4], 6, 3)
        );
        // A cancel up to an earlier segment's seq bills nothing of this one.
        assert_eq!((s.delivered_through(2), s.delivered_through(3)), (0, 1));
    }

    #[test]
    fn delivered_through_counts_the_deltas_up_to_a_seq() {
        let mut s = Segment::new(&claimed(None, 1), 0);
        for ids in [&[1, 2][..], &[], &[3, 4, 5]] {
            let d = s.delta("x".into(), ids.to_vec(), vec![]);
            s.written(&d);
        }
        let counts: Vec<u64> = (0..=4).map(|seq| s.delivered_through(seq)).collect();
        assert_eq!(counts, [0, 2, 2, 5, 5]);
    }

    #[test]
    fn a_taken_over_entry_is_not_the_first_segment() {
        let s = Segment::new(&claimed(None, 2), 0);
        assert_eq!((s.number(), s.bills_prompt()), (1, false));
        let e = s.error(400, "invalid_request_error", Some("prompt".into()), "bad");
        assert_eq!(e.seq(), 1);
        assert!(e.is_terminal());
    }
}
