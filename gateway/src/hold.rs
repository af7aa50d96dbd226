//! The budget hold of a request (see `tidal_billing::ledger::Ledger::hold_budget`): its worst
//! case at admission, and what it may still bill when it ends.
//!
//! The gateway has no tokenizer, so the prompt's worst case is counted in bytes: every token
//! of the tokenizers the runtime loads (byte-level BPE, SentencePiece with byte fallback)
//! covers at least one byte of the text, except the special tokens and the system prompt a
//! chat template adds and SentencePiece's leading-space marker, which [`TEMPLATE_TOKENS`]
//! and [`MESSAGE_TOKENS`] allow for. The completion's worst case is `max_tokens` (the context
//! length when a chat request leaves it out). Both are capped at the context length, which
//! no request can pass.
//!
//! [`place`] writes the hold at admission; [`settle`] lowers it when the request ends
//! (from [`crate::relay`]), in the background.

use std::sync::Arc;

use tidal_billing::money::cost_picos;
use tidal_billing::price::Prices;
use tidal_billing::{HoldOutcome, HoldRequest};
use tidal_protocol::chat::MessageContent;
use tidal_protocol::completion::PromptField;
use tidal_protocol::job::JobRequest;
use tidal_protocol::ApiError;
use tidal_queue::ModelRecord;
use uuid::Uuid;

use crate::breaker::LedgerFault;
use crate::error::{ledger_unavailable, Reject};
use crate::gateway::Shared;
use crate::metrics;

/// Tokens a chat template may add to a conversation (its default system prompt, BOS).
pub(crate) const TEMPLATE_TOKENS: u64 = 256;
/// Tokens a chat template may add around each message (role headers, separators).
pub(crate) const MESSAGE_TOKENS: u64 = 16;

/// What a request may bill, and at which prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldTerms {
    /// The model's prices when the request was admitted.
    pub prices: Prices,
    /// Most prompt tokens it can bill.
    pub prompt_tokens: u64,
    /// Most completion tokens it can bill.
    pub completion_tokens: u64,
}

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Bytes of text (or ids) in the prompt of `req`, and how many messages carry it.
fn prompt_size(req: &JobRequest) -> (u64, u64) {
    match req {
        JobRequest::Chat(r) => {
            let bytes = r
                .messages
                .iter()
                .map(|m| match &m.content {
                    None => 0,
                    Some(MessageContent::Text(t)) => t.len() as u64,
                    Some(MessageContent::Parts(parts)) => parts
                        .iter()
                        .map(|p| p.text.as_ref().map_or(0, |t| t.len() as u64))
                        .sum(),
                })
                .sum();
            (bytes, r.messages.len() as u64)
        }
        JobRequest::Completion(r) => {
            let n = match &r.prompt {
                PromptField::Text(t) => t.len(),
                PromptField::Tokens(ids) => ids.len(),
                PromptField::Texts(ts) => ts.iter().map(String::len).sum(),
                PromptField::TokenLists(ls) => ls.iter().map(Vec::len).sum(),
            };
            (n as u64, 1)
        }
    }
}

impl HoldTerms {
    /// The worst case of a validated request `req` on the model of `record`.
    pub fn worst_case(req: &JobRequest, record: &ModelRecord) -> HoldTerms {
        let context = u64::from(record.context_length);
        let (bytes, messages) = prompt_size(req);
        let prompt = bytes
            .saturating_add(TEMPLATE_TOKENS)
            .saturating_add(messages.saturating_mul(MESSAGE_TOKENS));
        let completion = match req {
            JobRequest::Chat(r) => r.max_tokens().ok().flatten(),
            JobRequest::Completion(r) => r.max_tokens().ok(),
        }
        .map_or(context, |m| m as u64);
        HoldTerms {
            prices: Prices::from(&record.prices),
            prompt_tokens: prompt.min(context),
            completion_tokens: completion.min(context),
        }
    }

