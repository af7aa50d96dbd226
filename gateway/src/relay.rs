//! One enqueued request as the gateway follows it: reads its response stream in order,
//! enforces the model's max queue wait, and cleans up however the request ends.
//!
//! Lifecycle (design.md, "Broker protocol"): `Queued` until the first response event (or
//! until a withdraw at the deadline learns the job already started), then `Started`, then
//! `Finished` after the terminal event was delivered, or after the request was withdrawn or
//! given up. Dropping a [`Tracked`] that is not `Finished` (client disconnected: hyper drops
//! the handler future or the SSE body) withdraws the job if it has not started, else sets
//! its cancel flag to the seq of the last event handed to the client, which is what its
//! worker bills up to (the response stream stays for that worker; it expires); either way
//! its record goes and its idempotency key (if any) is freed, so a retry runs afresh. When
//! the gateway is stopping
//! ([`crate::Gateway::detach_in_flight`]) nothing is cancelled: the client may reattach.
//!
//! A request the queue lost (its data gone, e.g. Redis restarted without persistence) would
//! never send another event: while its stream is silent the gateway looks for its record
//! now and then, and answers `request_lost` when it is gone and nobody cancelled it
//! ([`Tracked::vanished`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tidal_protocol::ApiError;
use tidal_queue::{EntryId, RequestRecord, ResponseEvent, Withdrawal};
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Reject;
use crate::gateway::Shared;
use crate::hold::{self, HoldTerms};
use crate::metrics;

/// Events read per broker call.
const READ_BATCH: usize = 256;

/// Silence after which (and between checks) a silent request's record is looked for: one
/// broker call per silent read at most, and a lost request is told within seconds.
const LOST_CHECK_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Started,
    Finished,
}

/// A request in the queue or running, followed through its response stream.
pub(crate) struct Tracked {
    shared: Arc<Shared>,
    pub id: Uuid,
    pub tenant: String,
    pub model: String,
    entry: EntryId,
    /// ms since the epoch; 0: no deadline.
    deadline_ms: u64,
    phase: Phase,
    last_seq: u64,
    buf: VecDeque<ResponseEvent>,
    /// The idempotency key it was sent with: released when it ends without an answer.
    idempotency_key: Option<String>,
    /// When we began waiting (for the queue-wait metric).
    since: Instant,
    last_event: Instant,
    /// When its record was last looked for ([`Tracked::vanished`]).
    last_check: Instant,
    /// When it was accepted (ms since the epoch, the record's `created_at_ms`).
    created_at_ms: u64,
    /// Its budget hold's terms, while it has a hold to settle.
    hold: Option<HoldTerms>,
    /// Completion tokens handed to the client so far.
    delivered_tokens: u64,
    /// Where reading began: the client had the events up to this seq before.
    start_seq: u64,
    /// The answer is one body sent at the end ([`Tracked::answer_whole`]), so events read
    /// are not handed to the client as they come.
    whole_body: bool,
}

impl Tracked {
    /// Follows the request of `record` (its job at `record.entry_id`), from after
    /// `after_seq`.
    pub fn new(shared: Arc<Shared>, record: &RequestRecord, after_seq: u64) -> Self {
        metrics::in_flight(1.0);
        let now = Instant::now();
        Tracked {
            shared,
            id: record.id,
            tenant: record.tenant.clone(),
            model: record.model.clone(),
            entry: record.entry_id.clone(),
            deadline_ms: record.deadline_ms,
            phase: Phase::Queued,
            last_seq: after_seq,
            buf: VecDeque::new(),
            idempotency_key: record.idempotency.as_ref().map(|i| i.key.clone()),
            since: now,
            last_event: now,
            last_check: now,
            created_at_ms: record.created_at_ms,
            hold: None,
            delivered_tokens: 0,
            start_seq: after_seq,
            whole_body: false,
        }
    }

    /// The answer is one body written after the last event: until then the client is handed
    /// nothing, so a client gone before it is billed no completion token.
    pub fn answer_whole(&mut self) {
        self.whole_body = true;
    }

    /// The seq of the last response event handed to the client's connection: what a cancel
    /// bills up to ([`tidal_queue::Broker::cancel`]).
    fn handed_seq(&self) -> u64 {
        if self.whole_body {
            self.start_seq
        } else {
            self.last_seq
        }
    }

    /// This request holds budget on `hold`'s terms: settled when it ends.
    pub fn holding(mut self, hold: Option<HoldTerms>) -> Self {
        self.hold = hold;
        self
    }

