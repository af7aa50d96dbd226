//! `RedisBroker`: the production broker on Redis Streams with consumer groups
//! (XADD / XREADGROUP / XACK / XAUTOCLAIM / XPENDING). Multi-key steps run as Lua scripts so
//! they are atomic (see `scripts.rs`); blocking reads use dedicated connections (`pool.rs`).
//! Keys and consumer groups follow design.md, "Broker protocol"; all keys of one request or
//! one model are separate, so this targets a single Redis server (not Redis Cluster).

mod codec;
mod pool;
mod scripts;

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, Value};
use uuid::Uuid;

use crate::broker::{duplicate_request, is_stale, Broker, BrokerConfig};
use crate::error::{QueueError, Result};
use crate::keys::{Keys, BILLING_GROUP, WORKERS_GROUP};
use crate::metrics::{self as m, count};
use crate::pool::{check_assignment, check_name, is_pool_stale, PoolHeartbeat};
use crate::types::{
    ClaimedJob, EntryId, Job, ModelRecord, QueueDepth, RequestRecord, ResponseEvent, Resume,
    Submitted, UsageDelivery, UsageEvent, Withdrawal, WorkerHeartbeat,
};
use codec::{
    autoclaim_reply, entries, int, items, job_fields, job_from_entry, json_field, malformed,
    read_reply, string, Entry,
};
use pool::BlockingPool;
use scripts::Scripts;

/// Extra time a blocking read may take beyond its BLOCK argument before it is abandoned.
const BLOCK_SLACK: Duration = Duration::from_secs(5);
/// XAUTOCLAIM passes per takeover call (each scans at most 10 × COUNT pending entries).
const MAX_AUTOCLAIM_PASSES: usize = 64;

/// The Redis Streams broker.
#[derive(Debug)]
pub struct RedisBroker {
    keys: Keys,
    config: BrokerConfig,
    conn: ConnectionManager,
    blocking: BlockingPool,
    scripts: Scripts,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn is_code(e: &redis::RedisError, code: &str) -> bool {
    e.code() == Some(code)
}

impl RedisBroker {
    /// Connects to `url` (`redis://host:port/db`). The connection reconnects by itself after
    /// a server restart; the operation that saw the failure returns an error.
    pub async fn connect(url: &str, config: BrokerConfig) -> Result<Self> {
        let client = Client::open(url)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_number_of_retries(3);
        let conn = client
            .get_connection_manager_with_config(manager_config)
            .await?;
        Ok(RedisBroker {
            keys: Keys::new(config.prefix.clone()),
            config,
            conn,
            blocking: BlockingPool::new(client),
            scripts: Scripts::new(),
        })
    }

    /// The key names this broker uses.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut c = self.conn.clone();
        Ok(cmd.query_async(&mut c).await?)
    }

    /// Creates `group` on `key` from the start of the stream (so nothing enqueued before is
    /// missed), creating the stream if needed; an existing group is left alone.
    async fn ensure_group(&self, key: &str, group: &str) -> Result<()> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM");
        match self.query::<Value>(&cmd).await {
            Ok(_) => Ok(()),
            Err(QueueError::Redis(e)) if is_code(&e, "BUSYGROUP") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Runs a (possibly blocking) read on a dedicated connection. A reused connection that
    /// turns out dead (server restarted, idle timeout) is replaced once.
    async fn blocking_read(&self, cmd: &Cmd, block: Duration) -> Result<Value> {
        loop {
            let (mut c, reused) = self.blocking.get().await?;
            match tokio::time::timeout(block + BLOCK_SLACK, cmd.query_async::<Value>(&mut c)).await
            {
                Ok(Ok(v)) => {
                    self.blocking.put(c);
                    return Ok(v);
                }
                Ok(Err(e)) if reused && (e.is_connection_dropped() || e.is_io_error()) => {
                    tracing::debug!(error = %e, "pooled redis connection was dead; reconnecting");
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(QueueError::Redis(redis::RedisError::from(
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "blocking read outlived its BLOCK time",
                        ),
                    )))
                }
            }
        }
    }