    /// Picos of `prompt` prompt tokens (at the dearer of the input prices: the cache may
    /// miss) and `completion` completion tokens.
    fn bound_pico(&self, prompt: u64, completion: u64) -> i128 {
        let input = self.prices.input_per_m.max(self.prices.cached_input_per_m);
        cost_picos(tokens(prompt), input) + cost_picos(tokens(completion), self.prices.output_per_m)
    }

    /// The most the request can bill: the hold placed at admission.
    pub fn worst_case_pico(&self) -> i128 {
        self.bound_pico(self.prompt_tokens, self.completion_tokens)
    }

    /// The most it can still bill once it stopped after `delivered` completion tokens
    /// without a final usage (cancelled, or failed mid-stream).
    pub fn stopped_pico(&self, delivered: u64) -> i128 {
        self.bound_pico(self.prompt_tokens, delivered.min(self.completion_tokens))
    }

    /// What a request that ended with `usage` bills, exactly as the ledger prices it.
    pub fn final_pico(&self, usage: &tidal_queue::Usage) -> i128 {
        let cached = usage.cached_prompt_tokens.min(usage.prompt_tokens);
        cost_picos(
            tokens(usage.prompt_tokens - cached),
            self.prices.input_per_m,
        ) + cost_picos(tokens(cached), self.prices.cached_input_per_m)
            + cost_picos(tokens(usage.completion_tokens), self.prices.output_per_m)
    }
}

/// Holds the worst case of request `id` against `tenant`'s budget: 402 when it does not fit
/// beside what is spent and held, 503 when the ledger cannot be asked (a budget is never
/// checked from a cache: money first).
pub(crate) async fn place(
    shared: &Arc<Shared>,
    id: Uuid,
    tenant: &str,
    terms: &HoldTerms,
) -> Result<(), Reject> {
    let amount_pico = i64::try_from(terms.worst_case_pico()).map_err(|_| {
        ApiError::invalid(
            "max_tokens",
            "the request's largest possible cost does not fit in the ledger; lower `max_tokens`",
        )
    })?;
    let now = shared.now_utc();
    let expires_at = now
        + chrono::Duration::from_std(shared.config.hold_ttl).unwrap_or(chrono::Duration::hours(1));
    let request_id = id.to_string();
    let hold = HoldRequest {
        request_id: &request_id,
        tenant,
        amount_pico,
        expires_at,
    };
    let outcome = match shared
        .ask_ledger(shared.ledger.hold_budget(&hold, now))
        .await
    {
        Ok(o) => o,
        Err(LedgerFault::Unavailable) => {
            // A hold written just before the timeout would count until it expires.
            release(shared, id);
            return Err(ledger_unavailable());
        }
        Err(LedgerFault::Failed(e)) => return Err(e.into()),
    };
    match outcome {
        HoldOutcome::Unlimited | HoldOutcome::Held { .. } => Ok(()),
        HoldOutcome::Refused {
            budget_micros,
            committed_micros,
            asked_micros,
        } => {
            metrics::budget_refused();
            let free = budget_micros.saturating_sub(committed_micros).max(0);
            Err(ApiError::payment_required(format!(
                "This request could cost up to {asked_micros} micros (its prompt and `max_tokens` at the model's prices), and {free} of your monthly budget of {budget_micros} micros are neither spent nor held by requests in flight. Lower `max_tokens`, wait for running requests to finish, or raise the budget."
            ))
            .into())
        }
    }
}

/// Drops request `id`'s budget hold in the background (it will bill nothing).
pub(crate) fn release(shared: &Arc<Shared>, id: Uuid) {
    settle(shared, id, 0, false);
}

