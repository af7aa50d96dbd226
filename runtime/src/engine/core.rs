use std::collections::{HashMap, HashSet};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use tidal_tokenizer::Tokenizer;
use tokio::sync::watch;

use super::executor::Executor;
use super::metrics::EngineMetrics;
use super::prefill_rate::{prefill_tokens, PrefillRate};
use super::request::{FinishReason, TokenLogprob};
use super::sequence::{SeqState, StepOutcome};
use super::{Command, EngineConfig};
use crate::model::{ForwardBatch, ForwardSeq};
use crate::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SchedulerStats, SeqId};
use crate::speculative::{
    measure_step_cost, ProposalSlot, Proposer, SpeculationStats, SpeculativeConfig, StepCost,
    ASSUMED_VERIFY_COST,
};

/// State owned by the engine thread.
pub(crate) struct EngineCore {
    executor: Executor,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    seqs: HashMap<SeqId, SeqState>,
    metrics: EngineMetrics,
    shared_stats: watch::Sender<SchedulerStats>,
    prefill_rate: PrefillRate,
    speculative: SpeculativeConfig,
    /// The proposer, when speculative decoding is on.
    proposer: Option<Proposer>,
    speculation: SpeculationStats,
    /// What a step verifying k proposed tokens of a sequence costs (measured at start
    /// unless `--speculative-verify-cost` gave it).
    step_cost: StepCost,
}