    /// XREADGROUP on `key` as `consumer` from `id` (`>` for new entries), creating the group
    /// when it is missing (first use, or a server restarted without persistence).
    async fn read_group(
        &self,
        key: &str,
        group: &str,
        consumer: &str,
        id: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Entry>> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(group)
            .arg(consumer)
            .arg("COUNT")
            .arg(max);
        if !block.is_zero() {
            cmd.arg("BLOCK").arg(ms(block).max(1));
        }
        cmd.arg("STREAMS").arg(key).arg(id);
        let v = match self.blocking_read(&cmd, block).await {
            Err(QueueError::Redis(e)) if is_code(&e, "NOGROUP") => {
                self.ensure_group(key, group).await?;
                self.blocking_read(&cmd, block).await?
            }
            other => other?,
        };
        read_reply(&v)
    }

    /// XAUTOCLAIM up to `max` entries idle for `min_idle`; a missing group means nothing.
    async fn auto_claim(
        &self,
        key: &str,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        let mut cursor = "0-0".to_owned();
        for _ in 0..MAX_AUTOCLAIM_PASSES {
            let mut cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(key)
                .arg(group)
                .arg(consumer)
                .arg(ms(min_idle))
                .arg(&cursor)
                .arg("COUNT")
                .arg(max - out.len());
            let v = match self.query::<Value>(&cmd).await {
                Err(QueueError::Redis(e)) if is_code(&e, "NOGROUP") => return Ok(out),
                other => other?,
            };
            let (next, entries) = autoclaim_reply(&v)?;
            out.extend(entries.into_iter().filter(|e| e.fields.is_some()));
            if next == "0-0" || out.len() >= max {
                break;
            }
            cursor = next;
        }
        Ok(out)
    }

    /// Acks and deletes a jobs entry without an ownership check (undecodable entries).
    async fn discard_job_entry(&self, key: &str, entry: &str) -> Result<()> {
        let mut p = redis::pipe();
        p.atomic()
            .cmd("XACK")
            .arg(key)
            .arg(WORKERS_GROUP)
            .arg(entry)
            .ignore()
            .cmd("XDEL")
            .arg(key)
            .arg(entry)
            .ignore();
        let mut c = self.conn.clone();
        p.query_async::<()>(&mut c).await?;
        Ok(())
    }

