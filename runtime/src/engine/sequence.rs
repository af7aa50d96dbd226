//! Per-request state on the engine thread: sampling inputs, incremental detokenisation,
//! stop handling, and the replay that lets a request resume where another worker stopped.

use std::time::{Duration, Instant};

use tidal_tokenizer::{StopMatcher, StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::request::{
    FinishReason, GenerationEvent, GenerationRequest, ResumeFrom, TokenLogprob, Usage,
};
use crate::sampling::Sampler;
use crate::speculative::{verify, Acceptance, ProposalKind};

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
    /// Recent acceptance of this sequence's proposals (speculative decoding).
    acceptance: Acceptance,
    /// What made the proposal this step verifies, whose estimate its outcome updates.
    proposal_kind: ProposalKind,
    /// The request's cap on proposed tokens per step (`None`: the engine's).
    speculative_cap: Option<usize>,
    /// Bytes of upcoming text the client already has (see [`TextSplice`]).
    splice: TextSplice,
}

/// Reconciles replayed text with what an earlier run delivered. Replaying the delivered
/// tokens normally reproduces exactly the delivered text (deltas end where the stream
/// decoder and stop matcher released text). Should the two differ, the difference is
/// corrected on the next emitted text: bytes the client already has are skipped, replayed
/// bytes it never got are sent first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct TextSplice {
    skip: usize,
    carry: String,
}

impl TextSplice {
    /// The splice for `replayed` text when the client already has `delivered` bytes.
    fn new(replayed: &str, delivered: usize) -> Self {
        if delivered >= replayed.len() {
            return Self {
                skip: delivered - replayed.len(),
                carry: String::new(),
            };
        }
        let mut from = delivered;
        while !replayed.is_char_boundary(from) {
            from += 1;
        }
        Self {
            skip: 0,
            carry: replayed[from..].to_owned(),
        }
    }