    /// Settles the budget hold (once) at `cost_pico`, what the request may still bill;
    /// `stopped` as in [`hold::settle`].
    fn settle(&mut self, stopped: bool, cost_pico: impl FnOnce(&HoldTerms) -> i128) {
        if let Some(terms) = self.hold.take() {
            hold::settle(&self.shared, self.id, cost_pico(&terms), stopped);
        }
    }

    /// Completion tokens the client was handed: what a stopped request's worker bills.
    fn handed_tokens(&self) -> u64 {
        if self.whole_body {
            0
        } else {
            self.delivered_tokens
        }
    }

    /// Settles the hold of a request that ends with `ev`: exactly on `done`, nothing for a
    /// refusal before any token, else at most what was delivered.
    fn settle_terminal(&mut self, ev: &ResponseEvent) {
        let delivered = self.delivered_tokens;
        match ev {
            ResponseEvent::Done { usage, .. } => self.settle(false, |t| t.final_pico(usage)),
            ResponseEvent::Error { status, .. } if delivered == 0 && *status < 500 => {
                self.settle(false, |_| 0)
            }
            _ => self.settle(true, |t| t.stopped_pico(delivered)),
        }
    }

    /// The gateway state this request belongs to.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The next response event in order. A terminal event (`done`/`error`) finishes the
    /// request: its stream and record are removed in the background.
    ///
    /// Errors: 503 + Retry-After when the max queue wait passed and the job was withdrawn;
    /// 504 when a started request went silent for `idle_timeout`; 503 when the broker kept
    /// failing for `broker_retry`; 503 `request_lost` + Retry-After when the queue lost the
    /// request ([`Tracked::vanished`]). Each of these also finishes the request.
    pub async fn next(&mut self) -> Result<ResponseEvent, Reject> {
        let mut failing_since: Option<Instant> = None;
        loop {
            if let Some(ev) = self.buf.pop_front() {
                self.last_seq = ev.seq();
                if let ResponseEvent::Delta { token_ids, .. } = &ev {
                    self.delivered_tokens += token_ids.len() as u64;
                }
                if ev.is_terminal() {
                    self.settle_terminal(&ev);
                    self.finish();
                }
                return Ok(ev);
            }
            if self.phase == Phase::Finished {
                return Err(ApiError::internal("the response stream already ended").into());
            }
            let cfg = &self.shared.config;
            let now_ms = self.shared.now_ms();
            if self.phase == Phase::Queued && self.deadline_ms > 0 && now_ms >= self.deadline_ms {
                match self
                    .shared
                    .broker
                    .withdraw(&self.model, self.id, &self.entry)
                    .await
                {
                    Ok(Withdrawal::Withdrawn) => {
                        metrics::queue_wait(&self.model, self.since.elapsed());
                        metrics::withdrawn(&self.model);
                        tracing::info!(model = %self.model, "max queue wait passed; job withdrawn");
                        self.settle(false, |_| 0);
                        // Ended without an answer: a retry with its key runs afresh.
                        self.end(true);
                        return Err(Reject::retry(
                            ApiError::unavailable(format!(
                                "No worker of model `{}` started this request within its maximum queue wait; it was withdrawn and will not run. Retry later.",
                                self.model
                            )),
                            1,
                        ));
                    }
                    Ok(Withdrawal::AlreadyStarted) => {
                        self.mark_started();
                        continue;
                    }
                    Err(e) => {
                        self.broker_failed(&mut failing_since, e).await?;
                        continue;
                    }
                }
            }
            let mut block = cfg.read_block;
            if self.phase == Phase::Queued && self.deadline_ms > 0 {
                let left = Duration::from_millis(self.deadline_ms.saturating_sub(now_ms));
                block = block.min(left).max(Duration::from_millis(1));
            }
            match self
                .shared
                .broker
                .read_responses(self.id, self.last_seq, READ_BATCH, block)
                .await
            {
                Ok(events) => {
                    failing_since = None;
                    let fresh: Vec<_> = events
                        .into_iter()
                        .filter(|e| e.seq() > self.last_seq)
                        .collect();
                    if !fresh.is_empty() {
                        if self.phase == Phase::Queued {
                            metrics::queue_wait(&self.model, self.since.elapsed());
                            self.mark_started();
                        }
                        self.last_event = Instant::now();
                        self.buf.extend(fresh);
                    } else if self.phase == Phase::Started
                        && self.last_event.elapsed() >= cfg.idle_timeout
                    {
                        tracing::warn!(model = %self.model, "started request went silent; cancelling");
                        self.abandon();
                        return Err(ApiError::new(
                            504,
                            Some("worker_timeout".into()),
                            None,
                            "The worker serving this request stopped responding.",
                        )
                        .into());
                    } else if self.due_for_check() && self.vanished().await {
                        tracing::warn!(model = %self.model, id = %self.id, "the queue lost the request");
                        let delivered = self.delivered_tokens;
                        self.settle(true, |t| t.stopped_pico(delivered));
                        // Nothing is left to withdraw or cancel; a retry with its key runs afresh.
                        self.end(true);
                        return Err(Reject::retry(
                            ApiError::new(
                                503,
                                Some("request_lost".into()),
                                None,
                                "The queue lost this request (its data was lost while the request was queued or running); it will not complete. It may be retried.",
                            ),
                            1,
                        ));
                    }
                }
                Err(e) => self.broker_failed(&mut failing_since, e).await?,
            }
        }
    }

