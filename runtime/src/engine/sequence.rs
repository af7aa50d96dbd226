use std::time::{Duration, Instant};

use tidal_tokenizer::{StopMatcher, StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::request::{FinishReason, GenerationEvent, GenerationRequest, TokenLogprob, Usage};
use crate::sampling::Sampler;

/// What a new token did to its sequence.
pub(crate) enum StepOutcome {
    Continue,
    Finished(FinishReason),
}

/// Per-request state on the engine thread: sampler, text assembly and the event channel.
pub(crate) struct SeqState {
    events: UnboundedSender<GenerationEvent>,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    max_tokens: usize,
    stop_token_ids: Vec<u32>,
    ignore_eos: bool,
    want_logprobs: bool,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    cached_tokens: Option<usize>,
    last_token_at: Option<Instant>,
    arrived: Instant,
    pending_ids: Vec<u32>,
    pending_logprobs: Vec<TokenLogprob>,
    last_logprob: Option<TokenLogprob>,
}

impl SeqState {
    pub fn new(request: GenerationRequest, events: UnboundedSender<GenerationEvent>) -> Self {
        Self {
            events,
            want_logprobs: request.sampling.top_logprobs.is_some(),
            sampler: Sampler::new(request.sampling.clone()),
            decoder: StreamDecoder::new(),
            stop: StopMatcher::new(request.stop.clone()),
            prompt: request.prompt,
            generated: Vec::new(),
            max_tokens: request.max_tokens,
            stop_token_ids: request.stop_token_ids,
            ignore_eos: request.ignore_eos,
            cached_tokens: None,
            last_token_at: None,
            arrived: Instant::now(),
            pending_ids: Vec::new(),
            pending_logprobs: Vec::new(),
            last_logprob: None,
        }
    }

    /// The client dropped its receiver.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Records the prefix-cache reuse of the first admission (a later recompute after
    /// preemption is the platform's cost, not the tenant's).
    pub fn note_cached_tokens(&mut self, cached: usize) {
        self.cached_tokens.get_or_insert(cached);
    }

    /// Samples the next token from this sequence's logits row.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        let token = self.sampler.sample(logits, &self.prompt, &self.generated);
        self.last_logprob = self.want_logprobs.then(|| TokenLogprob {
            token: token.id,
            logprob: token.logprob,
            top: token.top_logprobs.clone(),
        });
        token.id
    }

    /// Whether no token has been produced yet.
    pub fn is_first_token(&self) -> bool {
        self.last_token_at.is_none()
    }

    /// Time since the previous token (or since arrival, for the first).
    pub fn latency_since_last(&self, now: Instant) -> Duration {
        now.duration_since(self.last_token_at.unwrap_or(self.arrived))
    }

    /// Appends a sampled token, streams any text it completes, and decides whether to stop.
    pub fn push_token(
        &mut self,
        token: u32,
        tokenizer: &Tokenizer,
        context_length: usize,
        now: Instant,
    ) -> StepOutcome {
        self.last_token_at = Some(now);
        self.generated.push(token);
        let is_eog = !self.ignore_eos && tokenizer.is_eog(token);
        if is_eog || self.stop_token_ids.contains(&token) {
            // The stop token itself is never shown to the client.
            return StepOutcome::Finished(FinishReason::Stop);
        }
        self.pending_ids.push(token);
        if let Some(lp) = self.last_logprob.take() {
            self.pending_logprobs.push(lp);
        }
        let piece = self.decoder.push(tokenizer, token);
        let out = self.stop.push(&piece);
        let (text, stopped) = (out.text, out.stopped);
        if stopped {
            self.emit(text);
            return StepOutcome::Finished(FinishReason::Stop);
        }
        if !text.is_empty() || (self.want_logprobs && !self.pending_ids.is_empty()) {
            self.emit(text);
        }
        if self.generated.len() >= self.max_tokens
            || self.prompt.len() + self.generated.len() >= context_length
        {
            return StepOutcome::Finished(FinishReason::Length);
        }
        StepOutcome::Continue
    }

    fn emit(&mut self, text: String) {
        let _ = self.events.send(GenerationEvent::Delta {
            text,
            token_ids: std::mem::take(&mut self.pending_ids),
            logprobs: std::mem::take(&mut self.pending_logprobs),
        });
    }

    /// Flushes held-back text and sends `Done`.
    pub fn complete(mut self, reason: FinishReason) {
        if reason == FinishReason::Length {
            let rest = self.decoder.finish();
            let out = self.stop.push(&rest);
            let mut text = out.text;
            if !out.stopped {
                text.push_str(&self.stop.finish());
            }
            if !text.is_empty() || !self.pending_ids.is_empty() {
                self.emit(text);
            }
        } else if !self.pending_ids.is_empty() {
            self.emit(String::new());
        }
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            cached_tokens: self.cached_tokens.unwrap_or(0),
            completion_tokens: self.generated.len(),
        };
        let _ = self.events.send(GenerationEvent::Done {
            finish_reason: reason,
            usage,
        });
    }

    /// Ends the request with an error event.
    pub fn fail(self, message: String) {
        let _ = self.events.send(GenerationEvent::Error { message });
    }
}
