//! The typed records of the broker protocol (design.md, "Broker protocol").
//!
//! Times are milliseconds since the Unix epoch; money is integer micro-units.

use serde::{Deserialize, Serialize};
use tidal_protocol::chat::TokenLogprob;
use uuid::Uuid;

/// Id of a stream entry (`<ms>-<seq>`), as Redis Streams spell it.
pub type EntryId = String;

/// A request waiting in (or claimed from) a model's jobs stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Request id (UUIDv7); also names the response stream.
    pub id: Uuid,
    /// Tenant that pays for it.
    pub tenant: String,
    /// Model id (`namespace/name` on Kubernetes).
    pub model: String,
    /// Normalised request JSON (messages or prompt, sampling params, max_tokens, stop, seed).
    pub body: serde_json::Value,
    /// When the gateway accepted it.
    pub enqueued_at_ms: u64,
    /// After this instant a job that has not started is never executed (0: no deadline).
    pub deadline_ms: u64,
    /// Set on a job re-enqueued by a draining worker, or by the worker that took over a dead
    /// worker's job.
    pub resume: Option<Resume>,
}

/// Bytes of text per token in the broker's prompt estimate, the usual rule of thumb for
/// English. Smaller vocabularies run lower: SmolLM2's gives 2.8-3.9 (docs/autoscaling.md).
pub const BYTES_PER_TOKEN_ESTIMATE: u64 = 4;

impl Job {
    /// Prompt tokens this job will prefill, estimated from its text (the gateway does not
    /// tokenize): the bytes of every string under `messages` and `prompt` over
    /// [`BYTES_PER_TOKEN_ESTIMATE`], plus the tokens a resumed job re-prefills. The broker
    /// adds it to the model's `arrived_prompt_tokens`, which needs only a rough figure.
    pub fn prompt_tokens_estimate(&self) -> u64 {
        fn text_bytes(v: &serde_json::Value) -> u64 {
            match v {
                serde_json::Value::String(s) => s.len() as u64,
                serde_json::Value::Array(a) => a.iter().map(text_bytes).sum(),
                serde_json::Value::Object(o) => o.values().map(text_bytes).sum(),
                _ => 0,
            }
        }
        let bytes: u64 = ["messages", "prompt"]
            .iter()
            .filter_map(|k| self.body.get(k))
            .map(text_bytes)
            .sum();
        let resumed = self.resume.as_ref().map_or(0, |r| r.token_ids.len() as u64);
        bytes.div_ceil(BYTES_PER_TOKEN_ESTIMATE) + resumed
    }
}

/// What was already delivered to the client of a resumed job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// Completion token ids delivered so far, in order (the resumer re-prefills them).
    pub token_ids: Vec<u32>,
    /// Bytes of completion text delivered so far.
    pub text_len: u64,
    /// Seq of the last response event written; the resumer writes `last_seq + 1` next.
    pub last_seq: u64,
    /// Segments already run; the next segment's usage event carries this number.
    pub segments: u32,
}

impl Resume {
    /// Rebuilds the delivered state from a response stream read from its start (used by a
    /// worker that takes over a dead consumer's job, which left no resume record).
    /// `segments` is left 0; [`ClaimedJob::segment`] accounts for takeovers.
    pub fn from_events(events: &[ResponseEvent]) -> Self {
        let mut r = Resume::default();
        for ev in events {
            if let ResponseEvent::Delta {
                text, token_ids, ..
            } = ev
            {
                r.token_ids.extend_from_slice(token_ids);
                r.text_len += text.len() as u64;
            }
            r.last_seq = r.last_seq.max(ev.seq());
        }
        r
    }
}

/// A job handed to a consumer: the job, where it sits, and how often it was handed out.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// The job.
    pub job: Job,
    /// Its entry in the model's jobs stream (needed to ack or re-enqueue it).
    pub entry_id: EntryId,
    /// The consumer that holds it now.
    pub consumer: String,
    /// How many times this entry was delivered (1 on a first claim, more after takeovers).
    pub attempt: u32,
}

