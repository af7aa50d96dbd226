//! `MemoryBroker`: the in-process broker of `tidal up` and unit tests. It mirrors the Redis
//! protocol (streams with a consumer group, pending entries, takeover after a claim timeout
//! or a stale heartbeat, start gates, seq- and owner-fenced response streams, expiries)
//! under one mutex, with time from an injected [`Clock`].

mod stream;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::broker::{duplicate_request, is_stale, Broker, BrokerConfig};
use crate::clock::{Clock, SystemClock};
use crate::error::{QueueError, Result};
use crate::metrics::{self as m, count};
use crate::pool::{check_assignment, check_name, is_pool_stale, PoolHeartbeat};
use crate::types::{
    ClaimedJob, EntryId, Job, ModelRecord, QueueDepth, RequestRecord, ResponseEvent, Resume,
    Submitted, UsageDelivery, UsageEvent, Withdrawal, WorkerHeartbeat,
};
use stream::{GroupStream, StreamId};

/// Sweep expired gates, flags and response streams after this many enqueues.
const SWEEP_EVERY: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Started,
    Withdrawn,
}

#[derive(Debug)]
struct RespStream {
    events: Vec<ResponseEvent>,
    expires_at_ms: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Jobs streams by (model, resumed): re-enqueued jobs are claimed first.
    jobs: HashMap<(String, bool), GroupStream<Job>>,
    gates: HashMap<Uuid, (Gate, u64)>,
    /// Cancel flags: delivered seq and expiry.
    cancels: HashMap<Uuid, (u64, u64)>,
    responses: HashMap<Uuid, RespStream>,
    /// Request records with their expiry.
    requests: HashMap<Uuid, (RequestRecord, u64)>,
    /// (tenant, idempotency key) → first request id, with expiry.
    idempotency: HashMap<(String, String), (Uuid, u64)>,
    usage: GroupStream<UsageEvent>,
    workers: HashMap<String, BTreeMap<String, WorkerHeartbeat>>,
    models: BTreeMap<String, ModelRecord>,
    /// Pool heartbeats by pool, then worker.
    pool_workers: HashMap<String, BTreeMap<String, PoolHeartbeat>>,
    /// Pool assignments by pool, then worker.
    pool_assign: HashMap<String, BTreeMap<String, Vec<String>>>,
    enqueues: u64,
    /// Prompt tokens enqueued per model (estimated).
    prompt_tokens: HashMap<String, u64>,
}

impl State {
    fn gate(&self, id: Uuid, now: u64) -> Option<Gate> {
        self.gates
            .get(&id)
            .filter(|(_, exp)| *exp > now)
            .map(|(g, _)| *g)
    }

    /// The delivered seq of a cancelled request.
    fn cancelled(&self, id: Uuid, now: u64) -> Option<u64> {
        self.cancels
            .get(&id)
            .filter(|(_, exp)| *exp > now)
            .map(|(seq, _)| *seq)
    }

    fn responses(&mut self, id: Uuid, now: u64) -> Option<&mut RespStream> {
        if self
            .responses
            .get(&id)
            .is_some_and(|r| r.expires_at_ms <= now)
        {
            self.responses.remove(&id);
        }
        self.responses.get_mut(&id)
    }

    fn sweep(&mut self, now: u64) {
        self.gates.retain(|_, (_, exp)| *exp > now);
        self.cancels.retain(|_, (_, exp)| *exp > now);
        self.responses.retain(|_, r| r.expires_at_ms > now);
        self.requests.retain(|_, (_, exp)| *exp > now);
        self.idempotency.retain(|_, (_, exp)| *exp > now);
    }

    fn request(&self, id: Uuid, now: u64) -> Option<RequestRecord> {
        self.requests
            .get(&id)
            .filter(|(_, exp)| *exp > now)
            .map(|(r, _)| r.clone())
    }

    /// Adds `job` to its model's fresh or resumed stream and counts the tokens its worker
    /// will prefill (enqueues and requeues alike).
    fn add_job(&mut self, job: &Job, now: u64) -> StreamId {
        self.enqueues += 1;
        self.count_prompt_tokens(&job.model, job.prompt_tokens_estimate());
        if self.enqueues.is_multiple_of(SWEEP_EVERY) {
            self.sweep(now);
        }
        self.jobs
            .entry((job.model.clone(), job.resume.is_some()))
            .or_default()
            .add(now, job.clone())
    }