    /// The part of `text` (which follows the replayed text) the client must see next.
    fn apply(&mut self, text: String) -> String {
        let mut text = if self.carry.is_empty() {
            text
        } else {
            let mut t = std::mem::take(&mut self.carry);
            t.push_str(&text);
            t
        };
        if self.skip > 0 {
            let mut n = self.skip.min(text.len());
            while !text.is_char_boundary(n) {
                n += 1;
            }
            self.skip -= n.min(self.skip);
            text.drain(..n);
        }
        text
    }
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
            acceptance: Acceptance::new(),
            proposal_kind: ProposalKind::Draft,
            speculative_cap: request.num_speculative_tokens,
            splice: TextSplice::default(),
        }
    }

    /// Replays the tokens an earlier run delivered, as if this sequence had generated them
    /// (same stop and length rules, same detokeniser and stop-matcher state), and lines the
    /// upcoming text up with the `text_len` bytes already delivered. Returns why the
    /// sequence is already finished, if it is (the earlier run stopped right before sending
    /// `Done`); it must then be completed without being scheduled.
    pub fn resume(
        &mut self,
        from: &ResumeFrom,
        tokenizer: &Tokenizer,
        context_length: usize,
    ) -> Option<FinishReason> {
        let mut replayed = String::new();
        let mut finished = None;
        for &token in &from.token_ids {
            self.generated.push(token);
            let is_eog = !self.ignore_eos && tokenizer.is_eog(token);
            if is_eog || self.stop_token_ids.contains(&token) {
                finished = Some(FinishReason::Stop);
                break;
            }
            let piece = self.decoder.push(tokenizer, token);
            let out = self.stop.push(&piece);
            replayed.push_str(&out.text);
            if out.stopped {
                finished = Some(FinishReason::Stop);
                break;
            }
            if self.generated.len() >= self.max_tokens
                || self.prompt.len() + self.generated.len() >= context_length
            {
                finished = Some(FinishReason::Length);
                break;
            }
        }
        self.splice = TextSplice::new(&replayed, from.text_len);
        // The next token is token `generated.len()` of the request, wherever it runs.
        self.sampler.continue_at(self.generated.len());
        finished
    }

    /// What the scheduler must compute before sampling: the prompt, then every token
    /// generated so far (the resumed ones).
    pub fn scheduled_tokens(&self) -> Vec<u32> {
        let mut tokens = self.prompt.clone();
        tokens.extend_from_slice(&self.generated);
        tokens
    }

    /// Tokens still to generate.
    pub fn remaining_tokens(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated.len())
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

    /// Draws this step's tokens from its logits: one row for a plain decode, or one row per
    /// position of `drafts` plus one, to verify them ([`verify`]). Returns the tokens to
    /// append (the accepted drafts and the target's own token), each with its log-probability
    /// when the request asked for them. Nothing is appended yet: see [`Self::push_token`].
    pub fn draw(&mut self, logits: &mut [f32], drafts: &[u32]) -> Vec<(u32, Option<TokenLogprob>)> {
        let vocab = logits.len() / (drafts.len() + 1);
        let generated_before = self.generated.len();
        let want_logprobs = self.want_logprobs;
        let (sampler, prompt, history) = (&mut self.sampler, &self.prompt, &mut self.generated);
        let drawn = verify(drafts, |i| {
            let row = &mut logits[i * vocab..(i + 1) * vocab];
            let token = sampler.sample(row, prompt, history);
            // Penalties of the next position see this token as generated.
            history.push(token.id);
            let logprob = want_logprobs.then_some(TokenLogprob {
                token: token.id,
                logprob: token.logprob,
                top: token.top_logprobs,
            });
            (token.id, logprob)
        });
        self.generated.truncate(generated_before);
        if !drafts.is_empty() {
            self.acceptance
                .record(self.proposal_kind, drafts.len(), drawn.len() - 1);
        }
        drawn
    }

    /// This sequence's recent acceptance of proposals.
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Notes what made the proposal the next step verifies.
    pub fn proposing(&mut self, kind: ProposalKind) {
        self.proposal_kind = kind;
    }

    /// A step that verifies nothing for this sequence: its acceptance evidence fades.
    pub fn no_proposal(&mut self) {
        self.acceptance.idle();
    }

    /// Most tokens to propose for this sequence in one step, under the engine's `limit`.
    pub fn speculative_limit(&self, limit: usize) -> usize {
        self.speculative_cap.map_or(limit, |cap| cap.min(limit))
    }

    /// Tokens before the context window is full.
    pub fn context_room(&self, context_length: usize) -> usize {
        context_length.saturating_sub(self.prompt.len() + self.generated.len())
    }

    /// Whether no token has been produced yet.
    pub fn is_first_token(&self) -> bool {
        self.last_token_at.is_none()
    }

    /// Time since the previous token (or since arrival, for the first).
    pub fn latency_since_last(&self, now: Instant) -> Duration {
        now.duration_since(self.last_token_at.unwrap_or(self.arrived))
    }

    /// Appends a sampled token (with its log-probability, if asked for), streams any text it
    /// completes, and decides whether to stop.
    pub fn push_token(
        &mut self,
        token: u32,
        logprob: Option<TokenLogprob>,
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
        if let Some(lp) = logprob {
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
        let text = self.splice.apply(text);
        let _ = self.events.send(GenerationEvent::Delta {
            text,
            token_ids: std::mem::take(&mut self.pending_ids),
            logprobs: std::mem::take(&mut self.pending_logprobs),
        });
    }

    /// Flushes held-back text and sends `Done`.
    pub fn complete(mut self, reason: FinishReason) {
        let mut text = String::new();
        if reason == FinishReason::Length {
            let rest = self.decoder.finish();
            let out = self.stop.push(&rest);
            text = out.text;
            if !out.stopped {
                text.push_str(&self.stop.finish());
            }
        }
        let text = self.splice.apply(text);
        if !text.is_empty() || !self.pending_ids.is_empty() {
            // Already spliced: send as is.
            let _ = self.events.send(GenerationEvent::Delta {
                text,
                token_ids: std::mem::take(&mut self.pending_ids),
                logprobs: std::mem::take(&mut self.pending_logprobs),
            });
        }
        // The scheduler's "prompt" of a resumed sequence includes the resumed tokens; only
        // the real prompt's cache hits are the request's.
        let cached = self.cached_tokens.unwrap_or(0).min(self.prompt.len());
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            cached_tokens: cached,
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

#[cfg(test)]
mod tests {
    use super::TextSplice;

    #[test]
    fn splice_is_a_no_op_when_replay_matches_delivery() {
        let mut s = TextSplice::new("héllo", "héllo".len());
        assert_eq!(s, TextSplice::default());
        assert_eq!(s.apply("!".into()), "!");
    }

    #[test]
    fn splice_sends_replayed_text_the_client_lacks_first() {
        let mut s = TextSplice::new("abcdé", 3);
        assert_eq!(s.apply("f".into()), "déf");
        assert_eq!(s.apply("g".into()), "g");
        // A delivery that ends inside a character resumes at the next whole one.
        let mut s = TextSplice::new("aé", 2);
        assert_eq!(s.apply("x".into()), "x");
    }

    #[test]
    fn splice_skips_text_the_client_already_has() {
        // E.g. an earlier run flushed its held-back tail, then died before `Done`.
        let mut s = TextSplice::new("ab", 5);
        assert_eq!(s.apply("c".into()), "");
        assert_eq!(s.apply("déf".into()), "f");
        assert_eq!(s.apply("g".into()), "g");
    }
}