impl ClaimedJob {
    /// The segment number this holder's usage event must carry: segments of earlier entries
    /// (from `resume`) plus one per earlier delivery of this entry (dead consumers).
    pub fn segment(&self) -> u32 {
        let base = self.job.resume.as_ref().map_or(0, |r| r.segments);
        base + self.attempt.saturating_sub(1)
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop sequence or the end-of-sequence token.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

/// Token counts of a whole request as the client sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Completion tokens delivered.
    pub completion_tokens: u64,
}

/// One event of a request's response stream. Every event carries its seq (1, 2, ...),
/// so a reader that reconnects with its last seq never sees an event twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseEvent {
    /// Newly generated text.
    Delta {
        /// Position in the stream.
        seq: u64,
        /// Decoded text of these tokens.
        text: String,
        /// The token ids.
        token_ids: Vec<u32>,
        /// Log-probabilities of these tokens, one entry per token, when the request asked
        /// for them (rendered by the worker, which has the tokenizer); empty otherwise.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TokenLogprob>,
    },
    /// Generation finished; the last event of the stream.
    Done {
        /// Position in the stream.
        seq: u64,
        /// Why it finished.
        finish_reason: FinishReason,
        /// Totals over all segments.
        usage: Usage,
    },
    /// Generation failed; the last event of the stream.
    Error {
        /// Position in the stream.
        seq: u64,
        /// HTTP status the client gets when nothing was streamed yet (400 for a request the
        /// worker found invalid, 500/503 for failures on our side).
        #[serde(default = "default_error_status")]
        status: u16,
        /// Machine-readable code (OpenAI style, e.g. `context_length_exceeded`).
        code: String,
        /// The offending request field, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        param: Option<String>,
        /// Human-readable message.
        message: String,
    },
}

fn default_error_status() -> u16 {
    500
}

impl ResponseEvent {
    /// A delta without log-probabilities.
    pub fn delta(seq: u64, text: impl Into<String>, token_ids: Vec<u32>) -> Self {
        ResponseEvent::Delta {
            seq,
            text: text.into(),
            token_ids,
            logprobs: Vec::new(),
        }
    }

    /// The event's position in its stream.
    pub fn seq(&self) -> u64 {
        match self {
            ResponseEvent::Delta { seq, .. }
            | ResponseEvent::Done { seq, .. }
            | ResponseEvent::Error { seq, .. } => *seq,
        }
    }

    /// Whether nothing may follow this event.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, ResponseEvent::Delta { .. })
    }
}

/// Kind of capacity a worker runs on (billing reports cost by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityType {
    /// Spot / preemptible nodes.
    Spot,
    /// On-demand nodes.
    OnDemand,
}

/// Metering record of one segment (a stretch of generation by one worker).
/// `(request_id, segment)` is its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageEvent {
    /// The request.
    pub request_id: Uuid,
    /// Segment number ([`ClaimedJob::segment`]).
    pub segment: u32,
    /// Tenant billed.
    pub tenant: String,
    /// Model used.
    pub model: String,
    /// Prompt tokens billed in this segment (the first segment bills the prompt; resumes 0).
    pub prompt_tokens: u64,
    /// Of those, served from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Completion tokens delivered in this segment.
    pub completion_tokens: u64,
    /// Worker that ran the segment.
    pub worker: String,
    /// Capacity it ran on.
    pub capacity_type: CapacityType,
    /// Segment start.
    pub started_at_ms: u64,
    /// Segment end.
    pub ended_at_ms: u64,
    /// The request's last segment: it ended here (finished, failed, cancelled or lost), so
    /// billing releases its budget hold whole once this is recorded.
    #[serde(default)]
    pub last: bool,
}

/// A usage event read by a billing consumer, with the entry to ack once it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDelivery {
    /// Entry id in the usage stream.
    pub entry_id: EntryId,
    /// The event.
    pub event: UsageEvent,
}

