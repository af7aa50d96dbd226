//! The scheduler (vLLM v1 `Scheduler.schedule`, `update_from_output`, `_preempt_request`).

use std::collections::{HashMap, VecDeque};

use super::batch::{ScheduledBatch, ScheduledSeq};
use super::sequence::{Sequence, Status};
use super::{SchedulerConfig, SchedulerError, SeqId};
use crate::kv_cache::{CacheScope, KvCacheConfig, KvCacheError, KvCacheManager};
use crate::speculative::SpeculationStats;

/// Counters the engine exports as metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SchedulerStats {
    /// KV blocks in use / total.
    pub kv_usage: f64,
    /// KV blocks referenced by no sequence (empty or evictable).
    pub num_free_blocks: usize,
    /// KV blocks in total.
    pub num_blocks: usize,
    /// KV blocks findable in the prefix cache.
    pub num_cached_blocks: usize,
    /// Tokens looked up in the prefix cache, once per admission.
    pub prefix_cache_queries: u64,
    /// Of those, tokens served from the cache.
    pub prefix_cache_hits: u64,
    /// Preemptions since start.
    pub preemptions: u64,
    /// Sequences running.
    pub num_running: usize,
    /// Sequences waiting (new or preempted).
    pub num_waiting: usize,
    /// Tokens of running and waiting sequences still to be computed before each can yield
    /// its next token (prompt chunks, or a preempted sequence's recompute); a decoding
    /// sequence counts none. The prefill work queued in this engine.
    pub num_prefill_tokens_pending: usize,
    /// Moving average (weight 1/8) of the prompt lengths of the sequences added lately; 0
    /// before the first.
    pub recent_prompt_tokens: usize,
    /// The engine's measured prefill throughput in tokens per second: a moving average over
    /// its steps that were mostly prompt work (step tokens over step time). 0 before the
    /// first prefill step; set by the engine, the scheduler leaves it 0.
    pub prefill_tokens_per_s: f64,
    /// Speculative decoding's totals since the engine started; set by the engine.
    pub speculation: SpeculationStats,
    /// Blocks of the draft model's KV cache (0 without one); set by the engine.
    pub draft_kv_blocks: usize,
    /// Of those, held by no sequence.
    pub draft_kv_free_blocks: usize,
    /// A draft model's forward pass relative to a one-token step, as the choice of k
    /// weighs it (measured or `--draft-cost`; 0 without a draft model); set by the engine.
    pub draft_cost: f64,
    /// Mean price of a verified token at the largest k, as the choice of k weighs it
    /// (measured at start or `--speculative-verify-cost`; 0 without speculation); set by
    /// the engine.
    pub verify_cost: f64,
}

/// Continuous-batching scheduler over a paged KV cache; see the module docs.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    seqs: HashMap<SeqId, Sequence>,
    /// FCFS; preempted sequences go back to the front.
    waiting: VecDeque<SeqId>,
    /// Admission order: the last one is the newest, preempted first.
    running: Vec<SeqId>,
    /// Sequences of the last batch whose KV is not yet known to be written.
    uncommitted: Vec<SeqId>,
    num_preemptions: u64,
    recent_prompt_tokens: usize,
}