/// Lowers request `id`'s budget hold to `cost_pico` in the background; `stopped`: the
/// request was stopped without a final usage (cancelled, failed mid-stream), so its worker
/// bills it within seconds and the hold's upper bound need only count for
/// `stopped_hold_ttl`. A failure leaves the hold until its expiry (the safe side).
pub(crate) fn settle(shared: &Arc<Shared>, id: Uuid, cost_pico: i128, stopped: bool) {
    let shared = shared.clone();
    let cost = i64::try_from(cost_pico.max(0)).unwrap_or(i64::MAX);
    let expires_at = stopped.then(|| {
        shared.now_utc()
            + chrono::Duration::from_std(shared.config.stopped_hold_ttl)
                .unwrap_or(chrono::Duration::minutes(2))
    });
    tokio::spawn(async move {
        let id_text = id.to_string();
        if let Err(e) = shared.ledger.settle_hold(&id_text, cost, expires_at).await {
            tracing::warn!(error = %e, %id, "settling a budget hold failed; it counts until it expires");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_queue::{ModelState, Usage};

    fn record(context_length: u32) -> ModelRecord {
        ModelRecord {
            id: "m".into(),
            state: ModelState::Ready,
            prices: tidal_queue::Prices {
                currency: "USD".into(),
                input_per_mtok_micros: 2_000_000,
                cached_input_per_mtok_micros: 500_000,
                output_per_mtok_micros: 8_000_000,
            },
            max_queue_wait_ms: 0,
            backlog_cap: 0,
            context_length,
        }
    }

    fn req(v: serde_json::Value) -> JobRequest {
        JobRequest::from_body(&v).unwrap()
    }

    #[test]
    fn chat_counts_bytes_messages_and_max_tokens() {
        let r = req(serde_json::json!({"kind": "chat", "request": {
            "model": "m", "max_tokens": 50,
            "messages": [{"role": "system", "content": "abcd"},
                         {"role": "user", "content": [{"type": "text", "text": "héllo"}]}]}}));
        let t = HoldTerms::worst_case(&r, &record(8192));
        assert_eq!(
            t.prompt_tokens,
            4 + 6 + TEMPLATE_TOKENS + 2 * MESSAGE_TOKENS
        );
        assert_eq!(t.completion_tokens, 50);
        // 2 micros a prompt token, 8 a completion token: a pico per micro-per-million.
        assert_eq!(
            t.worst_case_pico(),
            i128::from(t.prompt_tokens) * 2_000_000 + 50 * 8_000_000
        );
    }

    #[test]
    fn missing_max_tokens_and_long_prompts_are_capped_by_the_context() {
        let long = "x".repeat(10_000);
        let r = req(serde_json::json!({"kind": "chat", "request": {
            "model": "m", "messages": [{"role": "user", "content": long}]}}));
        let t = HoldTerms::worst_case(&r, &record(2048));
        assert_eq!((t.prompt_tokens, t.completion_tokens), (2048, 2048));
        let r = req(serde_json::json!({"kind": "completion", "request": {
            "model": "m", "prompt": [1, 2, 3]}}));
        let t = HoldTerms::worst_case(&r, &record(2048));
        assert_eq!(t.prompt_tokens, 3 + TEMPLATE_TOKENS + MESSAGE_TOKENS);
        assert_eq!(t.completion_tokens, 16, "OpenAI's default for completions");
    }

    #[test]
    fn a_stop_bills_at_most_the_delivered_tokens_and_the_end_bills_exactly() {
        let r = req(serde_json::json!({"kind": "completion", "request": {
            "model": "m", "prompt": "hi", "max_tokens": 100}}));
        let t = HoldTerms::worst_case(&r, &record(4096));
        let prompt = i128::from(t.prompt_tokens) * 2_000_000;
        assert_eq!(t.stopped_pico(0), prompt);
        assert_eq!(t.stopped_pico(7), prompt + 7 * 8_000_000);
        assert_eq!(
            t.stopped_pico(1000),
            t.worst_case_pico(),
            "never above the hold"
        );
        let u = Usage {
            prompt_tokens: 10,
            cached_prompt_tokens: 4,
            completion_tokens: 3,
        };
        assert_eq!(
            t.final_pico(&u),
            6 * 2_000_000 + 4 * 500_000 + 3 * 8_000_000
        );
        // Cached above input (a worker bug) still bills no negative input.
        let odd = Usage {
            prompt_tokens: 2,
            cached_prompt_tokens: 5,
            completion_tokens: 0,
        };
        assert_eq!(t.final_pico(&odd), 2 * 500_000);
        assert!(t.final_pico(&u) <= t.worst_case_pico());
    }
}