/// A worker's load report (`{prefix}workers:{model}` hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerHeartbeat {
    /// Worker name (pod name, or `local-N`).
    pub worker: String,
    /// Model it serves.
    pub model: String,
    /// Sequences running.
    pub running: u32,
    /// Sequences admitted but waiting for KV blocks.
    pub waiting: u32,
    /// Free KV-cache blocks.
    pub free_kv_blocks: u32,
    /// Capacity it runs on.
    pub capacity_type: CapacityType,
    /// Whether it is draining (SIGTERM received, claims nothing new).
    pub draining: bool,
    /// When it reported (its clock).
    pub last_seen_ms: u64,
}

/// Serving state of a model, as `/v1/models` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// No workers; the first request starts one.
    ScaledToZero,
    /// Workers requested, none ready yet.
    Starting,
    /// At least one worker serving.
    Ready,
}

/// Prices per million tokens, in integer micro-units of `currency`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Prices {
    /// ISO 4217 code, e.g. `USD`.
    pub currency: String,
    /// Per million prompt tokens.
    pub input_per_mtok_micros: u64,
    /// Per million prompt tokens served from the prefix cache.
    pub cached_input_per_mtok_micros: u64,
    /// Per million completion tokens.
    pub output_per_mtok_micros: u64,
}

/// A model's public record in the `{prefix}models` hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// Model id.
    pub id: String,
    /// Serving state.
    pub state: ModelState,
    /// Prices.
    pub prices: Prices,
    /// Longest a request may wait for a worker (cold start included) before a 503.
    pub max_queue_wait_ms: u64,
    /// Most jobs waiting before the gateway answers 503.
    pub backlog_cap: u64,
    /// Context length in tokens.
    pub context_length: u32,
}

/// Depth figures of one model's queue, the autoscaler's input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDepth {
    /// Jobs enqueued and not yet claimed by any worker.
    pub backlog: u64,
    /// Jobs claimed and not yet acked (pending entries).
    pub in_flight: u64,
    /// Of `in_flight`, the jobs whose worker has delivered their first token
    /// ([`crate::Broker::mark_decoding`]): they only decode now. Never more than `in_flight`.
    #[serde(default)]
    pub decoding: u64,
    /// How long the oldest unclaimed job has waited (`None` when the backlog is empty).
    pub oldest_wait_ms: Option<u64>,
    /// Prompt tokens enqueued for the model so far (`enqueue` and `submit`), estimated by
    /// [`Job::prompt_tokens_estimate`]: a counter that only grows (the autoscaler's prefill
    /// sizing uses its growth), reset only when the model is purged.
    #[serde(default)]
    pub arrived_prompt_tokens: u64,
}

/// Outcome of withdrawing a queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// The job will never run.
    Withdrawn,
    /// A worker started it first; cancel it instead.
    AlreadyStarted,
}

/// Who sent a request and how its answer is shaped: kept by the broker beside the job, from
/// enqueue until the client has its answer (or `request_ttl` passes), so that any gateway
/// replica can let the client reattach to the response stream and refuse other tenants.
/// Transient per-request state lives with the queue, not in the ledger (which holds money):
/// writing it costs the gateway one Redis command instead of a database commit per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Request id (the job id, UUIDv7).
    pub id: Uuid,
    /// Tenant that owns it.
    pub tenant: String,
    /// Model it was sent to.
    pub model: String,
    /// Entry id of its job in the model's jobs stream.
    pub entry_id: EntryId,
    /// The shape of its response chunks as the gateway names it (`chat`, `completion`);
    /// opaque to the broker.
    pub endpoint: String,
    /// Whether its stream ends with a usage chunk.
    pub include_usage: bool,
    /// Whether its chunks carry log-probabilities.
    #[serde(default)]
    pub logprobs: bool,
    /// The idempotency key it was sent with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<Idempotency>,
    /// After this instant (ms since the epoch) an unstarted job never runs (0: no deadline).
    pub deadline_ms: u64,
    /// When it was accepted (ms since the epoch).
    pub created_at_ms: u64,
}