impl EngineCore {
    pub fn new(
        executor: Executor,
        tokenizer: Arc<Tokenizer>,
        config: &EngineConfig,
        num_blocks: usize,
        proposer: Option<Proposer>,
        shared_stats: watch::Sender<SchedulerStats>,
    ) -> Self {
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            block_size: config.block_size,
            num_blocks,
            enable_prefix_caching: config.enable_prefix_caching,
        });
        // Callers (the queue worker's admission) read the stats before the first step.
        shared_stats.send_replace(scheduler.stats());
        Self {
            executor,
            tokenizer,
            scheduler,
            seqs: HashMap::new(),
            metrics: EngineMetrics,
            shared_stats,
            prefill_rate: PrefillRate::default(),
            speculative: config.speculative.clone(),
            proposer,
            speculation: SpeculationStats::default(),
            step_cost: StepCost::linear(
                config
                    .speculative
                    .verify_cost
                    .unwrap_or(ASSUMED_VERIFY_COST),
                config.speculative.num_speculative_tokens,
            ),
        }
    }

    /// Runs until every engine handle is dropped and no work is left.
    pub fn run(mut self, commands: mpsc::Receiver<Command>) {
        self.calibrate();
        // The measured costs, before the first request.
        self.publish_stats();
        loop {
            if self.seqs.is_empty() {
                // Idle: sleep until a request arrives (or every sender is gone).
                match commands.recv() {
                    Ok(command) => self.accept(command),
                    Err(_) => return,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.accept(command);
            }
            self.drop_cancelled();
            if !self.seqs.is_empty() {
                self.step();
            }
            // Every step, so that a worker waiting for room wakes on engine progress.
            self.publish_stats();
        }
    }

    /// Times what a longer step and a draft pass cost, unless the flags gave them. Runs on
    /// the engine thread, on the kernels' pool, where every later step runs.
    fn calibrate(&mut self) {
        let cfg = self.scheduler.config();
        if self.proposer.is_some() && self.speculative.verify_cost.is_none() {
            let max = self.speculative.num_speculative_tokens;
            match measure_step_cost(&mut self.executor, cfg.num_blocks, cfg.block_size, max) {
                Some(cost) => {
                    tracing::info!(
                        per_token = format!("{:.3}", cost.per_token()),
                        curve = ?cost.relative().iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>(),
                        "verify cost measured: steps of 1 + k tokens against one"
                    );
                    self.step_cost = cost;
                }
                None => tracing::warn!(
                    verify_cost = ASSUMED_VERIFY_COST,
                    "verify cost not measured (KV cache too small or a pass failed); assuming it"
                ),
            }
        }
        if let Some(Proposer::Draft(draft)) = &mut self.proposer {
            draft.calibrate(&mut self.executor, cfg.num_blocks, cfg.block_size);
        }
    }

    /// Hands the scheduler's figures, with the engine's own, to the metrics and to every
    /// engine handle.
    fn publish_stats(&mut self) {
        let (draft_kv_blocks, draft_kv_free_blocks) =
            self.proposer.as_ref().map_or((0, 0), Proposer::kv_blocks);
        let stats = SchedulerStats {
            prefill_tokens_per_s: self.prefill_rate.tokens_per_s(),
            speculation: self.speculation,
            draft_kv_blocks,
            draft_kv_free_blocks,
            draft_cost: self.proposer.as_ref().map_or(0.0, Proposer::proposal_cost),
            verify_cost: if self.proposer.is_some() {
                self.step_cost.per_token()
            } else {
                0.0
            },
            ..self.scheduler.stats()
        };
        self.metrics.publish(&stats);
        self.shared_stats.send_replace(stats);
    }

    fn accept(&mut self, command: Command) {
        match command {
            Command::Submit {
                id,
                mut request,
                events,
            } => {
                let resume = request.resume.take();
                let scope = std::mem::take(&mut request.cache_scope);
                let mut state = SeqState::new(request, events);
                if let Some(from) = resume {
                    let context_length = self.executor.config().context_length;
                    if let Some(reason) = state.resume(&from, &self.tokenizer, context_length) {
                        // The earlier run had finished all but its `Done`.
                        state.complete(reason);
                        return;
                    }
                }
                // A resumed sequence prefills its delivered tokens after the prompt.
                let tokens = state.scheduled_tokens();
                let prefill = tokens.len();
                let added = self
                    .scheduler
                    .add_scoped(id, tokens, state.remaining_tokens(), scope);
                if let Err(e) = added {
                    state.fail(e.to_string());
                    return;
                }
                self.metrics.prompt_tokens(prefill);
                self.seqs.insert(id, state);
            }
        }
    }

    /// A dropped receiver means the client went away: free the sequence now.
    fn drop_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.is_cancelled())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            tracing::debug!(seq = id, "client gone; sequence cancelled");
            self.scheduler.finish(id);
            self.forget_proposals(id);
            self.seqs.remove(&id);
        }
    }

    fn step(&mut self) {
        let batch = self.scheduler.schedule();
        if batch.seqs.is_empty() {
            // Nothing fits this step (all blocks held); waiting requests stay queued.
            std::thread::yield_now();
            return;
        }
        let started = Instant::now();
        let forward = ForwardBatch {
            seqs: batch
                .seqs
                .iter()
                .map(|s| ForwardSeq {
                    tokens: &s.tokens,
                    start_pos: s.start_pos,
                    block_table: &s.block_table,
                    num_logits: if s.sample { 1 + s.num_spec } else { 0 },
                })
                .collect(),
        };
        let mut logits = match self.executor.forward(&forward) {
            Ok(logits) => logits,
            Err(e) => {
                // A model error fails this step's sequences, not the engine.
                tracing::error!(error = %e, "forward pass failed");
                for s in &batch.seqs {
                    if let Some(state) = self.seqs.remove(&s.id) {
                        state.fail(format!("model error: {e}"));
                    }
                    self.scheduler.finish(s.id);
                    self.forget_proposals(s.id);
                }
                return;
            }
        };
        let vocab = self.executor.config().vocab_size;
        let context_length = self.executor.config().context_length;
        for s in &batch.seqs {
            if let Some(state) = self.seqs.get_mut(&s.id) {
                state.note_cached_tokens(s.cached_tokens);
            }
        }
        let drawn = draw_tokens(&mut self.seqs, &batch.seqs, &mut logits, vocab);
        self.record_speculation(&batch.seqs, &drawn);
        let appended: Vec<(SeqId, Vec<u32>)> = drawn
            .iter()
            .map(|(id, tokens)| (*id, tokens.iter().map(|t| t.0).collect()))
            .collect();
        self.scheduler.append_tokens(&appended);
        let now = Instant::now();
        for (id, tokens) in drawn {
            for (token, logprob) in tokens {
                let Some(state) = self.seqs.get_mut(&id) else {
                    break;
                };
                self.metrics
                    .token_generated(state.latency_since_last(now), state.is_first_token());
                match state.push_token(token, logprob, &self.tokenizer, context_length, now) {
                    StepOutcome::Continue => {}
                    StepOutcome::Finished(reason) => {
                        // Tokens drawn after a stop are never shown or counted.
                        self.finish(id, reason);
                        break;
                    }
                }
            }
        }
        self.propose(context_length);
        let elapsed = started.elapsed();
        let prefill = prefill_tokens(batch.seqs.iter().map(|s| (s.tokens.len(), s.sample)));
        self.prefill_rate.record(batch.num_tokens, prefill, elapsed);
        self.metrics.step(batch.num_tokens, elapsed);
    }

    /// Counts this step's verifications.
    fn record_speculation(&mut self, batch: &[ScheduledSeq], drawn: &[(SeqId, Drawn)]) {
        let Some(proposer) = self.proposer.as_ref().map(Proposer::name) else {
            return;
        };
        let spec_of: HashMap<SeqId, usize> = batch
            .iter()
            .filter(|s| s.num_spec > 0)
            .map(|s| (s.id, s.num_spec))
            .collect();
        // A plain decode samples without proposals after the sequence's first token (which
        // ends its prefill).
        let plain: HashSet<SeqId> = batch
            .iter()
            .filter(|s| s.sample && s.num_spec == 0)
            .filter(|s| self.seqs.get(&s.id).is_some_and(|q| !q.is_first_token()))
            .map(|s| s.id)
            .collect();
        for (id, tokens) in drawn {
            if let Some(&proposed) = spec_of.get(id) {
                let accepted = tokens.len() - 1;
                self.speculation.record(proposed, accepted);
                self.metrics.speculation(proposer, proposed, accepted);
            } else if plain.contains(id) {
                self.speculation.record_plain();
            }
        }
        if !spec_of.is_empty() {
            self.metrics.speculation_totals(proposer, &self.speculation);
        }
    }

    /// Offers each decoding sequence the proposal for its next step: as many tokens as its
    /// recent acceptance pays for ([`Proposer::propose`]), none while the batch is large
    /// enough that verification costs nearly what it saves.
    fn propose(&mut self, context_length: usize) {
        let Some(proposer) = self.proposer.as_mut() else {
            return;
        };
        // A preempted sequence recomputes from scratch: its draft KV goes too.
        let scheduler = &self.scheduler;
        proposer.retain(|id| scheduler.is_running(id));
        let cfg = &self.speculative;
        if scheduler.num_running() > cfg.max_running {
            return;
        }
        let (mut slots, mut without) = (Vec::new(), Vec::new());
        for (&id, state) in &self.seqs {
            if !scheduler.is_decoding(id) {
                continue;
            }
            // The last proposal must leave room for the target's own token, within the
            // context and within max_tokens.
            let room = state
                .context_room(context_length)
                .min(state.remaining_tokens())
                .saturating_sub(1);
            let limit = state
                .speculative_limit(cfg.num_speculative_tokens)
                .min(room);
            match scheduler.sequence_tokens(id).filter(|_| limit > 0) {
                Some(tokens) => slots.push(ProposalSlot {
                    id,
                    tokens,
                    limit,
                    acceptance: state.acceptance(),
                }),
                None => without.push(id),
            }
        }
        let step_cost = &self.step_cost;
        let proposals = proposer.propose(&slots, |k| step_cost.at(k));
        let offered: Vec<SeqId> = slots.iter().map(|s| s.id).collect();
        for (id, proposal) in offered.into_iter().zip(proposals) {
            let kind = proposal.and_then(|(tokens, kind)| {
                (self.scheduler.propose(id, tokens) > 0).then_some(kind)
            });
            if let Some(state) = self.seqs.get_mut(&id) {
                match kind {
                    Some(kind) => state.proposing(kind),
                    None => state.no_proposal(),
                }
            }
        }
        for id in without {
            if let Some(state) = self.seqs.get_mut(&id) {
                state.no_proposal();
            }
        }
    }

    /// Frees whatever the proposer keeps for a sequence that is gone.
    fn forget_proposals(&mut self, id: SeqId) {
        if let Some(p) = self.proposer.as_mut() {
            p.free(id);
        }
    }

    fn finish(&mut self, id: SeqId, reason: FinishReason) {
        self.scheduler.finish(id);
        self.forget_proposals(id);
        if let Some(state) = self.seqs.remove(&id) {
            state.complete(reason);
        }
    }
}