impl Scheduler {
    /// A scheduler with an empty KV cache.
    ///
    /// # Panics
    /// If `cfg` fails [`SchedulerConfig::validate`] (a zero limit could never make
    /// progress). Configuration is checked at startup; use [`Self::try_new`] to handle it.
    pub fn new(cfg: SchedulerConfig) -> Self {
        match Self::try_new(cfg) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// A scheduler with an empty KV cache, or why `cfg` cannot work.
    pub fn try_new(cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        cfg.validate()?;
        let kv = KvCacheManager::new(KvCacheConfig {
            num_blocks: cfg.num_blocks,
            block_size: cfg.block_size,
            enable_prefix_caching: cfg.enable_prefix_caching,
        })?;
        Ok(Self {
            cfg,
            kv,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            uncommitted: Vec::new(),
            num_preemptions: 0,
            recent_prompt_tokens: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a new sequence in the unsalted prefix-cache scope. Error if the id is in use,
    /// the prompt is empty, nothing is to be generated, or prompt + max_new_tokens can never
    /// fit in the whole cache.
    pub fn add(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        max_new_tokens: usize,
    ) -> Result<(), SchedulerError> {
        self.add_scoped(id, prompt, max_new_tokens, CacheScope::unsalted())
    }

    /// [`Self::add`] with the prefix-cache scope the sequence shares blocks in.
    pub fn add_scoped(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        max_new_tokens: usize,
        cache_scope: CacheScope,
    ) -> Result<(), SchedulerError> {
        if self.seqs.contains_key(&id) {
            return Err(SchedulerError::DuplicateId(id));
        }
        if prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        if max_new_tokens == 0 {
            return Err(SchedulerError::NoNewTokens);
        }
        // The last sampled token is never fed back, so KV holds prompt + max_new - 1 positions.
        let needed_tokens = prompt.len().saturating_add(max_new_tokens - 1);
        let needed_blocks = self.kv.blocks_for(needed_tokens);
        if needed_blocks > self.kv.num_blocks() {
            return Err(SchedulerError::TooLong {
                needed_tokens,
                needed_blocks,
                num_blocks: self.kv.num_blocks(),
            });
        }
        self.recent_prompt_tokens = match self.recent_prompt_tokens {
            0 => prompt.len(),
            avg => (avg * 7 + prompt.len()).div_ceil(8),
        };
        let mut seq = Sequence::new(prompt, max_new_tokens, cache_scope);
        if self.kv.prefix_caching() {
            seq.update_hashes(self.cfg.block_size);
        }
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        Ok(())
    }

    /// Builds the next step's batch under the token budget and `max_num_seqs`.
    pub fn schedule(&mut self) -> ScheduledBatch {
        // The engine skipped `append_sampled`: the batch still ran, so commit it now.
        self.commit_uncommitted();
        let mut budget = self.cfg.max_num_batched_tokens;
        // (id, start position, token count, of which proposals)
        let mut planned: Vec<(SeqId, usize, usize, usize)> = Vec::new();
        let mut preempted = false;

        // 1. Running sequences, oldest first: a decode token or the next prefill chunk.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (start, n, spec) = match self.seqs.get(&id) {
                // A decode with proposals verifies as many as the budget leaves room for.
                Some(s) if s.is_decoding() && !s.proposal.is_empty() => {
                    let spec = s.proposal.len().min(budget - 1);
                    (s.num_computed, 1 + spec, spec)
                }
                Some(s) => (s.num_computed, s.num_pending().min(budget), 0),
                None => (0, 0, 0),
            };
            if n == 0 {
                // Awaiting its sampled token (or complete): nothing to run.
                i += 1;
                continue;
            }
            let mut scheduled = true;
            loop {
                match self.kv.allocate_slots(id, start + n) {
                    Ok(()) => break,
                    Err(KvCacheError::OutOfBlocks { .. }) => {
                        // Recompute preemption of the newest running sequence (vLLM v1).
                        let Some(victim) = self.running.pop() else {
                            scheduled = false;
                            break;
                        };
                        self.preempt(victim);
                        preempted = true;
                        if victim == id {
                            scheduled = false;
                            break;
                        }
                    }
                    Err(e) => {
                        // Lost track of its blocks (a bug): restart it from scratch.
                        tracing::error!(seq = id, error = %e, "KV state lost; recomputing sequence");
                        self.running.remove(i);
                        self.preempt(id);
                        scheduled = false;
                        break;
                    }
                }
            }
            // Unscheduled means it left the running queue (preempted itself, so nothing
            // follows it, or was reset): index `i` already points past it.
            if scheduled {
                planned.push((id, start, n, spec));
                budget -= n;
                i += 1;
            }
        }

        // 2. Admit waiting sequences, FCFS, unless this step had to preempt.
        if !preempted {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(seq) = self.seqs.get(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                let hit = self
                    .kv
                    .lookup_prefix(&seq.tokens, &seq.block_hashes, &seq.cache_scope);
                let query = seq.tokens.len();
                let n = (query - hit.num_tokens).min(budget);
                match self.kv.allocate_new(id, &hit, hit.num_tokens + n) {
                    Ok(()) => {}
                    Err(KvCacheError::OutOfBlocks { .. }) => break,
                    Err(e) => {
                        // Stale KV state for a waiting sequence (a bug): drop it so the
                        // next step can admit the sequence cleanly.
                        tracing::error!(seq = id, error = %e, "admission failed; resetting its KV");
                        self.kv.free(id);
                        break;
                    }
                }
                self.waiting.pop_front();
                self.kv.record_prefix_query(query, hit.num_tokens);
                if let Some(seq) = self.seqs.get_mut(&id) {
                    seq.status = Status::Running;
                    seq.num_computed = hit.num_tokens;
                    seq.cached_tokens.get_or_insert(hit.num_tokens);
                }
                self.running.push(id);
                planned.push((id, hit.num_tokens, n, 0));
                budget -= n;
            }
        }

        // 3. Advance the computed counts (vLLM's `_update_after_schedule`) and emit the batch.
        let mut batch = ScheduledBatch::default();
        for (id, start, n, spec) in planned {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            let known = n - spec;
            let mut tokens = seq.tokens[start..start + known].to_vec();
            if spec > 0 {
                seq.proposal.truncate(spec);
                seq.verifying = std::mem::take(&mut seq.proposal);
                tokens.extend_from_slice(&seq.verifying);
            }
            seq.num_computed = start + n;
            batch.num_tokens += n;
            batch.seqs.push(ScheduledSeq {
                id,
                tokens,
                start_pos: start,
                block_table: self
                    .kv
                    .block_table(id)
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default(),
                sample: start + known == seq.tokens.len(),
                num_spec: spec,
                cached_tokens: seq.cached_tokens.unwrap_or(0),
            });
            self.uncommitted.push(id);
        }
        batch
    }

    /// After the model ran the last batch: marks its KV as written (making its full blocks
    /// shareable) and appends each sampled token. A sample is accepted only for a running
    /// sequence whose scheduled chunk reached its last known token; anything else is logged
    /// and ignored. A sequence reaching `max_new_tokens` stops running and frees its blocks.
    pub fn append_sampled(&mut self, sampled: &[(SeqId, u32)]) {
        let tokens: Vec<(SeqId, Vec<u32>)> = sampled.iter().map(|&(id, t)| (id, vec![t])).collect();
        self.append_tokens(&tokens);
    }

    /// [`Self::append_sampled`] for steps that verified proposals: each sequence gets the
    /// tokens the engine kept, the accepted proposals then the target's own token. Tokens
    /// that do not extend the verified proposals are cut after the first that differs (it
    /// is the correction), and no sequence grows past `max_new_tokens`. The positions of
    /// rejected proposals stop counting as computed and their blocks go back to the pool;
    /// the blocks now full of accepted tokens enter the prefix cache.
    pub fn append_tokens(&mut self, appended: &[(SeqId, Vec<u32>)]) {
        self.commit_uncommitted();
        for (id, new_tokens) in appended {
            let id = *id;
            let Some(seq) = self.seqs.get_mut(&id) else {
                tracing::warn!(seq = id, "sampled token for an unknown sequence ignored");
                continue;
            };
            let verifying = std::mem::take(&mut seq.verifying);
            let awaiting = seq.status == Status::Running
                && seq.num_computed == seq.tokens.len() + verifying.len()
                && !seq.is_complete();
            if !awaiting || new_tokens.is_empty() {
                tracing::warn!(
                    seq = id,
                    "sampled token for a sequence not awaiting one ignored"
                );
                continue;
            }
            let accepted = new_tokens
                .iter()
                .zip(&verifying)
                .take_while(|(t, v)| t == v)
                .count();
            let room = seq.max_new_tokens - seq.num_generated();
            let keep = (accepted + 1).min(new_tokens.len()).min(room);
            seq.tokens.extend_from_slice(&new_tokens[..keep]);
            seq.proposal.clear();
            // KV of position p was computed from token p: valid up to the last accepted
            // proposal; the rejected ones are recomputed from the kept tokens.
            seq.num_computed = seq.num_computed - verifying.len() + accepted.min(keep);
            if self.kv.prefix_caching() {
                seq.update_hashes(self.cfg.block_size);
            }
            if seq.is_complete() {
                seq.status = Status::Done;
                self.running.retain(|&r| r != id);
                self.kv.free(id);
            } else if !verifying.is_empty() {
                self.kv.truncate(id, seq.num_computed);
                self.kv.commit(
                    id,
                    &seq.tokens,
                    &seq.block_hashes,
                    seq.num_computed,
                    &seq.cache_scope,
                );
            }
        }
    }

    /// Offers `tokens` as the proposal of a decoding sequence for its next step, cut to what
    /// it may still generate (a step yields one token beyond its proposals). Returns how
    /// many were kept: 0 for a sequence that is not decoding (prefilling, waiting, unknown).
    pub fn propose(&mut self, id: SeqId, mut tokens: Vec<u32>) -> usize {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        if !seq.is_decoding() {
            return 0;
        }
        let room = seq.max_new_tokens.saturating_sub(seq.num_generated() + 1);
        tokens.truncate(room);
        seq.proposal = tokens;
        seq.proposal.len()
    }

    /// Whether `id` is admitted and not complete (prefilling or decoding), not waiting.
    pub fn is_running(&self, id: SeqId) -> bool {
        self.seqs
            .get(&id)
            .is_some_and(|s| s.status == Status::Running)
    }

    /// Whether `id` is decoding: prefilled, with only its last sampled token to run.
    pub fn is_decoding(&self, id: SeqId) -> bool {
        self.seqs.get(&id).is_some_and(Sequence::is_decoding)
    }

    /// Sequence ended (stop, length, abort/cancel): forgets it and frees its blocks; full
    /// computed blocks stay in the prefix cache. Unknown ids are ignored.
    pub fn finish(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        match seq.status {
            Status::Running => self.running.retain(|&r| r != id),
            Status::Waiting => self.waiting.retain(|&w| w != id),
            Status::Done => {}
        }
        // Blocks of a step that has not run are not committed, so never cached.
        self.uncommitted.retain(|&u| u != id);
        self.kv.free(id);
    }

    /// Sequences waiting for admission (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences admitted and not yet complete.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any sequence still needs a step.
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Prompt followed by the generated tokens of a known sequence.
    pub fn sequence_tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    /// Tokens generated so far by a known sequence (kept across preemptions).
    pub fn generated_tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| &s.tokens[s.prompt_len..])
    }