/// The `Idempotency-Key` a request was sent with (one job per tenant and key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Idempotency {
    /// The key, as the client sent it.
    pub key: String,
    /// Digest of the request as sent (endpoint and body): a retry under the key must send
    /// the same request.
    pub fingerprint: String,
}

/// What [`crate::Broker::submit`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    /// The job was enqueued at this entry and its record kept.
    Enqueued(EntryId),
    /// The tenant already used this idempotency key: nothing was enqueued. `id` is the first
    /// request's; `record` its record, or `None` once that request was delivered in full
    /// (or stopped) and forgotten.
    Duplicate {
        /// The first request's id.
        id: Uuid,
        /// The first request's record, while it is kept.
        record: Option<RequestRecord>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(seq: u64, text: &str, ids: &[u32]) -> ResponseEvent {
        ResponseEvent::delta(seq, text, ids.to_vec())
    }

    #[test]
    fn prompt_estimate_reads_messages_prompt_and_resumed_tokens() {
        let job = |body: serde_json::Value, resume: Option<Resume>| Job {
            id: Uuid::nil(),
            tenant: "t".into(),
            model: "m".into(),
            body,
            enqueued_at_ms: 0,
            deadline_ms: 0,
            resume,
        };
        let chat = serde_json::json!({
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}
            ],
            "max_tokens": 99999,
            "stop": ["a long stop string is not prompt text"]
        });
        // system 6 + 8, user 4 + text 4 + abcdefgh 8: 30 bytes, 8 tokens
        assert_eq!(job(chat, None).prompt_tokens_estimate(), 8);
        let batch = serde_json::json!({"prompt": ["abcd", "efgh"]});
        assert_eq!(job(batch.clone(), None).prompt_tokens_estimate(), 2);
        let resumed = Resume {
            token_ids: vec![1, 2, 3],
            ..Resume::default()
        };
        assert_eq!(job(batch, Some(resumed)).prompt_tokens_estimate(), 5);
        assert_eq!(job(serde_json::json!({}), None).prompt_tokens_estimate(), 0);
    }

    #[test]
    fn resume_from_events_concatenates_deltas() {
        let evs = [delta(1, "Hel", &[5, 6]), delta(2, "lo", &[7])];
        let r = Resume::from_events(&evs);
        assert_eq!(r.token_ids, vec![5, 6, 7]);
        assert_eq!(r.text_len, 5);
        assert_eq!(r.last_seq, 2);
        assert_eq!(r.segments, 0);
    }

    #[test]
    fn resume_from_no_events_is_empty() {
        assert_eq!(Resume::from_events(&[]), Resume::default());
    }

    #[test]
    fn segment_counts_resumes_and_takeovers() {
        let job = Job {
            id: Uuid::now_v7(),
            tenant: "t".into(),
            model: "m".into(),
            body: serde_json::json!({}),
            enqueued_at_ms: 0,
            deadline_ms: 0,
            resume: None,
        };
        let mut c = ClaimedJob {
            job,
            entry_id: "1-0".into(),
            consumer: "w".into(),
            attempt: 1,
        };
        assert_eq!(c.segment(), 0);
        c.attempt = 3;
        assert_eq!(c.segment(), 2);
        c.job.resume = Some(Resume {
            segments: 2,
            ..Resume::default()
        });
        c.attempt = 1;
        assert_eq!(c.segment(), 2);
        c.attempt = 2;
        assert_eq!(c.segment(), 3);
    }

    #[test]
    fn response_event_json_is_tagged() {
        let ev = ResponseEvent::Done {
            seq: 4,
            finish_reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 3,
                cached_prompt_tokens: 1,
                completion_tokens: 2,
            },
        };
        let s = serde_json::to_string(&ev).unwrap();
        assert!(s.contains(r#""type":"done""#), "{s}");
        assert!(s.contains(r#""finish_reason":"length""#), "{s}");
        assert_eq!(serde_json::from_str::<ResponseEvent>(&s).unwrap(), ev);
        assert!(ev.is_terminal());
        assert!(!delta(1, "", &[]).is_terminal());
        assert_eq!(ev.seq(), 4);
    }
}