    /// Adds to the model's `arrived_prompt_tokens`, the autoscaler's prefill demand.
    fn count_prompt_tokens(&mut self, model: &str, tokens: u64) {
        *self.prompt_tokens.entry(model.to_owned()).or_default() += tokens;
    }

    /// The start gate (module docs of [`crate::broker`]): whether the delivered entry may
    /// run; a dropped entry is acked and deleted.
    fn pass_gate(&mut self, model: &str, id: StreamId, job: &Job, now: u64, ttl: u64) -> bool {
        let pass = match self.gate(job.id, now) {
            Some(Gate::Withdrawn) => false,
            Some(Gate::Started) => true,
            None => {
                let expired = job.deadline_ms > 0 && now > job.deadline_ms;
                !(expired || self.cancelled(job.id, now).is_some())
            }
        };
        let gate = if pass { Gate::Started } else { Gate::Withdrawn };
        self.gates.insert(job.id, (gate, now + ttl));
        if !pass {
            if let Some(s) = self.jobs.get_mut(&(model.to_owned(), job.resume.is_some())) {
                s.ack(id);
                s.delete(id);
            }
            count(m::WITHDRAWN, model, 1);
        }
        pass
    }

    /// Passes entries `consumer` took over through the start gate and counts their
    /// re-prefill (new prefill demand for the autoscaler); returns those that may run.
    fn took_over(
        &mut self,
        model: &str,
        consumer: &str,
        taken: Vec<(StreamId, Job, u32)>,
        now: u64,
        ttl: u64,
    ) -> Vec<ClaimedJob> {
        let mut out = Vec::new();
        for (id, job, attempt) in taken {
            if self.pass_gate(model, id, &job, now, ttl) {
                out.push(ClaimedJob {
                    job,
                    entry_id: id.to_string(),
                    consumer: consumer.to_owned(),
                    attempt,
                });
            }
        }
        let re_prefill: u64 = out.iter().map(|j| j.job.prompt_tokens_estimate()).sum();
        self.count_prompt_tokens(model, re_prefill);
        count(m::TAKEN_OVER, model, out.len() as u64);
        out
    }

    /// Checks that `job`'s entry is pending for its consumer; returns its stream and id.
    fn owned(&mut self, job: &ClaimedJob) -> Result<(&mut GroupStream<Job>, StreamId)> {
        let not_owner = || QueueError::NotOwner {
            model: job.job.model.clone(),
            entry: job.entry_id.clone(),
            consumer: job.consumer.clone(),
        };
        let id = StreamId::parse(&job.entry_id).ok_or_else(not_owner)?;
        let key = (job.job.model.clone(), job.job.resume.is_some());
        let s = self.jobs.get_mut(&key).ok_or_else(not_owner)?;
        match s.pending(id) {
            Some(p) if p.consumer == job.consumer => Ok((s, id)),
            _ => Err(not_owner()),
        }
    }
}

/// The in-process broker.
#[derive(Debug)]
pub struct MemoryBroker {
    config: BrokerConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    changed: Notify,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        MemoryBroker::new(BrokerConfig::default(), Arc::new(SystemClock))
    }
}