    /// How often a known sequence was preempted.
    pub fn num_preemptions_of(&self, id: SeqId) -> Option<u32> {
        self.seqs.get(&id).map(|s| s.num_preemptions)
    }

    /// The KV cache (read-only), for metrics and inspection.
    pub fn kv_cache(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Current counters.
    pub fn stats(&self) -> SchedulerStats {
        let kv = self.kv.stats();
        SchedulerStats {
            kv_usage: kv.usage,
            num_free_blocks: kv.num_free_blocks,
            num_blocks: kv.num_blocks,
            num_cached_blocks: kv.num_cached_blocks,
            prefix_cache_queries: kv.prefix_cache_queries,
            prefix_cache_hits: kv.prefix_cache_hits,
            preemptions: self.num_preemptions,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_prefill_tokens_pending: self
                .running
                .iter()
                .chain(&self.waiting)
                .filter_map(|id| self.seqs.get(id))
                .map(|s| s.num_pending().saturating_sub(1))
                .sum(),
            recent_prompt_tokens: self.recent_prompt_tokens,
            prefill_tokens_per_s: 0.0,
            speculation: SpeculationStats::default(),
            draft_kv_blocks: 0,
            draft_kv_free_blocks: 0,
            draft_cost: 0.0,
            verify_cost: 0.0,
        }
    }

    /// Full consistency check (for tests and debug builds): the KV cache's invariants, every
    /// running sequence's block table covering exactly its scheduled positions, waiting and
    /// done sequences holding no blocks, each sequence in exactly one place.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        if self.running.len() > self.cfg.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        let mut placed = HashMap::new();
        for &id in self.running.iter().chain(self.waiting.iter()) {
            if placed.insert(id, ()).is_some() {
                return Err(format!("sequence {id} queued twice"));
            }
        }
        for (&id, s) in &self.seqs {
            let table = self.kv.block_table(id);
            match s.status {
                Status::Running => {
                    if !self.running.contains(&id) {
                        return Err(format!("running sequence {id} not in the running queue"));
                    }
                    let len = table.map_or(0, <[u32]>::len);
                    if len != self.kv.blocks_for(s.num_computed) {
                        return Err(format!(
                            "sequence {id}: {len} blocks for {} computed positions",
                            s.num_computed
                        ));
                    }
                    if s.num_computed > s.tokens.len() + s.verifying.len() {
                        return Err(format!("sequence {id} computed past its tokens"));
                    }
                }
                Status::Waiting | Status::Done => {
                    if s.status == Status::Waiting && !self.waiting.contains(&id) {
                        return Err(format!("waiting sequence {id} not in the waiting queue"));
                    }
                    if table.is_some() || (s.status == Status::Waiting && s.num_computed != 0) {
                        return Err(format!("sequence {id} holds KV while not running"));
                    }
                }
            }
            if s.num_generated() > s.max_new_tokens {
                return Err(format!("sequence {id} generated past max_new_tokens"));
            }
        }
        if placed.len() > self.seqs.len() {
            return Err("a queued id has no sequence".into());
        }
        Ok(())
    }

