//! One claimed job on this worker: prepare it for the model, run it in the engine, stream
//! its deltas into the response stream, and end it exactly one way (done, error,
//! cancelled, re-enqueued, lost), each with its usage event and ack.
//!
//! Deltas are coalesced: while one append is in flight, the engine's next deltas queue up
//! and go out together as one event, so a slow round trip costs latency, not throughput,
//! and the worker never falls behind the engine. Appends of different jobs run
//! concurrently (one task per job) and pipeline on the broker's multiplexed connection.

use std::sync::Arc;

use tidal_protocol::job::JobRequest;
use tidal_protocol::ApiError;
use tidal_queue::clock::system_now_ms;
use tidal_queue::{ClaimedJob, Job, ResponseEvent};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use super::io::{self, Appended, Released};
use super::metrics::Outcome;
use super::registry::{Control, HeldGuard};
use super::segment::{Runner, Segment};
use super::{takeover, Shared};
use crate::engine::{self, EngineError, GenerationEvent};
use crate::logprobs;
use crate::server::prepare::{self, Prepared};
use crate::server::LoadedModel;

/// Validates and tokenises a job's request for `model` (what needs the model; the gateway
/// ran the rest).
pub(crate) fn prepare_job(model: &LoadedModel, job: &Job) -> Result<Prepared, ApiError> {
    match JobRequest::from_body(&job.body)? {
        JobRequest::Chat(r) => prepare::chat(model, &r),
        JobRequest::Completion(r) => prepare::completion(model, &r),
    }
}

/// Runs a held job to its end; `guard` unregisters it when the task ends or is aborted.
pub(crate) async fn run(
    shared: Arc<Shared>,
    claimed: ClaimedJob,
    control: watch::Receiver<Control>,
    guard: HeldGuard,
) {
    let outcome = if claimed.attempt > 1 {
        takeover::run(&shared, &claimed).await
    } else {
        JobRun::new(&shared, claimed).run(control).await
    };
    shared.counters.ended(&shared.config.model_id, outcome);
    drop(guard);
}

/// Engine deltas read in one go, merged into one response event.
#[derive(Default)]
struct Batch {
    text: String,
    token_ids: Vec<u32>,
    logprobs: Vec<engine::TokenLogprob>,
    terminal: Option<GenerationEvent>,
}

impl Batch {
    fn absorb(&mut self, event: GenerationEvent) {
        match event {
            GenerationEvent::Delta {
                text,
                token_ids,
                logprobs,
            } => {
                self.text.push_str(&text);
                self.token_ids.extend(token_ids);
                self.logprobs.extend(logprobs);
            }
            terminal => self.terminal = Some(terminal),
        }
    }

    fn has_delta(&self) -> bool {
        !self.text.is_empty() || !self.token_ids.is_empty()
    }
}

struct JobRun<'a> {
    shared: &'a Shared,
    claimed: ClaimedJob,
    seg: Segment,
    prompt_tokens: u64,
}

fn error_code(e: &ApiError) -> String {
    e.code
        .as_deref()
        .map_or_else(|| e.kind.to_owned(), str::to_owned)
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::TooLong { .. } => ApiError::invalid("max_tokens", e.to_string()),
        EngineError::Invalid(m) => ApiError::bad_request(m),
        EngineError::Stopped => ApiError::unavailable("the engine has stopped"),
        // Only a starting engine refuses its draft model.
        EngineError::Draft(_) => ApiError::unavailable(e.to_string()),
    }
}

impl<'a> JobRun<'a> {
    fn new(shared: &'a Shared, claimed: ClaimedJob) -> Self {
        let seg = Segment::new(&claimed, system_now_ms());
        JobRun {
            shared,
            claimed,
            seg,
            prompt_tokens: 0,
        }
    }