    /// Whether a silent request's record is due to be looked for: `LOST_CHECK_AFTER` since
    /// the last event and the last check, and not while the record may have expired by
    /// itself or while a deadline withdraw (which forgets it) is due.
    fn due_for_check(&self) -> bool {
        let now_ms = self.shared.now_ms();
        let past_deadline =
            self.phase == Phase::Queued && self.deadline_ms > 0 && now_ms >= self.deadline_ms;
        let record_life = self.shared.broker.request_ttl().as_millis() as u64;
        let may_have_expired = now_ms.saturating_sub(self.created_at_ms) >= record_life;
        self.last_event.elapsed() >= LOST_CHECK_AFTER
            && self.last_check.elapsed() >= LOST_CHECK_AFTER
            && !past_deadline
            && !may_have_expired
    }

    /// Whether the request was lost by the queue: its record is gone although no terminal
    /// event came and nobody cancelled it. Every reader that forgets a record does so only
    /// after the terminal event is in the stream (or after withdrawing the job, or with a
    /// cancel flag for its worker), so in normal operation a followed request keeps its
    /// record until its end is readable. A broker error answers `false` (the read path
    /// deals with outages).
    async fn vanished(&mut self) -> bool {
        self.last_check = Instant::now();
        let broker = &self.shared.broker;
        match broker.request(self.id).await {
            Ok(Some(_)) => false,
            Ok(None) => match broker.is_cancelled(self.id).await {
                Ok(cancelled) => {
                    if cancelled {
                        tracing::debug!(id = %self.id, "record gone but the request was cancelled; its worker ends it");
                    }
                    !cancelled
                }
                Err(e) => {
                    tracing::debug!(error = %e, id = %self.id, "reading a cancel flag failed");
                    false
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, id = %self.id, "reading a request record failed");
                false
            }
        }
    }

    /// [`Tracked::next`], or `None` when the gateway starts stopping first: the request is
    /// then left running for its client to reattach to (nothing is cancelled while stopping).
    pub async fn next_unless_detached(&mut self) -> Result<Option<ResponseEvent>, Reject> {
        let shared = self.shared.clone();
        tokio::select! {
            biased;
            ev = self.next() => ev.map(Some),
            () = shared.detaching() => Ok(None),
        }
    }

    fn mark_started(&mut self) {
        if self.phase == Phase::Queued {
            self.phase = Phase::Started;
            self.last_event = Instant::now();
        }
    }

