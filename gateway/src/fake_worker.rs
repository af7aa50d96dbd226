//! A worker without a model, for tests and the gateway benchmark: it claims jobs from the
//! broker like a runtime worker and "generates" by echoing the prompt's words back, one
//! response event per word, then `done`, one usage event, and an ack.
//!
//! Deterministic, so tests can check exact output: the completion of a prompt with words
//! `w1 w2 ... wn` is `"w1 w2 ... wn"` (streamed as `"w1"`, `" w2"`, ...), cut at
//! `max_tokens` words (`finish_reason: "length"`, else `"stop"`). Prompt tokens are the words
//! of every message (or the prompt's token ids). A request for log-probabilities gets one
//! entry per word: the piece as its token, log-probability `-(i + 1) / 10` for the i-th word
//! (from 0), no alternatives. It honours cancel flags between words as a runtime worker
//! does (bills the prompt and the words up to the seq the client was handed, writes
//! `cancelled`, acks) and resumes re-enqueued jobs after the words already delivered.

use std::sync::Arc;
use std::time::Duration;

use tidal_protocol::chat::{MessageContent, TokenLogprob};
use tidal_protocol::completion::PromptField;
use tidal_protocol::job::JobRequest;
use tidal_queue::clock::system_now_ms;
use tidal_queue::{
    Broker, CapacityType, ClaimedJob, FinishReason, QueueError, ResponseEvent, Usage, UsageEvent,
};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// How a fake worker behaves.
#[derive(Debug, Clone)]
pub struct FakeWorkerConfig {
    /// Model whose jobs it claims.
    pub model: String,
    /// Consumer name.
    pub consumer: String,
    /// Jobs generated at once.
    pub batch: usize,
    /// Pause before each word.
    pub token_delay: Duration,
}

impl FakeWorkerConfig {
    /// A worker for `model` named `consumer`, 64 jobs at once, no delay.
    pub fn new(model: impl Into<String>, consumer: impl Into<String>) -> Self {
        FakeWorkerConfig {
            model: model.into(),
            consumer: consumer.into(),
            batch: 64,
            token_delay: Duration::ZERO,
        }
    }
}

/// The fake generation of a request: its prompt token count and completion words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeOutput {
    /// Prompt tokens (words of all messages, or token ids).
    pub prompt_tokens: u64,
    /// Completion pieces as streamed (`"w1"`, `" w2"`, ...).
    pub pieces: Vec<String>,
    /// Why it ends.
    pub finish: FinishReason,
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