    fn preempt(&mut self, id: SeqId) {
        self.kv.free(id);
        self.num_preemptions += 1;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        seq.num_computed = 0;
        seq.num_preemptions += 1;
        seq.proposal.clear();
        seq.verifying.clear();
        seq.status = Status::Waiting;
        self.waiting.push_front(id);
        tracing::debug!(seq = id, "preempted; will recompute");
    }

    fn commit_uncommitted(&mut self) {
        for id in std::mem::take(&mut self.uncommitted) {
            if let Some(seq) = self.seqs.get(&id) {
                if seq.status == Status::Running {
                    self.kv.commit(
                        id,
                        &seq.tokens,
                        &seq.block_hashes,
                        seq.num_computed,
                        &seq.cache_scope,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(
        budget: usize,
        max_seqs: usize,
        bs: usize,
        blocks: usize,
        prefix: bool,
    ) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            block_size: bs,
            num_blocks: blocks,
            enable_prefix_caching: prefix,
        }
    }

    fn prompt(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| salt * 1000 + i).collect()
    }

    /// Stand-in model: the token sampled after `len` known tokens of `id`.
    fn model_token(id: SeqId, len: usize) -> u32 {
        (id as u32) * 100_000 + 50_000 + len as u32
    }

    /// One engine step: schedule, check, sample every `sample` seq, check again.
    fn step(s: &mut Scheduler) -> ScheduledBatch {
        let batch = s.schedule();
        s.check_invariants().unwrap();
        let bs = s.config().block_size;
        for q in &batch.seqs {
            let known = s.sequence_tokens(q.id).unwrap();
            assert_eq!(q.tokens, known[q.start_pos..q.start_pos + q.tokens.len()]);
            assert_eq!(
                q.block_table.len(),
                (q.start_pos + q.tokens.len()).div_ceil(bs)
            );
            assert_eq!(q.sample, q.start_pos + q.tokens.len() == known.len());
        }
        let sampled: Vec<(SeqId, u32)> = batch
            .seqs
            .iter()
            .filter(|q| q.sample)
            .map(|q| (q.id, model_token(q.id, q.start_pos + q.tokens.len())))
            .collect();
        s.append_sampled(&sampled);
        s.check_invariants().unwrap();
        batch
    }

    fn ids(b: &ScheduledBatch) -> Vec<SeqId> {
        b.seqs.iter().map(|q| q.id).collect()
    }

    #[test]
    fn add_validates_requests_and_new_validates_config() {
        assert!(matches!(
            Scheduler::try_new(cfg(0, 1, 4, 4, true)),
            Err(SchedulerError::InvalidConfig(_))
        ));
        let mut s = Scheduler::new(cfg(8, 2, 4, 4, true));
        assert_eq!(s.add(1, vec![], 4), Err(SchedulerError::EmptyPrompt));
        assert_eq!(s.add(1, vec![1], 0), Err(SchedulerError::NoNewTokens));
        // 16 KV positions in all: prompt 10 + 7 new needs 16 (the last token is never fed).
        assert_eq!(s.add(1, prompt(10, 1), 7), Ok(()));
        assert_eq!(
            s.add(1, prompt(3, 1), 1),
            Err(SchedulerError::DuplicateId(1))
        );
        assert_eq!(
            s.add(2, prompt(10, 1), 8),
            Err(SchedulerError::TooLong {
                needed_tokens: 17,
                needed_blocks: 5,
                num_blocks: 4
            })
        );
        assert_eq!(s.add(3, prompt(1, 1), usize::MAX).map_err(|_| ()), Err(()));
        assert_eq!((s.num_waiting(), s.num_running()), (1, 0));
    }

    #[test]
    fn stats_count_the_prefill_still_queued_and_the_recent_prompt_length() {
        let mut s = Scheduler::new(cfg(5, 4, 4, 32, false));
        assert_eq!(s.stats().num_prefill_tokens_pending, 0);
        assert_eq!(s.stats().recent_prompt_tokens, 0);
        s.add(1, prompt(13, 1), 3).unwrap();
        s.add(2, prompt(5, 2), 3).unwrap();
        // 12 and 4: the last prompt token is the one that yields the first new token
        assert_eq!(s.stats().num_prefill_tokens_pending, 16);
        // 13, then (13 x 7 + 5) / 8 rounded up
        assert_eq!(s.stats().recent_prompt_tokens, 12);
        step(&mut s); // 5 tokens of the first prompt
        assert_eq!(s.stats().num_prefill_tokens_pending, 11);
        while s.stats().num_prefill_tokens_pending > 0 {
            step(&mut s);
        }
        // both decode now: nothing but one token each
        assert_eq!((s.num_running(), s.num_waiting()), (2, 0));
        assert!(s.has_unfinished());
    }

    #[test]
    #[should_panic(expected = "max_num_seqs")]
    fn new_panics_on_a_config_that_cannot_progress() {
        Scheduler::new(cfg(8, 0, 4, 4, true));
    }

    #[test]
    fn chunked_prefill_covers_the_prompt_once_in_order_then_decodes() {
        let mut s = Scheduler::new(cfg(5, 4, 4, 16, false));
        let p = prompt(13, 1);
        s.add(1, p.clone(), 3).unwrap();
        let mut fed = Vec::new();
        let mut shapes = Vec::new();
        while s.has_unfinished() {
            let b = step(&mut s);
            assert_eq!(b.seqs.len(), 1);
            let q = &b.seqs[0];
            assert_eq!(q.start_pos, fed.len(), "chunks are contiguous");
            fed.extend_from_slice(&q.tokens);
            shapes.push((q.start_pos, q.tokens.len(), q.sample));
        }
        assert_eq!(
            shapes,
            vec![
                (0, 5, false),
                (5, 5, false),
                (10, 3, true),
                (13, 1, true),
                (14, 1, true)
            ]
        );
        let generated = s.generated_tokens(1).unwrap().to_vec();
        assert_eq!(
            generated,
            vec![model_token(1, 13), model_token(1, 14), model_token(1, 15)]
        );
        let mut expected = p;
        expected.extend_from_slice(&generated[..2]);
        assert_eq!(
            fed, expected,
            "every known token fed exactly once, in order"
        );
        assert!(
            s.schedule().is_empty(),
            "complete sequences are not scheduled"
        );
        s.finish(1);
        assert_eq!(s.stats().num_free_blocks, 16);
    }

    #[test]
    fn running_decodes_come_first_then_new_prefill_chunks() {
        let mut s = Scheduler::new(cfg(8, 4, 4, 32, false));
        s.add(1, prompt(4, 1), 10).unwrap();
        assert_eq!(step(&mut s).num_tokens, 4);
        s.add(2, prompt(20, 2), 10).unwrap();
        let b = step(&mut s);
        assert_eq!(ids(&b), vec![1, 2]);
        assert_eq!(b.seqs[0].tokens.len(), 1, "decode is one token");
        assert_eq!(
            b.seqs[1].tokens.len(),
            7,
            "prefill gets the rest of the budget"
        );
        assert_eq!(b.num_tokens, 8);
        let b = step(&mut s);
        assert_eq!(ids(&b), vec![1, 2]);
        assert_eq!((b.seqs[1].start_pos, b.seqs[1].tokens.len()), (7, 7));
    }

    #[test]
    fn budget_and_max_num_seqs_hold_on_every_step() {
        let mut s = Scheduler::new(cfg(8, 3, 4, 64, true));
        for id in 0..10u64 {
            s.add(
                id,
                prompt(1 + (id as usize * 7) % 19, id as u32 % 3),
                1 + id as usize % 5,
            )
            .unwrap();
        }
        let mut steps = 0;
        while s.has_unfinished() {
            let b = step(&mut s);
            assert!(b.num_tokens <= 8 && b.seqs.len() <= 3 && s.num_running() <= 3);
            assert!(!b.is_empty(), "work remains, so every step runs something");
            assert_eq!(
                b.num_tokens,
                b.seqs.iter().map(|q| q.tokens.len()).sum::<usize>()
            );
            for q in &b.seqs {
                assert!(!q.tokens.is_empty());
            }
            steps += 1;
            assert!(steps < 1000);
        }
        for id in 0..10u64 {
            assert_eq!(s.generated_tokens(id).unwrap().len(), 1 + id as usize % 5);
        }
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_recomputes_prompt_plus_generated() {
        // 4 blocks of 4: two 8-token prompts fill the cache.
        let mut s = Scheduler::new(cfg(64, 4, 4, 4, false));
        s.add(1, prompt(8, 1), 6).unwrap();
        s.add(2, prompt(8, 2), 6).unwrap();
        assert_eq!(ids(&step(&mut s)), vec![1, 2]);
        assert_eq!(s.stats().num_free_blocks, 0);
        let b_generated = s.generated_tokens(2).unwrap().to_vec();
        assert_eq!(b_generated.len(), 1);

        // Sequence 1 needs a 3rd block: the newest (2) is preempted.
        let b = step(&mut s);
        assert_eq!(ids(&b), vec![1]);
        assert_eq!(s.stats().preemptions, 1);
        assert_eq!(s.num_preemptions_of(2), Some(1));
        assert_eq!((s.num_running(), s.num_waiting()), (1, 1));
        assert_eq!(
            s.generated_tokens(2).unwrap(),
            &b_generated[..],
            "output is kept"
        );
        assert!(s.kv_cache().block_table(2).is_none());

        // Sequence 1 runs to its length limit; 2 does not fit back in before that.
        while s.generated_tokens(1).unwrap().len() < 6 {
            assert_eq!(ids(&step(&mut s)), vec![1]);
        }
        assert_eq!(
            s.num_running(),
            0,
            "1 reached its limit and released its blocks"
        );
        s.finish(1);
        let b = s.schedule();
        s.check_invariants().unwrap();
        assert_eq!(ids(&b), vec![2]);
        let q = &b.seqs[0];
        let mut expected = prompt(8, 2);
        expected.extend_from_slice(&b_generated);
        assert_eq!((q.start_pos, &q.tokens, q.sample), (0, &expected, true));
        s.append_sampled(&[(2, 77)]);
        let mut generated = b_generated.clone();
        generated.push(77);
        assert_eq!(
            s.generated_tokens(2).unwrap(),
            &generated[..],
            "no token repeated or lost"
        );
        assert_eq!(s.stats().preemptions, 1);
    }

    #[test]
    fn a_growing_sequence_that_is_the_newest_preempts_itself() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 4, false));
        s.add(1, prompt(6, 1), 3).unwrap(); // 2 blocks with room for positions 6, 7
        s.add(2, prompt(8, 2), 3).unwrap(); // 2 full blocks
        step(&mut s);
        let b = step(&mut s);
        assert_eq!(
            ids(&b),
            vec![1],
            "2 needed a block, was the newest, preempted itself"
        );
        assert_eq!(s.num_preemptions_of(2), Some(1));
        assert_eq!(s.num_waiting(), 1);
        assert_eq!(s.stats().num_free_blocks, 2);
    }