    /// Retries a failing broker with a short pause, up to `broker_retry`; then gives up.
    async fn broker_failed(
        &mut self,
        since: &mut Option<Instant>,
        e: tidal_queue::QueueError,
    ) -> Result<(), Reject> {
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() >= self.shared.config.broker_retry {
            tracing::error!(error = %e, "broker unavailable; giving up on the request");
            self.abandon();
            return Err(Reject::from(e));
        }
        tracing::warn!(error = %e, "broker read failed; retrying");
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    /// The request ended with its answer delivered: forget its response stream and record
    /// in the background (one broker call; both also expire). Its idempotency key stays, so
    /// a late retry is refused rather than run again.
    pub fn finish(&mut self) {
        self.end(false);
    }

    /// Ends the request: in the background, frees its idempotency key when `release_key`
    /// (it ended without an answer), then forgets it.
    fn end(&mut self, release_key: bool) {
        if self.phase == Phase::Finished {
            return;
        }
        self.phase = Phase::Finished;
        metrics::in_flight(-1.0);
        let key = release_key.then(|| self.key_to_release()).flatten();
        let (shared, id) = (self.shared.clone(), self.id);
        tokio::spawn(async move {
            release(&shared, id, key).await;
            forget(&shared, id).await;
        });
    }

    /// (tenant, key) of the request's idempotency key, if it was sent with one.
    fn key_to_release(&self) -> Option<(String, String)> {
        let key = self.idempotency_key.clone()?;
        Some((self.tenant.clone(), key))
    }

    /// Stops the request (client gone, or given up): free its idempotency key, then withdraw
    /// and forget it if it has not started, else cancel it with the last seq handed to the
    /// client, so its worker bills exactly the tokens delivered.
    fn abandon(&mut self) {
        if self.phase == Phase::Finished {
            return;
        }
        let queued = self.phase == Phase::Queued;
        self.phase = Phase::Finished;
        metrics::in_flight(-1.0);
        let key = self.key_to_release();
        // Settled after the withdraw tells whether it ever ran.
        let handed_tokens = self.handed_tokens();
        let stopped = self.hold.take().map(|t| t.stopped_pico(handed_tokens));
        let handed = self.handed_seq();
        let shared = self.shared.clone();
        let (id, model, entry) = (self.id, self.model.clone(), self.entry.clone());
        tokio::spawn(async move {
            // Before the record goes: the broker frees a key only while its request's record
            // is kept (one answered through another reader keeps its key).
            release(&shared, id, key).await;
            let started = if queued {
                match shared.broker.withdraw(&model, id, &entry).await {
                    Ok(Withdrawal::Withdrawn) => {
                        metrics::withdrawn(&model);
                        false
                    }
                    Ok(Withdrawal::AlreadyStarted) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, %id, "withdrawing an abandoned job failed; cancelling");
                        true
                    }
                }
            } else {
                true
            };
            if let Some(stopped) = stopped {
                if started {
                    hold::settle(&shared, id, stopped, true);
                } else {
                    hold::settle(&shared, id, 0, false);
                }
            }
            if started {
                // Forgets the record but keeps the response stream: the worker ends it and
                // bills from it the tokens up to `handed`, the last seq the client was handed.
                // Retried like `forget`: a cancel that never lands bills the whole answer.
                if retrying(&shared, id, "cancelling a stopped request", || {
                    shared.broker.cancel(id, handed)
                })
                .await
                {
                    metrics::cancelled(&model);
                }
            } else {
                forget(&shared, id).await;
            }
            tracing::info!(%id, started, "client gone; job stopped");
        });
    }
}

/// Forgets request `id` (its record and response stream), retrying through a broker outage:
/// a request left recorded could be read again (reattached) by its tenant until the record
/// expires.
async fn forget(shared: &Shared, id: Uuid) {
    retrying(shared, id, "forgetting a request", || {
        shared.broker.forget_request(id)
    })
    .await;
}

/// Runs broker call `op` (`what`, about request `id`) until it succeeds, backing off from
/// 100 ms to 2 s, for up to `broker_retry`; false when it never did (then its keys expire).
async fn retrying<T, F, Fut>(shared: &Shared, id: Uuid, what: &str, op: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = tidal_queue::Result<T>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match op().await {
            Ok(_) => return true,
            Err(e) if started.elapsed() >= shared.config.broker_retry => {
                tracing::warn!(error = %e, %id, "{what} failed; giving up, its keys expire");
                return false;
            }
            Err(e) => {
                tracing::debug!(error = %e, %id, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Frees `key` (tenant, idempotency key) if it still names request `id` and that request
/// is still recorded.
async fn release(shared: &Shared, id: Uuid, key: Option<(String, String)>) {
    let Some((tenant, key)) = key else {
        return;
    };
    if let Err(e) = shared
        .broker
        .release_idempotency_key(&tenant, &key, id)
        .await
    {
        tracing::warn!(error = %e, %id, "releasing an idempotency key failed (it expires)");
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.phase == Phase::Finished {
            return;
        }
        if self.shared.is_detached() {
            metrics::in_flight(-1.0);
            tracing::info!(id = %self.id, "gateway stopping; request left running for reattachment");
            return;
        }
        // Drop runs inside the runtime (hyper drops futures and bodies on its tasks); the
        // cleanup is spawned, as nothing can be awaited here.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.abandon();
        }
    }
}