    /// Passes delivered entries through the start gate; returns those that may run.
    async fn gate(
        &self,
        model: &str,
        key: &str,
        consumer: &str,
        entries: Vec<Entry>,
    ) -> Result<Vec<ClaimedJob>> {
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let job = match job_from_entry(&e) {
                Ok(j) => j,
                Err(err) => {
                    tracing::error!(model, entry = %e.id, error = %err, "dropping undecodable job");
                    self.discard_job_entry(key, &e.id).await?;
                    continue;
                }
            };
            let mut c = self.conn.clone();
            let v: Value = self
                .scripts
                .gate
                .key(self.keys.state(job.id))
                .key(key)
                .key(self.keys.cancel(job.id))
                .key(self.keys.decoding(model))
                .arg(&e.id)
                .arg(job.deadline_ms)
                .arg(ms(self.config.request_ttl))
                .arg(job.id.to_string())
                .invoke_async(&mut c)
                .await?;
            let r = items(&v).unwrap_or_default();
            let pass = r.first().and_then(int) == Some(1);
            let attempt = r.get(1).and_then(int).unwrap_or(1);
            if pass {
                out.push(ClaimedJob {
                    job,
                    entry_id: e.id,
                    consumer: consumer.to_owned(),
                    attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                });
            } else {
                tracing::debug!(model, request_id = %job.id, "claimed job was withdrawn");
                count(m::WITHDRAWN, model, 1);
            }
        }
        Ok(out)
    }

    /// Logs and counts jobs `consumer` took over, and adds their re-prefill to the model's
    /// prompt-token counter.
    async fn took_over(
        &self,
        model: &str,
        consumer: &str,
        got: Vec<ClaimedJob>,
    ) -> Vec<ClaimedJob> {
        for j in &got {
            tracing::info!(model, request_id = %j.job.id, consumer, attempt = j.attempt, "took over job");
        }
        // The taker prefills these again: they are new prefill demand for the autoscaler.
        // The jobs are this consumer's already, so a failed count must not hide them from it.
        let re_prefill: u64 = got.iter().map(|j| j.job.prompt_tokens_estimate()).sum();
        if re_prefill > 0 {
            let mut c = self.conn.clone();
            let counted: redis::RedisResult<i64> = redis::cmd("INCRBY")
                .arg(self.keys.prompt_tokens(model))
                .arg(re_prefill)
                .query_async(&mut c)
                .await;
            if let Err(error) = counted {
                tracing::warn!(model, %error, re_prefill, "could not count the re-prefill of jobs taken over");
            }
        }
        count(m::TAKEN_OVER, model, got.len() as u64);
        got
    }

    /// The outcome of an APPEND script's reply (`held`: the holder's variant).
    fn appended(
        id: Uuid,
        event: &ResponseEvent,
        held: Option<&ClaimedJob>,
        v: &[i64],
    ) -> Result<()> {
        match (v, held) {
            ([0, _], _) => Ok(()),
            ([1, last], _) => Err(QueueError::SeqConflict {
                id,
                seq: event.seq(),
                last: (*last).max(0) as u64,
            }),
            ([2, _], _) => Err(QueueError::ResponseFinished { id }),
            ([3, _], Some(job)) => Err(Self::not_owner(job)),
            _ => Err(QueueError::Malformed {
                what: "append reply",
                detail: format!("{v:?}"),
            }),
        }
    }

    fn not_owner(job: &ClaimedJob) -> QueueError {
        QueueError::NotOwner {
            model: job.job.model.clone(),
            entry: job.entry_id.clone(),
            consumer: job.consumer.clone(),
        }
    }

    fn usage_deliveries(&self, entries: Vec<Entry>) -> Result<Vec<UsageDelivery>> {
        entries
            .into_iter()
            .filter(|e| e.fields.is_some())
            .map(|e| {
                Ok(UsageDelivery {
                    event: json_field(&e, "ev", "usage event")?,
                    entry_id: e.id,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Broker for RedisBroker {
    async fn enqueue(&self, job: &Job) -> Result<EntryId> {
        let mut add = redis::cmd("XADD");
        add.arg(self.keys.job_stream(&job.model, job.resume.is_some()))
            .arg("*");
        for (k, v) in job_fields(job)? {
            add.arg(k).arg(v);
        }
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(add)
            .cmd("INCRBY")
            .arg(self.keys.prompt_tokens(&job.model))
            .arg(job.prompt_tokens_estimate())
            .ignore();
        let mut c = self.conn.clone();
        let (id,): (String,) = pipe.query_async(&mut c).await?;
        count(m::ENQUEUED, &job.model, 1);
        Ok(id)
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
        // Resumed jobs first (vLLM puts preempted sequences back at the head of its waiting
        // queue); wait on the fresh stream only when none is there.
        let resumed_key = self.keys.resumed(model);
        let resumed = self
            .read_group(
                &resumed_key,
                WORKERS_GROUP,
                consumer,
                ">",
                max,
                Duration::ZERO,
            )
            .await?;
        let delivered = resumed.len();
        let mut got = self.gate(model, &resumed_key, consumer, resumed).await?;
        if delivered < max {
            let key = self.keys.jobs(model);
            let wait = if delivered == 0 {
                block
            } else {
                Duration::ZERO
            };
            let fresh = self
                .read_group(&key, WORKERS_GROUP, consumer, ">", max - delivered, wait)
                .await?;
            got.extend(self.gate(model, &key, consumer, fresh).await?);
        }
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
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut got = Vec::new();
        for key in [self.keys.resumed(model), self.keys.jobs(model)] {
            if got.len() >= max {
                break;
            }
            let entries = self
                .auto_claim(&key, WORKERS_GROUP, consumer, min_idle, max - got.len())
                .await?;
            got.extend(self.gate(model, &key, consumer, entries).await?);
        }
        Ok(self.took_over(model, consumer, got).await)
    }

    async fn take_over_dead(
        &self,
        model: &str,
        consumer: &str,
        now_ms: u64,
        dead_after: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedJob>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let dead: Vec<String> = self
            .workers(model)
            .await?
            .into_iter()
            .filter(|b| b.worker != consumer && is_stale(b, now_ms, dead_after))
            .map(|b| b.worker)
            .collect();
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        let mut got = Vec::new();
        for key in [self.keys.resumed(model), self.keys.jobs(model)] {
            if got.len() >= max {
                break;
            }
            let mut c = self.conn.clone();
            let mut inv = self.scripts.take_from.key(&key);
            inv.arg(consumer).arg(max - got.len()).arg(&dead);
            let v: Value = inv.invoke_async(&mut c).await?;
            let claimed = entries(&v)?
                .into_iter()
                .filter(|e| e.fields.is_some())
                .collect();
            got.extend(self.gate(model, &key, consumer, claimed).await?);
        }
        if got.len() < max {
            // Everything the dead held is taken: forget those that hold nothing now.
            let mut c = self.conn.clone();
            let mut inv = self.scripts.forget_idle.key(self.keys.jobs(model));
            inv.key(self.keys.resumed(model))
                .key(self.keys.workers(model))
                .arg(&dead);
            let _: i64 = inv.invoke_async(&mut c).await?;
        }
        Ok(self.took_over(model, consumer, got).await)
    }

    async fn keep_alive(&self, jobs: &[ClaimedJob]) -> Result<Vec<bool>> {
        let mut out = vec![false; jobs.len()];
        // One script call per (stream, consumer): fresh and resumed jobs live apart.
        let mut groups: Vec<(String, &str, Vec<usize>)> = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let key = self
                .keys
                .job_stream(&job.job.model, job.job.resume.is_some());
            match groups
                .iter_mut()
                .find(|g| g.0 == key && g.1 == job.consumer)
            {
                Some(g) => g.2.push(i),
                None => groups.push((key, job.consumer.as_str(), vec![i])),
            }
        }
        for (key, consumer, idx) in groups {
            let mut c = self.conn.clone();
            let mut inv = self.scripts.keep_alive.key(&key);
            inv.arg(consumer);
            for &i in &idx {
                inv.arg(&jobs[i].entry_id);
            }
            let alive: Vec<i64> = inv.invoke_async(&mut c).await?;
            if alive.len() != idx.len() {
                return Err(QueueError::Malformed {
                    what: "keep-alive reply",
                    detail: format!("{} answers for {} entries", alive.len(), idx.len()),
                });
            }
            for (i, a) in idx.into_iter().zip(alive) {
                out[i] = a == 1;
            }
        }
        Ok(out)
    }

    async fn holder(&self, job: &ClaimedJob) -> Result<Option<String>> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(
            self.keys
                .job_stream(&job.job.model, job.job.resume.is_some()),
        )
        .arg(WORKERS_GROUP)
        .arg(&job.entry_id)
        .arg(&job.entry_id)
        .arg(1);
        let v = match self.query::<Value>(&cmd).await {
            // No stream or no group: nothing is pending at all.
            Err(QueueError::Redis(e)) if is_code(&e, "NOGROUP") => return Ok(None),
            other => other?,
        };
        // [[entry, consumer, idle ms, deliveries]], or [] when the entry is not pending.
        let rows = items(&v).unwrap_or_default();
        match rows.first() {
            None => Ok(None),
            Some(row) => {
                let consumer = items(row)
                    .and_then(|r| r.get(1).and_then(string))
                    .ok_or_else(|| malformed("XPENDING reply", format!("{v:?}")))?;
                Ok(Some(consumer))
            }
        }
    }

    async fn ack(&self, job: &ClaimedJob) -> Result<()> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .scripts
            .ack
            .key(
                self.keys
                    .job_stream(&job.job.model, job.job.resume.is_some()),
            )
            .key(self.keys.state(job.job.id))
            .key(self.keys.decoding(&job.job.model))
            .arg(&job.entry_id)
            .arg(&job.consumer)
            .arg(ms(self.config.response_ttl).max(1))
            .arg(job.job.id.to_string())
            .invoke_async(&mut c)
            .await?;
        if n != 1 {
            return Err(Self::not_owner(job));
        }
        count(m::ACKED, &job.job.model, 1);
        Ok(())
    }

    async fn mark_decoding(&self, job: &ClaimedJob) -> Result<()> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .scripts
            .mark_decoding
            .key(
                self.keys
                    .job_stream(&job.job.model, job.job.resume.is_some()),
            )
            .key(self.keys.decoding(&job.job.model))
            .arg(&job.entry_id)
            .arg(&job.consumer)
            .arg(job.job.id.to_string())
            .arg(ms(self.config.request_ttl).max(1))
            .invoke_async(&mut c)
            .await?;
        if n != 1 {
            return Err(Self::not_owner(job));
        }
        Ok(())
    }

    async fn requeue(&self, job: &ClaimedJob, mut resume: Resume) -> Result<EntryId> {
        resume.segments = job.segment() + 1;
        let mut next = job.job.clone();
        next.resume = Some(resume);
        let mut c = self.conn.clone();
        let model = &job.job.model;
        let mut inv = self
            .scripts
            .requeue
            .key(self.keys.job_stream(model, job.job.resume.is_some()));
        inv.key(self.keys.resumed(model));
        inv.key(self.keys.prompt_tokens(model));
        inv.key(self.keys.decoding(model));
        inv.arg(&job.entry_id)
            .arg(&job.consumer)
            .arg(next.prompt_tokens_estimate())
            .arg(job.job.id.to_string());
        for (k, v) in job_fields(&next)? {
            inv.arg(k).arg(v);
        }
        let v: Value = inv.invoke_async(&mut c).await?;
        match v {
            Value::Int(_) => Err(Self::not_owner(job)),
            other => {
                let id = string(&other).ok_or_else(|| QueueError::Malformed {
                    what: "requeue reply",
                    detail: format!("{other:?}"),
                })?;
                count(m::REENQUEUED, &job.job.model, 1);
                tracing::info!(model = %job.job.model, request_id = %job.job.id, entry = %id, "re-enqueued job");
                Ok(id)
            }
        }
    }

    async fn withdraw(&self, model: &str, id: Uuid, entry: &EntryId) -> Result<Withdrawal> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .scripts
            .withdraw
            .key(self.keys.state(id))
            .key(self.keys.jobs(model))
            .arg(entry)
            .arg(ms(self.config.request_ttl))
            .invoke_async(&mut c)
            .await?;
        Ok(match n {
            0 => Withdrawal::AlreadyStarted,
            1 => {
                count(m::WITHDRAWN, model, 1);
                Withdrawal::Withdrawn
            }
            _ => Withdrawal::Withdrawn,
        })
    }

    async fn depth(&self, model: &str) -> Result<QueueDepth> {
        let mut c = self.conn.clone();
        let v: Vec<i64> = self
            .scripts
            .depth
            .key(self.keys.jobs(model))
            .key(self.keys.resumed(model))
            .key(self.keys.prompt_tokens(model))
            .key(self.keys.decoding(model))
            .invoke_async(&mut c)
            .await?;
        let [b1, p1, w1, b2, p2, w2, tokens, decoding] = v[..] else {
            return Err(QueueError::Malformed {
                what: "depth reply",
                detail: format!("{v:?}"),
            });
        };
        let count = |n: i64| n.max(0) as u64;
        let in_flight = count(p1) + count(p2);
        Ok(QueueDepth {
            backlog: count(b1) + count(b2),
            in_flight,
            oldest_wait_ms: u64::try_from(w1).ok().max(u64::try_from(w2).ok()),
            arrived_prompt_tokens: count(tokens),
            // a member the set kept past its job cannot count beyond the jobs held
            decoding: count(decoding).min(in_flight),
        })
    }

    async fn purge_model(&self, model: &str) -> Result<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.keys.jobs(model))
            .arg(self.keys.resumed(model))
            .arg(self.keys.workers(model))
            .arg(self.keys.prompt_tokens(model))
            .arg(self.keys.decoding(model));
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn append_response(&self, id: Uuid, event: &ResponseEvent) -> Result<()> {
        let mut c = self.conn.clone();
        let v: Vec<i64> = self
            .scripts
            .append
            .key(self.keys.resp(id))
            .arg(event.seq())
            .arg(if event.is_terminal() { "1" } else { "0" })
            .arg(serde_json::to_string(event)?)
            .arg(ms(self.config.response_ttl).max(1))
            .invoke_async(&mut c)
            .await?;
        Self::appended(id, event, None, &v)
    }

    async fn append_held(&self, job: &ClaimedJob, event: &ResponseEvent) -> Result<()> {
        let id = job.job.id;
        let mut c = self.conn.clone();
        let v: Vec<i64> = self
            .scripts
            .append_held
            .key(self.keys.resp(id))
            .key(
                self.keys
                    .job_stream(&job.job.model, job.job.resume.is_some()),
            )
            .arg(event.seq())
            .arg(if event.is_terminal() { "1" } else { "0" })
            .arg(serde_json::to_string(event)?)
            .arg(ms(self.config.response_ttl).max(1))
            .arg(&job.entry_id)
            .arg(&job.consumer)
            .invoke_async(&mut c)
            .await?;
        Self::appended(id, event, Some(job), &v)
    }

    async fn read_responses(
        &self,
        id: Uuid,
        after_seq: u64,
        max: usize,
        block: Duration,
    ) -> Result<Vec<ResponseEvent>> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(max.max(1));
        if !block.is_zero() {
            cmd.arg("BLOCK").arg(ms(block).max(1));
        }
        cmd.arg("STREAMS")
            .arg(self.keys.resp(id))
            .arg(format!("0-{after_seq}"));
        let v = self.blocking_read(&cmd, block).await?;
        read_reply(&v)?
            .iter()
            .filter(|e| e.fields.is_some())
            .map(|e| json_field(e, "ev", "response event"))
            .collect()
    }

    async fn delete_responses(&self, id: Uuid) -> Result<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.keys.resp(id));
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn submit(&self, job: &Job, record: &RequestRecord) -> Result<Submitted> {
        let idempotency_key = record.idempotency.as_ref().map(|i| i.key.as_str());
        let blank = RequestRecord {
            entry_id: String::new(),
            ..record.clone()
        };
        let mut c = self.conn.clone();
        let mut inv = self
            .scripts
            .submit
            .key(self.keys.job_stream(&job.model, job.resume.is_some()));
        inv.key(self.keys.request(record.id));
        inv.key(
            self.keys
                .idempotency(&job.tenant, idempotency_key.unwrap_or("")),
        );
        inv.key(self.keys.prompt_tokens(&job.model));
        inv.arg(serde_json::to_string(&blank)?)
            .arg(ms(self.config.request_ttl).max(1))
            .arg(u8::from(idempotency_key.is_some()))
            .arg(record.id.to_string())
            .arg(job.prompt_tokens_estimate());
        for (k, v) in job_fields(job)? {
            inv.arg(k).arg(v);
        }
        let (status, value): (i64, String) = inv.invoke_async(&mut c).await?;
        match status {
            1 => {
                count(m::ENQUEUED, &job.model, 1);
                Ok(Submitted::Enqueued(value))
            }
            0 => {
                let id = Uuid::parse_str(&value).map_err(|_| {
                    malformed("idempotency key", format!("not a request id: {value}"))
                })?;
                Ok(Submitted::Duplicate {
                    id,
                    record: self.request(id).await?,
                })
            }
            _ => Err(duplicate_request(record.id)),
        }
    }

    async fn release_idempotency_key(&self, tenant: &str, key: &str, id: Uuid) -> Result<()> {
        let mut c = self.conn.clone();
        let _: i64 = self
            .scripts
            .release_key
            .key(self.keys.idempotency(tenant, key))
            .key(self.keys.request(id))
            .arg(id.to_string())
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }

    async fn request(&self, id: Uuid) -> Result<Option<RequestRecord>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.keys.request(id));
        let v: Option<String> = self.query(&cmd).await?;
        Ok(match v {
            Some(s) => Some(serde_json::from_str(&s)?),
            None => None,
        })
    }

    fn request_ttl(&self) -> Duration {
        self.config.request_ttl
    }

    async fn forget_request(&self, id: Uuid) -> Result<bool> {
        let mut p = redis::pipe();
        p.cmd("DEL")
            .arg(self.keys.request(id))
            .cmd("DEL")
            .arg(self.keys.resp(id))
            .ignore();
        let mut c = self.conn.clone();
        let (records,): (i64,) = p.query_async(&mut c).await?;
        Ok(records == 1)
    }

    async fn cancel(&self, id: Uuid, delivered_seq: u64) -> Result<()> {
        let mut c = self.conn.clone();
        let _: i64 = self
            .scripts
            .cancel
            .key(self.keys.cancel(id))
            .key(self.keys.request(id))
            .arg(delivered_seq)
            .arg(ms(self.config.request_ttl).max(1))
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }

    async fn is_cancelled(&self, id: Uuid) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.keys.cancel(id));
        Ok(self.query::<i64>(&cmd).await? == 1)
    }

    async fn cancelled(&self, ids: &[Uuid]) -> Result<Vec<Option<u64>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("MGET");
        for id in ids {
            cmd.arg(self.keys.cancel(*id));
        }
        let flags: Vec<Option<String>> = self.query(&cmd).await?;
        // A flag that holds no seq still cancels; it bills everything written, as a worker
        // cannot tell what was delivered.
        Ok(flags
            .into_iter()
            .map(|f| f.map(|seq| seq.parse().unwrap_or(u64::MAX)))
            .collect())
    }

    async fn publish_usage(&self, event: &UsageEvent) -> Result<EntryId> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.keys.usage())
            .arg("*")
            .arg("request_id")
            .arg(event.request_id.to_string())
            .arg("segment")
            .arg(event.segment)
            .arg("ev")
            .arg(serde_json::to_string(event)?);
        self.query(&cmd).await
    }

    async fn read_usage(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<UsageDelivery>> {
        let key = self.keys.usage();
        // Own pending first: what this consumer read before a crash and never acked.
        let own = self
            .read_group(&key, BILLING_GROUP, consumer, "0", max, Duration::ZERO)
            .await?;
        let own = self.usage_deliveries(own)?;
        if !own.is_empty() {
            return Ok(own);
        }
        let new = self
            .read_group(&key, BILLING_GROUP, consumer, ">", max, block)
            .await?;
        self.usage_deliveries(new)
    }

    async fn take_over_usage(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<UsageDelivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let entries = self
            .auto_claim(&self.keys.usage(), BILLING_GROUP, consumer, min_idle, max)
            .await?;
        self.usage_deliveries(entries)
    }

    async fn ack_usage(&self, entries: &[EntryId]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let key = self.keys.usage();
        let mut p = redis::pipe();
        p.atomic()
            .cmd("XACK")
            .arg(&key)
            .arg(BILLING_GROUP)
            .arg(entries)
            .ignore()
            .cmd("XDEL")
            .arg(&key)
            .arg(entries)
            .ignore();
        let mut c = self.conn.clone();
        p.query_async::<()>(&mut c).await?;
        Ok(())
    }

    async fn heartbeat(&self, beat: &WorkerHeartbeat) -> Result<()> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.workers(&beat.model))
            .arg(&beat.worker)
            .arg(serde_json::to_string(beat)?);
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn workers(&self, model: &str) -> Result<Vec<WorkerHeartbeat>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.workers(model));
        let all: std::collections::BTreeMap<String, String> = self.query(&cmd).await?;
        all.values().map(|v| Ok(serde_json::from_str(v)?)).collect()
    }

    async fn expire_workers(
        &self,
        model: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>> {
        let stale: Vec<String> = self
            .workers(model)
            .await?
            .into_iter()
            .filter(|b| is_stale(b, now_ms, max_age))
            .map(|b| b.worker)
            .collect();
        if !stale.is_empty() {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(self.keys.workers(model)).arg(&stale);
            self.query::<i64>(&cmd).await?;
        }
        Ok(stale)
    }

    async fn pool_heartbeat(&self, beat: &PoolHeartbeat) -> Result<()> {
        check_name("pool", &beat.pool)?;
        check_name("worker", &beat.worker)?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.pool_workers(&beat.pool))
            .arg(&beat.worker)
            .arg(serde_json::to_string(beat)?);
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn pool_workers(&self, pool: &str) -> Result<Vec<PoolHeartbeat>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.pool_workers(pool));
        let all: std::collections::BTreeMap<String, String> = self.query(&cmd).await?;
        all.values().map(|v| Ok(serde_json::from_str(v)?)).collect()
    }

    async fn expire_pool_workers(
        &self,
        pool: &str,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<Vec<String>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.pool_workers(pool));
        let all: std::collections::BTreeMap<String, String> = self.query(&cmd).await?;
        let mut inv = self.scripts.expire_pool.key(self.keys.pool_workers(pool));
        inv.key(self.keys.pool_assign(pool));
        let mut any = false;
        for (worker, json) in &all {
            let beat: PoolHeartbeat = serde_json::from_str(json)?;
            if is_pool_stale(&beat, now_ms, max_age) {
                inv.arg(worker).arg(json);
                any = true;
            }
        }
        if !any {
            return Ok(Vec::new());
        }
        let mut c = self.conn.clone();
        Ok(inv.invoke_async(&mut c).await?)
    }

    async fn set_pool_assignment(&self, pool: &str, worker: &str, models: &[String]) -> Result<()> {
        check_name("pool", pool)?;
        check_name("worker", worker)?;
        check_assignment(models)?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.pool_assign(pool))
            .arg(worker)
            .arg(serde_json::to_string(models)?);
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn pool_assignment(&self, pool: &str, worker: &str) -> Result<Option<Vec<String>>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(self.keys.pool_assign(pool)).arg(worker);
        let v: Option<String> = self.query(&cmd).await?;
        Ok(match v {
            Some(s) => Some(serde_json::from_str(&s)?),
            None => None,
        })
    }

    async fn pool_assignments(
        &self,
        pool: &str,
    ) -> Result<std::collections::BTreeMap<String, Vec<String>>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.pool_assign(pool));
        let all: std::collections::BTreeMap<String, String> = self.query(&cmd).await?;
        all.into_iter()
            .map(|(w, v)| Ok((w, serde_json::from_str(&v)?)))
            .collect()
    }

    async fn put_model(&self, record: &ModelRecord) -> Result<()> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.models())
            .arg(&record.id)
            .arg(serde_json::to_string(record)?);
        self.query::<i64>(&cmd).await?;
        Ok(())
    }

    async fn model(&self, id: &str) -> Result<Option<ModelRecord>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(self.keys.models()).arg(id);
        let v: Option<String> = self.query(&cmd).await?;
        Ok(match v {
            Some(s) => Some(serde_json::from_str(&s)?),
            None => None,
        })
    }

    async fn models(&self) -> Result<Vec<ModelRecord>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.models());
        let all: std::collections::BTreeMap<String, String> = self.query(&cmd).await?;
        all.values().map(|v| Ok(serde_json::from_str(v)?)).collect()
    }

    async fn remove_model(&self, id: &str) -> Result<bool> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.keys.models()).arg(id);
        Ok(self.query::<i64>(&cmd).await? == 1)
    }
}