fn content_text(c: &Option<MessageContent>) -> String {
    match c {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .filter_map(|p| p.text.clone())
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// What the fake model answers to `req` (pure).
pub fn fake_output(req: &JobRequest) -> FakeOutput {
    let (prompt_tokens, echo, max) = match req {
        JobRequest::Chat(r) => {
            let all: usize = r
                .messages
                .iter()
                .map(|m| words(&content_text(&m.content)).len())
                .sum();
            let last = r
                .messages
                .last()
                .map(|m| words(&content_text(&m.content)))
                .unwrap_or_default();
            (all as u64, last, r.max_tokens().ok().flatten())
        }
        JobRequest::Completion(r) => {
            let (n, echo) = match &r.prompt {
                PromptField::Text(t) => (words(t).len(), words(t)),
                PromptField::Texts(v) => {
                    let w = words(&v.join(" "));
                    (w.len(), w)
                }
                PromptField::Tokens(ids) => (ids.len(), ids.iter().map(u32::to_string).collect()),
                PromptField::TokenLists(l) => {
                    let ids: Vec<String> = l.iter().flatten().map(u32::to_string).collect();
                    (ids.len(), ids)
                }
            };
            (n as u64, echo, r.max_tokens().ok())
        }
    };
    let take = max.map_or(echo.len(), |m| m.min(echo.len()));
    let finish = if take < echo.len() {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let pieces = echo
        .into_iter()
        .take(take)
        .enumerate()
        .map(|(i, w)| if i == 0 { w } else { format!(" {w}") })
        .collect();
    FakeOutput {
        prompt_tokens,
        pieces,
        finish,
    }
}

/// A running fake worker; stop it with [`FakeWorker::stop`].
#[derive(Debug)]
pub struct FakeWorker {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeWorker {
    /// Starts claiming `config.model`'s jobs from `broker`.
    pub fn spawn(broker: Arc<dyn Broker>, config: FakeWorkerConfig) -> Self {
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(broker, config, rx));
        FakeWorker { stop, task }
    }

    /// Stops claiming and waits for the jobs in hand to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(broker: Arc<dyn Broker>, cfg: FakeWorkerConfig, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(cfg.batch.max(1)));
    let mut jobs = JoinSet::new();
    let cfg = Arc::new(cfg);
    loop {
        if *stop.borrow() {
            break;
        }
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                _ = jobs.join_next() => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let claimed = tokio::select! {
            r = broker.claim(&cfg.model, &cfg.consumer, free, Duration::from_millis(200)) => r,
            _ = stop.changed() => continue,
        };
        match claimed {
            Ok(batch) => {
                for job in batch {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        break;
                    };
                    let (b, c) = (broker.clone(), cfg.clone());
                    jobs.spawn(async move {
                        if let Err(e) = serve(b.as_ref(), &c, &job).await {
                            tracing::warn!(error = %e, id = %job.job.id, "fake worker job failed");
                        }
                        drop(permit);
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "fake worker claim failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        while jobs.try_join_next().is_some() {}
    }
    while jobs.join_next().await.is_some() {}
}

/// The log-probability the fake worker reports for its `i`-th word (from 0).
pub fn fake_logprob(i: usize) -> f32 {
    -((i + 1) as f32) / 10.0
}

/// Generates one claimed job: deltas, done, usage, ack.
pub async fn serve(
    broker: &dyn Broker,
    cfg: &FakeWorkerConfig,
    claimed: &ClaimedJob,
) -> Result<(), QueueError> {
    let job = &claimed.job;
    let started = system_now_ms();
    let req = match JobRequest::from_body(&job.body) {
        Ok(r) => r,
        Err(e) => {
            let ev = ResponseEvent::Error {
                seq: 1,
                status: e.status,
                code: e.code.as_deref().unwrap_or("invalid_request").to_owned(),
                param: e.param.clone(),
                message: e.message.clone(),
            };
            return finish(broker, claimed, Some(ev)).await;
        }
    };
    let out = fake_output(&req);
    let wants_logprobs = req.logprobs();
    let (skip, mut seq) = job
        .resume
        .as_ref()
        .map_or((0, 0), |r| (r.token_ids.len(), r.last_seq));
    let first_seq = seq + 1;
    // Every usage event of the fake worker ends its request (done or cancelled).
    let usage_event = |completion_tokens: u64| UsageEvent {
        request_id: job.id,
        segment: claimed.segment(),
        tenant: job.tenant.clone(),
        model: job.model.clone(),
        prompt_tokens: if job.resume.is_some() {
            0
        } else {
            out.prompt_tokens
        },
        cached_prompt_tokens: 0,
        completion_tokens,
        worker: cfg.consumer.clone(),
        capacity_type: CapacityType::OnDemand,
        started_at_ms: started,
        ended_at_ms: system_now_ms(),
        last: true,
    };
    let mut delivered = 0u64;
    for (i, piece) in out.pieces.iter().enumerate().skip(skip) {
        if !cfg.token_delay.is_zero() {
            tokio::time::sleep(cfg.token_delay).await;
            let flag = broker.cancelled(&[job.id]).await?.into_iter().next();
            if let Some(Some(handed)) = flag {
                // One word per delta: the words of seqs first_seq..=handed reached the client.
                let words = (handed.min(seq) + 1).saturating_sub(first_seq);
                broker.publish_usage(&usage_event(words)).await?;
                let cancelled = ResponseEvent::Error {
                    seq: seq + 1,
                    status: 499,
                    code: "cancelled".into(),
                    param: None,
                    message: "the request was cancelled".into(),
                };
                return finish(broker, claimed, Some(cancelled)).await;
            }
        }
        seq += 1;
        let logprobs = if wants_logprobs {
            vec![TokenLogprob {
                token: piece.clone(),
                logprob: fake_logprob(i),
                bytes: piece.as_bytes().to_vec(),
                top_logprobs: vec![],
            }]
        } else {
            vec![]
        };
        let ev = ResponseEvent::Delta {
            seq,
            text: piece.clone(),
            token_ids: vec![i as u32],
            logprobs,
        };
        match broker.append_response(job.id, &ev).await {
            Ok(()) => delivered += 1,
            // Taken over, or the reader is gone (stream deleted): stop quietly.
            Err(QueueError::SeqConflict { .. } | QueueError::ResponseFinished { .. }) => {
                return finish(broker, claimed, None).await;
            }
            Err(e) => return Err(e),
        }
    }
    let usage = Usage {
        prompt_tokens: out.prompt_tokens,
        cached_prompt_tokens: 0,
        completion_tokens: out.pieces.len() as u64,
    };
    let done = ResponseEvent::Done {
        seq: seq + 1,
        finish_reason: out.finish,
        usage,
    };
    match broker.append_response(job.id, &done).await {
        Ok(()) | Err(QueueError::SeqConflict { .. } | QueueError::ResponseFinished { .. }) => {}
        Err(e) => return Err(e),
    }
    broker.publish_usage(&usage_event(delivered)).await?;
    finish(broker, claimed, None).await
}

async fn finish(
    broker: &dyn Broker,
    claimed: &ClaimedJob,
    last: Option<ResponseEvent>,
) -> Result<(), QueueError> {
    if let Some(ev) = last {
        match broker.append_response(claimed.job.id, &ev).await {
            Ok(()) | Err(QueueError::SeqConflict { .. } | QueueError::ResponseFinished { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    match broker.ack(claimed).await {
        Ok(()) | Err(QueueError::NotOwner { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: serde_json::Value) -> JobRequest {
        JobRequest::Chat(serde_json::from_value(json).unwrap())
    }

    #[test]
    fn echoes_the_last_message() {
        let out = fake_output(&chat(serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello  tidal world"}
            ]
        })));
        assert_eq!(out.pieces, vec!["hello", " tidal", " world"]);
        assert_eq!(out.prompt_tokens, 5);
        assert_eq!(out.finish, FinishReason::Stop);
    }

    #[test]
    fn max_tokens_cuts_with_length() {
        let out = fake_output(&chat(serde_json::json!({
            "model": "m", "max_tokens": 2,
            "messages": [{"role": "user", "content": "a b c"}]
        })));
        assert_eq!(out.pieces, vec!["a", " b"]);
        assert_eq!(out.finish, FinishReason::Length);
    }

    #[test]
    fn completions_default_to_sixteen_tokens() {
        let words: Vec<String> = (0..20).map(|i| format!("w{i}")).collect();
        let req = JobRequest::Completion(
            serde_json::from_value(serde_json::json!({"model": "m", "prompt": words.join(" ")}))
                .unwrap(),
        );
        let out = fake_output(&req);
        assert_eq!(out.pieces.len(), 16);
        assert_eq!(out.prompt_tokens, 20);
        assert_eq!(out.finish, FinishReason::Length);
        let req = JobRequest::Completion(
            serde_json::from_value(serde_json::json!({"model": "m", "prompt": [5, 6]})).unwrap(),
        );
        assert_eq!(fake_output(&req).pieces, vec!["5", " 6"]);
    }
}