/// What one sequence drew in a step: its tokens to append, each with its log-probability
/// when asked for.
type Drawn = Vec<(u32, Option<TokenLogprob>)>;

/// Draws the tokens of every sequence of the step that asked for them, from its rows of
/// `logits` (`1 + num_spec` rows per such sequence, in batch order), in batch order. The
/// sequences are independent (each sampler is keyed by its own seed and position), so a step
/// with several draws them in parallel: serial, sampling 16 rows of a 49k vocabulary left
/// the other core idle for a noticeable share of a batched decode step.
fn draw_tokens(
    seqs: &mut HashMap<SeqId, SeqState>,
    batch: &[ScheduledSeq],
    logits: &mut [f32],
    vocab: usize,
) -> Vec<(SeqId, Drawn)> {
    use rayon::prelude::*;
    // (batch order, rows, proposals) of each sequence that samples.
    let mut rows_of: HashMap<SeqId, (usize, &mut [f32], &[u32])> = HashMap::new();
    let mut rest = logits;
    for (order, s) in batch.iter().filter(|s| s.sample).enumerate() {
        let n = (1 + s.num_spec) * vocab;
        if rest.len() < n {
            tracing::error!(seq = s.id, "the model returned fewer logits than asked for");
            break;
        }
        let (rows, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        let drafts = &s.tokens[s.tokens.len() - s.num_spec..];
        rows_of.insert(s.id, (order, rows, drafts));
    }
    let mut work: Vec<_> = seqs
        .iter_mut()
        .filter_map(|(&id, state)| {
            let (order, rows, drafts) = rows_of.remove(&id)?;
            Some((order, id, state, rows, drafts))
        })
        .collect();
    work.sort_unstable_by_key(|w| w.0);
    // One sequence runs inline on this (pool) thread: no hand-off.
    work.into_par_iter()
        .map(|(_, id, state, rows, drafts)| (id, state.draw(rows, drafts)))
        .collect()
}
