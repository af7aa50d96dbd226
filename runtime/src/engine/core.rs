use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use tidal_tokenizer::Tokenizer;
use tokio::sync::watch;

use super::executor::Executor;
use super::metrics::EngineMetrics;
use super::prefill_rate::{prefill_tokens, PrefillRate};
use super::request::FinishReason;
use super::sequence::{SeqState, StepOutcome};
use super::{Command, EngineConfig};
use crate::model::{ForwardBatch, ForwardSeq};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerStats, SeqId};

/// State owned by the engine thread.
pub(crate) struct EngineCore {
    executor: Executor,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    seqs: HashMap<SeqId, SeqState>,
    metrics: EngineMetrics,
    shared_stats: watch::Sender<SchedulerStats>,
    prefill_rate: PrefillRate,
}

impl EngineCore {
    pub fn new(
        executor: Executor,
        tokenizer: Arc<Tokenizer>,
        config: &EngineConfig,
        num_blocks: usize,
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
        }
    }

    /// Runs until every engine handle is dropped and no work is left.
    pub fn run(mut self, commands: mpsc::Receiver<Command>) {
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
            let stats = SchedulerStats {
                prefill_tokens_per_s: self.prefill_rate.tokens_per_s(),
                ..self.scheduler.stats()
            };
            self.metrics.publish(&stats);
            // Every step, so that a worker waiting for room wakes on engine progress.
            self.shared_stats.send_replace(stats);
        }
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
                    want_logits: s.sample,
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
        let sampled = sample_rows(&mut self.seqs, &batch.seqs, &mut logits, vocab);
        self.scheduler.append_sampled(&sampled);
        let now = Instant::now();
        for (id, token) in sampled {
            let Some(state) = self.seqs.get_mut(&id) else {
                continue;
            };
            self.metrics
                .token_generated(state.latency_since_last(now), state.is_first_token());
            match state.push_token(token, &self.tokenizer, context_length, now) {
                StepOutcome::Continue => {}
                StepOutcome::Finished(reason) => self.finish(id, reason),
            }
        }
        let elapsed = started.elapsed();
        let prefill = prefill_tokens(batch.seqs.iter().map(|s| (s.tokens.len(), s.sample)));
        self.prefill_rate.record(batch.num_tokens, prefill, elapsed);
        self.metrics.step(batch.num_tokens, elapsed);
    }

    fn finish(&mut self, id: SeqId, reason: FinishReason) {
        self.scheduler.finish(id);
        if let Some(state) = self.seqs.remove(&id) {
            state.complete(reason);
        }
    }
}

/// Samples the next token of every sequence of the step that asked for one, from its row of
/// `logits` (one row per such sequence, in batch order), in batch order. The sequences are
/// independent (each sampler is keyed by its own seed and position), so a step with several
/// samples them in parallel: serial, sampling 16 rows of a 49k vocabulary left the other
/// core idle for a noticeable share of a batched decode step.
fn sample_rows(
    seqs: &mut HashMap<SeqId, SeqState>,
    batch: &[crate::scheduler::ScheduledSeq],
    logits: &mut [f32],
    vocab: usize,
) -> Vec<(SeqId, u32)> {
    use rayon::prelude::*;
    let row_of: HashMap<SeqId, usize> = batch
        .iter()
        .filter(|s| s.sample)
        .enumerate()
        .map(|(row, s)| (s.id, row))
        .collect();
    let mut rows: Vec<Option<&mut [f32]>> = logits.chunks_exact_mut(vocab).map(Some).collect();
    let mut work: Vec<(usize, SeqId, &mut SeqState, &mut [f32])> = seqs
        .iter_mut()
        .filter_map(|(&id, state)| {
            let row = *row_of.get(&id)?;
            let logits = rows.get_mut(row)?.take()?;
            Some((row, id, state, logits))
        })
        .collect();
    work.sort_unstable_by_key(|w| w.0);
    // One row runs inline on this (pool) thread: no hand-off.
    work.into_par_iter()
        .map(|(_, id, state, row)| (id, state.sample(row)))
        .collect()
}