    #[test]
    fn recompute_after_preemption_reuses_its_own_cached_blocks() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 5, true));
        s.add(1, prompt(8, 1), 6).unwrap();
        s.add(2, prompt(8, 2), 6).unwrap();
        step(&mut s); // 1: blocks 0-1, 2: blocks 2-3, block 4 free
        let mut preempted_at = None;
        for i in 0..10 {
            step(&mut s);
            if s.stats().preemptions > 0 {
                preempted_at = Some(i);
                break;
            }
        }
        assert!(preempted_at.is_some());
        // 1 completes; then 2 is readmitted and recomputes only what was evicted.
        while s.sequence_tokens(1).is_some() {
            step(&mut s);
            if s.generated_tokens(1).unwrap().len() == 6 {
                s.finish(1);
            }
        }
        let b = s.schedule();
        let q = &b.seqs[0];
        assert_eq!(q.id, 2);
        let known = s.sequence_tokens(2).unwrap();
        assert!(
            q.start_pos > 0 && q.start_pos.is_multiple_of(4),
            "its head block survived eviction"
        );
        assert_eq!(q.tokens, known[q.start_pos..]);
        assert!(q.sample);
        assert_eq!(
            q.cached_tokens, 0,
            "usage keeps the first admission's cache reuse"
        );
    }

    #[test]
    fn finished_prompts_stay_cached_for_later_requests() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 16, true));
        let p = prompt(10, 3);
        s.add(1, p.clone(), 1).unwrap();
        let b = step(&mut s);
        assert_eq!(b.seqs[0].cached_tokens, 0);
        assert_eq!(s.num_running(), 0, "length limit reached: blocks freed");
        s.finish(1);
        s.add(2, p.clone(), 1).unwrap();
        let b = step(&mut s);
        let q = &b.seqs[0];
        assert_eq!((q.start_pos, q.cached_tokens), (8, 8));
        assert_eq!(q.tokens, p[8..]);
        let st = s.stats();
        assert_eq!((st.prefix_cache_queries, st.prefix_cache_hits), (20, 8));
        // Fully cached 12-token prompt (3 blocks): the last block is recomputed.
        let p12 = prompt(12, 4);
        s.add(3, p12.clone(), 1).unwrap();
        step(&mut s);
        s.add(4, p12, 1).unwrap();
        assert_eq!(step(&mut s).seqs[0].cached_tokens, 8);
    }

    #[test]
    fn identical_prompts_in_one_step_do_not_share_uncomputed_blocks() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 16, true));
        let p = prompt(12, 5);
        s.add(1, p.clone(), 4).unwrap();
        s.add(2, p.clone(), 4).unwrap();
        let b = step(&mut s);
        assert_eq!(b.seqs[1].cached_tokens, 0);
        let (t1, t2) = (&b.seqs[0].block_table, &b.seqs[1].block_table);
        assert!(t1.iter().all(|x| !t2.contains(x)), "disjoint tables");
        s.add(3, p, 4).unwrap();
        let b = step(&mut s);
        let q = b.seqs.iter().find(|q| q.id == 3).unwrap();
        assert_eq!(
            q.cached_tokens, 8,
            "computed blocks are shared from the next step on"
        );
        assert_eq!(
            q.block_table[..2],
            s.kv_cache().block_table(1).unwrap()[..2]
        );
    }

    #[test]
    fn samples_are_accepted_only_where_due() {
        let mut s = Scheduler::new(cfg(4, 4, 4, 16, false));
        s.add(1, prompt(6, 1), 4).unwrap();
        let b = s.schedule();
        assert!(!b.seqs[0].sample);
        s.append_sampled(&[(1, 9), (42, 9)]); // mid-prefill and unknown: ignored
        assert_eq!(s.generated_tokens(1).unwrap().len(), 0);
        let b = s.schedule();
        assert!(b.seqs[0].sample);
        s.append_sampled(&[(1, 7), (1, 8)]); // one token per step
        assert_eq!(s.generated_tokens(1).unwrap(), &[7]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn finish_frees_waiting_and_running_sequences_and_ids_can_be_reused() {
        let mut s = Scheduler::new(cfg(64, 1, 4, 16, true));
        s.add(1, prompt(9, 1), 4).unwrap();
        s.add(2, prompt(9, 2), 4).unwrap();
        step(&mut s);
        assert_eq!(
            (s.num_running(), s.num_waiting()),
            (1, 1),
            "max_num_seqs = 1"
        );
        s.finish(2);
        s.finish(1);
        s.finish(1); // unknown now: no-op
        assert!(!s.has_unfinished());
        assert_eq!(s.stats().num_free_blocks, 16);
        assert_eq!(s.stats().kv_usage, 0.0);
        s.check_invariants().unwrap();
        s.add(1, prompt(9, 1), 4).unwrap();
        assert_eq!(step(&mut s).seqs[0].cached_tokens, 8);
    }

    #[test]
    fn a_skipped_append_still_commits_the_batch_that_ran() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 16, true));
        let p = prompt(9, 1);
        s.add(1, p.clone(), 4).unwrap();
        s.schedule();
        assert!(s.schedule().is_empty(), "1 awaits its sample");
        s.add(2, p, 4).unwrap();
        assert_eq!(s.schedule().seqs[0].cached_tokens, 8);
        s.check_invariants().unwrap();
    }

    #[test]
    fn cancel_between_schedule_and_append_caches_nothing_unwritten() {
        let mut s = Scheduler::new(cfg(64, 4, 4, 16, true));
        let p = prompt(9, 1);
        s.add(1, p.clone(), 4).unwrap();
        s.schedule();
        s.finish(1); // aborted before the model ran
        s.append_sampled(&[]);
        s.add(2, p, 4).unwrap();
        assert_eq!(s.schedule().seqs[0].cached_tokens, 0);
        assert_eq!(s.stats().num_cached_blocks, 0);
    }
}