impl MemoryBroker {
    /// A broker with `config`, reading time from `clock`.
    pub fn new(config: BrokerConfig, clock: Arc<dyn Clock>) -> Self {
        MemoryBroker {
            config,
            clock,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way later
        // calls trip over (each operation's writes are independent), so keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn ttl_ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }

    /// Appends a response event (module docs of [`crate::broker`]: fencing, and with
    /// `held` ownership).
    fn append(&self, id: Uuid, event: &ResponseEvent, held: Option<&ClaimedJob>) -> Result<()> {
        let now = self.now();
        let expires_at_ms = now + Self::ttl_ms(self.config.response_ttl);
        {
            let mut st = self.lock();
            if let Some(job) = held {
                st.owned(job)?;
            }
            let last = match st.responses(id, now) {
                Some(r) => r.events.last().cloned(),
                None => None,
            };
            let last_seq = last.as_ref().map_or(0, ResponseEvent::seq);
            if last.as_ref().is_some_and(ResponseEvent::is_terminal) {
                return Err(QueueError::ResponseFinished { id });
            }
            if event.seq() != last_seq + 1 {
                return Err(QueueError::SeqConflict {
                    id,
                    seq: event.seq(),
                    last: last_seq,
                });
            }
            let r = st.responses.entry(id).or_insert_with(|| RespStream {
                events: Vec::new(),
                expires_at_ms,
            });
            r.events.push(event.clone());
            r.expires_at_ms = expires_at_ms;
        }
        self.changed.notify_waiters();
        Ok(())
    }

    /// Runs `attempt` until it yields something non-empty or `block` elapses; woken by
    /// every state change (Redis's blocking XREAD, without a missed-wakeup window).
    async fn blocking<T>(
        &self,
        block: Duration,
        mut attempt: impl FnMut() -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let until = Instant::now() + block;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = attempt()?;
            if !got.is_empty() || Instant::now() >= until {
                return Ok(got);
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return attempt();
            }
        }
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn enqueue(&self, job: &Job) -> Result<EntryId> {
        let now = self.now();
        let id = self.lock().add_job(job, now);
        count(m::ENQUEUED, &job.model, 1);
        self.changed.notify_waiters();
        Ok(id.to_string())
    }

    async fn claim(
        &self,
        model: &str,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<ClaimedJob>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let ttl = Self::ttl_ms(self.config.request_ttl);
        let got = self
            .blocking(block, || {
                let now = self.now();
                let mut st = self.lock();
                // Resumed jobs first, as vLLM puts preempted sequences back at the head of
                // its waiting queue.
                let mut delivered = Vec::new();
                for resumed in [true, false] {
                    if let Some(s) = st.jobs.get_mut(&(model.to_owned(), resumed)) {
                        delivered.extend(s.read_new(consumer, max - delivered.len(), now));
                    }
                }
                let mut out = Vec::new();
                for (id, job) in delivered {
                    if st.pass_gate(model, id, &job, now, ttl) {
                        out.push(ClaimedJob {
                            job,
                            entry_id: id.to_string(),
                            consumer: consumer.to_owned(),
                            attempt: 1,
                        });
                    }
                }
                Ok(out)
            })
            .await?;
        count(m::CLAIMED, model, got.len() as u64);
        Ok(got)
    }

    async fn take_over(
        &self,
        model: &str,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedJob>> {
        let now = self.now();
        let ttl = Self::ttl_ms(self.config.request_ttl);
        let mut st = self.lock();
        let mut taken = Vec::new();
        for resumed in [true, false] {
            if let Some(s) = st.jobs.get_mut(&(model.to_owned(), resumed)) {
                let room = max - taken.len();
                taken.extend(s.auto_claim(consumer, Self::ttl_ms(min_idle), room, now));
            }
        }
        Ok(st.took_over(model, consumer, taken, now, ttl))
    }

    async fn take_over_dead(
        &self,
        model: &str,
        consumer: &str,
        now_ms: u64,
        dead_after: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedJob>> {
        let now = self.now();
        let ttl = Self::ttl_ms(self.config.request_ttl);
        let mut st = self.lock();
        let dead: Vec<String> = st
            .workers
            .get(model)
            .into_iter()
            .flat_map(|w| w.values())
            .filter(|b| b.worker != consumer && is_stale(b, now_ms, dead_after))
            .map(|b| b.worker.clone())
            .collect();
        let mut taken = Vec::new();
        if !dead.is_empty() {
            for resumed in [true, false] {
                if let Some(s) = st.jobs.get_mut(&(model.to_owned(), resumed)) {
                    let room = max - taken.len();
                    taken.extend(s.claim_from(&dead, consumer, room, now));
                }
            }
            // Dead workers that hold nothing any more are forgotten (as Redis's broker does).
            let idle: Vec<&String> = dead
                .iter()
                .filter(|w| {
                    [true, false].iter().all(|resumed| {
                        st.jobs
                            .get(&(model.to_owned(), *resumed))
                            .is_none_or(|s| !s.holds_any(w))
                    })
                })
                .collect();
            if let Some(beats) = st.workers.get_mut(model) {
                for w in idle {
                    beats.remove(w);
                }
            }
        }
        Ok(st.took_over(model, consumer, taken, now, ttl))
    }

    async fn keep_alive(&self, jobs: &[ClaimedJob]) -> Result<Vec<bool>> {
        let now = self.now();
        let mut st = self.lock();
        Ok(jobs
            .iter()
            .map(|job| {
                let Some(id) = StreamId::parse(&job.entry_id) else {
                    return false;
                };
                let key = (job.job.model.clone(), job.job.resume.is_some());
                st.jobs
                    .get_mut(&key)
                    .is_some_and(|s| s.touch(id, &job.consumer, now))
            })
            .collect())
    }

    async fn holder(&self, job: &ClaimedJob) -> Result<Option<String>> {
        let Some(id) = StreamId::parse(&job.entry_id) else {
            return Ok(None);
        };
        let key = (job.job.model.clone(), job.job.resume.is_some());
        let st = self.lock();
        Ok(st
            .jobs
            .get(&key)
            .and_then(|s| s.pending(id))
            .map(|p| p.consumer.clone()))
    }

    async fn ack(&self, job: &ClaimedJob) -> Result<()> {
        let now = self.now();
        {
            let mut st = self.lock();
            let (s, id) = st.owned(job)?;
            s.ack(id);
            s.delete(id);
            // Finished: the gate only has to outlive late withdraws now.
            let exp = now + Self::ttl_ms(self.config.response_ttl);
            if let Some(g) = st.gates.get_mut(&job.job.id) {
                g.1 = g.1.min(exp);
            }
        }
        count(m::ACKED, &job.job.model, 1);
        Ok(())
    }

    async fn mark_decoding(&self, job: &ClaimedJob) -> Result<()> {
        let mut st = self.lock();
        let (s, id) = st.owned(job)?;
        s.mark_decoding(id);
        Ok(())
    }

    async fn requeue(&self, job: &ClaimedJob, mut resume: Resume) -> Result<EntryId> {
        resume.segments = job.segment() + 1;
        let now = self.now();
        let id = {
            let mut st = self.lock();
            let (s, old) = st.owned(job)?;
            s.ack(old);
            s.delete(old);
            let mut next = job.job.clone();
            next.resume = Some(resume);
            // to the resumed stream (it has a resume record), counted like any enqueue
            st.add_job(&next, now)
        };
        count(m::REENQUEUED, &job.job.model, 1);
        self.changed.notify_waiters();
        Ok(id.to_string())
    }

    async fn withdraw(&self, model: &str, id: Uuid, entry: &EntryId) -> Result<Withdrawal> {
        let now = self.now();
        let ttl = Self::ttl_ms(self.config.request_ttl);
        let mut st = self.lock();
        if st.gate(id, now) == Some(Gate::Started) {
            return Ok(Withdrawal::AlreadyStarted);
        }
        let first = st.gate(id, now).is_none();
        st.gates.insert(id, (Gate::Withdrawn, now + ttl));
        let fresh = st.jobs.get_mut(&(model.to_owned(), false));
        if let (Some(s), Some(eid)) = (fresh, StreamId::parse(entry)) {
            s.ack(eid);
            s.delete(eid);
        }
        if first {
            count(m::WITHDRAWN, model, 1);
        }
        Ok(Withdrawal::Withdrawn)
    }

    async fn depth(&self, model: &str) -> Result<QueueDepth> {
        let now = self.now();
        let st = self.lock();
        let mut total = QueueDepth {
            arrived_prompt_tokens: st.prompt_tokens.get(model).copied().unwrap_or(0),
            ..QueueDepth::default()
        };
        for resumed in [false, true] {
            if let Some(s) = st.jobs.get(&(model.to_owned(), resumed)) {
                let (backlog, oldest) = s.backlog();
                total.backlog += backlog;
                total.in_flight += s.pending_len();
                total.decoding += s.decoding_len();
                let wait = oldest.map(|id| now.saturating_sub(id.ms));
                total.oldest_wait_ms = total.oldest_wait_ms.max(wait);
            }
        }
        Ok(total)
    }

    async fn purge_model(&self, model: &str) -> Result<()> {
        let mut st = self.lock();
        st.jobs.remove(&(model.to_owned(), false));
        st.jobs.remove(&(model.to_owned(), true));
        st.workers.remove(model);
        st.prompt_tokens.remove(model);
        Ok(())
    }

    async fn append_response(&self, id: Uuid, event: &ResponseEvent) -> Result<()> {
        self.append(id, event, None)
    }

    async fn append_held(&self, job: &ClaimedJob, event: &ResponseEvent) -> Result<()> {
        self.append(job.job.id, event, Some(job))
    }

    async fn read_responses(
        &self,
        id: Uuid,
        after_seq: u64,
        max: usize,
        block: Duration,
    ) -> Result<Vec<ResponseEvent>> {
        self.blocking(block, || {
            let now = self.now();
            let mut st = self.lock();
            Ok(match st.responses(id, now) {
                Some(r) => r
                    .events
                    .iter()
                    .filter(|e| e.seq() > after_seq)
                    .take(max.max(1))
                    .cloned()
                    .collect(),
                None => Vec::new(),
            })
        })
        .await
    }

    async fn delete_responses(&self, id: Uuid) -> Result<()> {
        self.lock().responses.remove(&id);
        Ok(())
    }

    async fn submit(&self, job: &Job, record: &RequestRecord) -> Result<Submitted> {
        let now = self.now();
        let exp = now + Self::ttl_ms(self.config.request_ttl);
        let entry = {
            let mut st = self.lock();
            let idem = record
                .idempotency
                .as_ref()
                .map(|i| (job.tenant.clone(), i.key.clone()));
            if let Some(&(first, _)) = idem
                .as_ref()
                .and_then(|k| st.idempotency.get(k))
                .filter(|(_, e)| *e > now)
            {
                return Ok(Submitted::Duplicate {
                    id: first,
                    record: st.request(first, now),
                });
            }
            if st.request(record.id, now).is_some() {
                return Err(duplicate_request(record.id));
            }
            let entry = st.add_job(job, now).to_string();
            let mut kept = record.clone();
            kept.entry_id = entry.clone();
            st.requests.insert(record.id, (kept, exp));
            if let Some(k) = idem {
                st.idempotency.insert(k, (record.id, exp));
            }
            entry
        };
        count(m::ENQUEUED, &job.model, 1);
        self.changed.notify_waiters();
        Ok(Submitted::Enqueued(entry))
    }

    async fn release_idempotency_key(&self, tenant: &str, key: &str, id: Uuid) -> Result<()> {
        let now = self.now();
        let mut st = self.lock();
        let k = (tenant.to_owned(), key.to_owned());
        let recorded = st.request(id, now).is_some();
        if recorded
            && st
                .idempotency
                .get(&k)
                .is_some_and(|(first, _)| *first == id)
        {
            st.idempotency.remove(&k);
        }
        Ok(())
    }

    async fn request(&self, id: Uuid) -> Result<Option<RequestRecord>> {
        Ok(self.lock().request(id, self.now()))
    }

    fn request_ttl(&self) -> Duration {
        self.config.request_ttl
    }

    async fn forget_request(&self, id: Uuid) -> Result<bool> {
        let now = self.now();
        let mut st = self.lock();
        st.responses.remove(&id);
        Ok(st.requests.remove(&id).is_some_and(|(_, exp)| exp > now))
    }

    async fn cancel(&self, id: Uuid, delivered_seq: u64) -> Result<()> {
        let now = self.now();
        let exp = now + Self::ttl_ms(self.config.request_ttl);
        let mut st = self.lock();
        let seq = st
            .cancelled(id, now)
            .map_or(delivered_seq, |s| s.max(delivered_seq));
        st.cancels.insert(id, (seq, exp));
        st.requests.remove(&id);
        Ok(())
    }

    async fn is_cancelled(&self, id: Uuid) -> Result<bool> {
        let now = self.now();
        Ok(self.lock().cancelled(id, now).is_some())
    }

    async fn cancelled(&self, ids: &[Uuid]) -> Result<Vec<Option<u64>>> {
        let now = self.now();
        let st = self.lock();
        Ok(ids.iter().map(|id| st.cancelled(*id, now)).collect())
    }

    async fn publish_usage(&self, event: &UsageEvent) -> Result<EntryId> {
        let now = self.now();
        let id = self.lock().usage.add(now, event.clone());
        self.changed.notify_waiters();
        Ok(id.to_string())
    }

    async fn read_usage(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<UsageDelivery>> {
        let wrap = |v: Vec<(StreamId, UsageEvent)>| {
            v.into_iter()
                .map(|(id, event)| UsageDelivery {
                    entry_id: id.to_string(),
                    event,
                })
                .collect::<Vec<_>>()
        };
        let own = self.lock().usage.own_pending(consumer, max);
        if !own.is_empty() {
            return Ok(wrap(own));
        }
        self.blocking(block, || {
            let now = self.now();
            Ok(wrap(self.lock().usage.read_new(consumer, max, now)))
        })
        .await
    }

    async fn take_over_usage(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<UsageDelivery>> {
        let now = self.now();
        let taken = self
            .lock()
            .usage
            .auto_claim(consumer, Self::ttl_ms(min_idle), max, now);
        Ok(taken
            .into_iter()
            .map(|(id, event, _)| UsageDelivery {
                entry_id: id.to_string(),
                event,
            })
            .collect())
    }

    async fn ack_usage(&self, entries: &[EntryId]) -> Result<()> {
        let mut st = self.lock();
        for e in entries {
            if let Some(id) = StreamId::parse(e) {
                st.usage.ack(id);
                st.usage.delete(id);
            }
        }
        Ok(())
    }

    async fn heartbeat(&self, beat: &WorkerHeartbeat) -> Result<()> {
        self.lock()
            .workers
            .entry(beat.model.clone())
            .or_default()
            .insert(beat.worker.clone(), beat.clone());
        Ok(())
    }

    async fn workers(&self, model: &str) -> Result<Vec<WorkerHeartbeat>> {
        Ok(self
            .lock()
            .workers
            .get(model)
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn expire_workers(
        &self,
        model: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>> {
        let mut st = self.lock();
        let Some(w) = st.workers.get_mut(model) else {
            return Ok(Vec::new());
        };
        let stale: Vec<String> = w
            .values()
            .filter(|b| is_stale(b, now_ms, max_age))
            .map(|b| b.worker.clone())
            .collect();
        for name in &stale {
            w.remove(name);
        }
        Ok(stale)
    }

    async fn pool_heartbeat(&self, beat: &PoolHeartbeat) -> Result<()> {
        check_name("pool", &beat.pool)?;
        check_name("worker", &beat.worker)?;
        self.lock()
            .pool_workers
            .entry(beat.pool.clone())
            .or_default()
            .insert(beat.worker.clone(), beat.clone());
        Ok(())
    }

    async fn pool_workers(&self, pool: &str) -> Result<Vec<PoolHeartbeat>> {
        Ok(self
            .lock()
            .pool_workers
            .get(pool)
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn expire_pool_workers(
        &self,
        pool: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>> {
        let mut st = self.lock();
        let Some(w) = st.pool_workers.get_mut(pool) else {
            return Ok(Vec::new());
        };
        let stale: Vec<String> = w
            .values()
            .filter(|b| is_pool_stale(b, now_ms, max_age))
            .map(|b| b.worker.clone())
            .collect();
        for name in &stale {
            w.remove(name);
        }
        if let Some(a) = st.pool_assign.get_mut(pool) {
            for name in &stale {
                a.remove(name);
            }
        }
        Ok(stale)
    }

    async fn set_pool_assignment(&self, pool: &str, worker: &str, models: &[String]) -> Result<()> {
        check_name("pool", pool)?;
        check_name("worker", worker)?;
        check_assignment(models)?;
        self.lock()
            .pool_assign
            .entry(pool.to_owned())
            .or_default()
            .insert(worker.to_owned(), models.to_vec());
        Ok(())
    }

    async fn pool_assignment(&self, pool: &str, worker: &str) -> Result<Option<Vec<String>>> {
        Ok(self
            .lock()
            .pool_assign
            .get(pool)
            .and_then(|a| a.get(worker))
            .cloned())
    }

    async fn pool_assignments(&self, pool: &str) -> Result<BTreeMap<String, Vec<String>>> {
        Ok(self
            .lock()
            .pool_assign
            .get(pool)
            .cloned()
            .unwrap_or_default())
    }

    async fn put_model(&self, record: &ModelRecord) -> Result<()> {
        self.lock().models.insert(record.id.clone(), record.clone());
        Ok(())
    }

    async fn model(&self, id: &str) -> Result<Option<ModelRecord>> {
        Ok(self.lock().models.get(id).cloned())
    }

    async fn models(&self) -> Result<Vec<ModelRecord>> {
        Ok(self.lock().models.values().cloned().collect())
    }

    async fn remove_model(&self, id: &str) -> Result<bool> {
        Ok(self.lock().models.remove(id).is_some())
    }
}