    fn runner(&self) -> Runner<'a> {
        Runner {
            worker: &self.shared.config.name,
            capacity_type: self.shared.config.capacity_type,
        }
    }

    async fn run(mut self, mut control: watch::Receiver<Control>) -> Outcome {
        let prepared = match prepare_job(&self.shared.model, &self.claimed.job) {
            Ok(p) => p,
            Err(e) => return self.refuse(&e).await,
        };
        let mut request = prepared.request;
        self.prompt_tokens = request.prompt.len() as u64;
        request.cache_scope = self
            .shared
            .shared_prefixes
            .scope(&self.claimed.job.tenant, &request.prompt);
        if self.seg.is_resumed() {
            request.resume = Some(self.seg.resumed_from());
        }
        let rx = match self.shared.model.engine.submit(request) {
            Ok(rx) => rx,
            Err(e) => return self.refuse(&engine_error(e)).await,
        };
        tracing::debug!(
            request_id = %self.claimed.job.id,
            segment = self.seg.number(),
            resumed_tokens = self.seg.resumed_from().token_ids.len(),
            "job started"
        );
        self.stream(rx, &mut control).await
    }

    /// Streams engine events until the request ends or the job is told to stop.
    async fn stream(
        &mut self,
        mut rx: UnboundedReceiver<GenerationEvent>,
        control: &mut watch::Receiver<Control>,
    ) -> Outcome {
        loop {
            let order = *control.borrow_and_update();
            if order != Control::Run {
                // Dropping the receiver frees the sequence at the engine's next step.
                drop(rx);
                return self.stop(order).await;
            }
            let first = tokio::select! {
                biased;
                changed = control.changed() => {
                    if changed.is_err() {
                        // The registry entry is gone, which only happens once this task ends.
                        return Outcome::Lost;
                    }
                    continue;
                }
                event = rx.recv() => event,
            };
            let Some(first) = first else {
                return self.fail("the engine stopped").await;
            };
            let mut batch = Batch::default();
            batch.absorb(first);
            while batch.terminal.is_none() {
                match rx.try_recv() {
                    Ok(event) => batch.absorb(event),
                    Err(_) => break,
                }
            }
            if batch.has_delta() {
                let logprobs =
                    logprobs::render(self.shared.model.engine.tokenizer(), &batch.logprobs);
                let event = self.seg.delta(batch.text, batch.token_ids, logprobs);
                match io::append(self.shared, &self.claimed, &event).await {
                    Appended::Written => {
                        let first_tokens = self.seg.delivered_tokens() == 0;
                        self.seg.written(&event);
                        if first_tokens && batch.terminal.is_none() {
                            self.mark_decoding().await;
                        }
                    }
                    Appended::Lost => return self.lost().await,
                    Appended::Finished => return self.ack_only().await,
                    Appended::Failed => return Outcome::Abandoned,
                }
            }
            match batch.terminal {
                None => {}
                Some(GenerationEvent::Done {
                    finish_reason,
                    usage,
                }) => return self.complete(finish_reason, usage).await,
                Some(GenerationEvent::Error { message }) => return self.fail(&message).await,
                Some(GenerationEvent::Delta { .. }) => {}
            }
        }
    }

    /// Tells the broker that the segment's first tokens are out: the autoscaler weighs a job
    /// that only decodes lower than one waiting for prefill. Advisory: a failure costs the
    /// autoscaler precision, not the request, and a job that is no longer ours is refused by
    /// the broker and noticed by the next append or keep-alive.
    async fn mark_decoding(&self) {
        if let Err(e) = self.shared.broker.mark_decoding(&self.claimed).await {
            tracing::debug!(request_id = %self.claimed.job.id, error = %e, "could not mark the job as decoding");
        }
    }

    /// The job is no longer ours, and this segment's usage is not published yet. When
    /// another worker holds the entry, that taker bills the segment from the stream. When
    /// no one does (a taker re-enqueued it, or the broker lost it with its data), the tokens
    /// this segment appended are billed here (up to a cancel flag's seq), as a taker bills
    /// them: the same key and counts, so billing keeps one of the two.
    async fn lost(&self) -> Outcome {
        let shared = self.shared;
        let id = self.claimed.job.id;
        match io::retry(shared, "looking up a job's holder", || {
            shared.broker.holder(&self.claimed)
        })
        .await
        {
            Ok(Some(holder)) => {
                tracing::debug!(request_id = %id, holder, "the job was taken over");
                return self.gone();
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "cannot tell who holds a lost job; stopping without billing it");
                return Outcome::Lost;
            }
        }
        let ids = [id];
        let completion = match io::retry(shared, "reading a cancel flag", || {
            shared.broker.cancelled(&ids)
        })
        .await
        {
            Ok(flags) => match flags.into_iter().next().flatten() {
                Some(seq) => self.seg.delivered_through(seq),
                None => self.seg.delivered_tokens(),
            },
            Err(e) => {
                tracing::error!(request_id = %id, error = %e, "cannot read a lost job's cancel flag; stopping without billing it");
                return Outcome::Lost;
            }
        };
        let usage = self.seg.usage(
            &self.runner(),
            self.prompt_tokens,
            0,
            completion,
            system_now_ms(),
            true,
        );
        tracing::warn!(request_id = %id, completion, "no worker holds this request any more; billing what was delivered and stopping");
        io::publish_usage(shared, &usage).await;
        Outcome::Lost
    }

    /// The job is no longer ours and its segment is billed already (or bills nothing).
    fn gone(&self) -> Outcome {
        tracing::warn!(request_id = %self.claimed.job.id, "another worker writes this request now; stopping");
        Outcome::Lost
    }

    /// Writes the request's last event; on success bills `completion` (and `cached` prompt
    /// tokens) and acks.
    async fn finish(
        &mut self,
        event: ResponseEvent,
        cached: u64,
        completion: u64,
        outcome: Outcome,
    ) -> Outcome {
        match io::append(self.shared, &self.claimed, &event).await {
            Appended::Written => self.seg.written(&event),
            Appended::Lost => return self.lost().await,
            Appended::Finished => return self.ack_only().await,
            Appended::Failed => return Outcome::Abandoned,
        }
        self.bill_and_ack(cached, completion, outcome).await
    }

    async fn bill_and_ack(&self, cached: u64, completion: u64, outcome: Outcome) -> Outcome {
        let usage = self.seg.usage(
            &self.runner(),
            self.prompt_tokens,
            cached,
            completion,
            system_now_ms(),
            true,
        );
        if !io::publish_usage(self.shared, &usage).await {
            // Left pending: whoever takes it over bills this segment from the stream.
            return Outcome::Abandoned;
        }
        match io::ack(self.shared, &self.claimed).await {
            Released::Ok => outcome,
            Released::NotOwner => Outcome::Lost,
            Released::Failed => Outcome::Abandoned,
        }
    }

    async fn complete(&mut self, finish: engine::FinishReason, usage: engine::Usage) -> Outcome {
        let event = self.seg.done(finish, &usage);
        let completion = self.seg.completion_at_done(&usage);
        self.finish(
            event,
            usage.cached_tokens as u64,
            completion,
            Outcome::Completed,
        )
        .await
    }

    async fn fail(&mut self, message: &str) -> Outcome {
        tracing::error!(request_id = %self.claimed.job.id, message, "generation failed");
        let event = self.seg.error(500, "server_error", None, message);
        let delivered = self.seg.delivered_tokens();
        self.finish(event, 0, delivered, Outcome::Failed).await
    }

    /// A request refused before it reached the engine: one error event, nothing billed.
    async fn refuse(&mut self, e: &ApiError) -> Outcome {
        tracing::debug!(request_id = %self.claimed.job.id, status = e.status, message = %e.message, "job refused");
        let event = self
            .seg
            .error(e.status, error_code(e), e.param.clone(), e.message.clone());
        match io::append(self.shared, &self.claimed, &event).await {
            Appended::Written | Appended::Finished => {}
            Appended::Lost => return self.gone(),
            Appended::Failed => return Outcome::Abandoned,
        }
        match io::ack(self.shared, &self.claimed).await {
            Released::Ok if e.status < 500 => Outcome::Rejected,
            Released::Ok => Outcome::Failed,
            Released::NotOwner => Outcome::Lost,
            Released::Failed => Outcome::Abandoned,
        }
    }

    /// The stream already ended (someone else finished it): just ack.
    async fn ack_only(&self) -> Outcome {
        match io::ack(self.shared, &self.claimed).await {
            Released::Ok | Released::NotOwner => Outcome::Lost,
            Released::Failed => Outcome::Abandoned,
        }
    }

    /// The client went away after the gateway handed it the response events up to
    /// `delivered_seq` (design.md, "Broker protocol": `tidal:cancel:{id}`). Bills the prompt
    /// and this segment's completion tokens up to that seq (the tokens made after it never
    /// reached the client), ends the stream with `cancelled` and acks, at once. The bill
    /// goes out first: it depends only on the stream and the flag, so a worker that takes
    /// the job over after a crash here bills the same counts under the same key, and billing
    /// keeps one.
    async fn cancelled(&mut self, delivered_seq: u64) -> Outcome {
        let completion = self.seg.delivered_through(delivered_seq);
        let usage = self.seg.usage(
            &self.runner(),
            self.prompt_tokens,
            0,
            completion,
            system_now_ms(),
            true,
        );
        if !io::publish_usage(self.shared, &usage).await {
            return Outcome::Abandoned;
        }
        let event = self
            .seg
            .error(499, "cancelled", None, "the request was cancelled");
        match io::append(self.shared, &self.claimed, &event).await {
            Appended::Written => self.seg.written(&event),
            Appended::Finished => {}
            Appended::Lost => return self.gone(),
            Appended::Failed => return Outcome::Abandoned,
        }
        match io::ack(self.shared, &self.claimed).await {
            Released::Ok => Outcome::Cancelled,
            Released::NotOwner => Outcome::Lost,
            Released::Failed => Outcome::Abandoned,
        }
    }

    async fn stop(&mut self, order: Control) -> Outcome {
        let delivered = self.seg.delivered_tokens();
        match order {
            Control::Run | Control::Lost => self.lost().await,
            Control::Cancel(delivered_seq) => self.cancelled(delivered_seq).await,
            Control::Drain => {
                let usage = self.seg.usage(
                    &self.runner(),
                    self.prompt_tokens,
                    0,
                    delivered,
                    system_now_ms(),
                    false,
                );
                if !io::publish_usage(self.shared, &usage).await {
                    return Outcome::Abandoned;
                }
                match io::requeue(self.shared, &self.claimed, self.seg.resume()).await {
                    Released::Ok => Outcome::Requeued,
                    Released::NotOwner => Outcome::Lost,
                    Released::Failed => Outcome::Abandoned,
                }
            }
        }
    }
}
