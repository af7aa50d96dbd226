//! Protocol request → validated, tokenised [`GenerationRequest`].

use tidal_protocol::chat::ChatCompletionRequest;
use tidal_protocol::completion::{CompletionRequest, Prompt};
use tidal_protocol::params::Sampling;
use tidal_protocol::ApiError;
use tidal_tokenizer::{ChatMessage, ChatTemplateError, Tokenizer};

use super::LoadedModel;
use crate::engine::GenerationRequest;
use crate::kv_cache::CacheScope;
use crate::sampling::SamplingParams;

/// How the response is shaped.
#[derive(Debug, Clone, Copy)]
pub struct ResponseShape {
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
}

/// A request ready for the engine, plus what the response needs.
pub struct Prepared {
    pub request: GenerationRequest,
    pub shape: ResponseShape,
}

/// Validates a chat request and renders its messages through the model's chat template.
pub fn chat(model: &LoadedModel, req: &ChatCompletionRequest) -> Result<Prepared, ApiError> {
    let messages = req.text_messages()?;
    let max_tokens = req.max_tokens()?;
    let top_logprobs = req.top_logprobs()?;
    let sampling = req.sampling.validate(top_logprobs)?;
    let template = model.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template (tokenizer.chat_template); use /v1/completions with a prompt",
        )
    })?;
    let messages: Vec<ChatMessage> = messages
        .into_iter()
        .map(|m| ChatMessage::new(m.role, m.content))
        .collect();
    let text = template.render(&messages, true).map_err(|e| match e {
        ChatTemplateError::Raised(message) => ApiError::invalid("messages", message),
        other => ApiError::invalid(
            "messages",
            format!("cannot apply the chat template: {other}"),
        ),
    })?;
    let prompt = encode_with_bos(model.engine.tokenizer(), &text);
    finish(
        model,
        prompt,
        max_tokens,
        sampling,
        req.sampling.stream,
        req.sampling.include_usage(),
    )
}

/// Validates a text completion request and tokenises its prompt.
pub fn completion(model: &LoadedModel, req: &CompletionRequest) -> Result<Prepared, ApiError> {
    req.check_unsupported()?;
    let max_tokens = req.max_tokens()?;
    let sampling = req.sampling.validate(req.top_logprobs()?)?;
    let tokenizer = model.engine.tokenizer();
    let prompt = match req.prompt()? {
        Prompt::Text(text) => encode_with_bos(tokenizer, &text),
        Prompt::Tokens(ids) => {
            let vocab = model.engine.model_config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary (size {vocab})"),
                ));
            }
            ids
        }
    };
    finish(
        model,
        prompt,
        Some(max_tokens),
        sampling,
        req.sampling.stream,
        req.sampling.include_usage(),
    )
}

/// Adds the model's BOS token when it wants one and the text did not already bring it (chat
/// templates such as Llama 3's write `{{ bos_token }}` themselves).
pub(crate) fn encode_with_bos(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let mut ids = tokenizer.encode(text, false);
    if let Some(bos) = tokenizer.prompt_bos() {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    ids
}

fn finish(
    model: &LoadedModel,
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    sampling: Sampling,
    stream: bool,
    include_usage: bool,
) -> Result<Prepared, ApiError> {
    let context = model.engine.model_config().context_length;
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    // Without max_tokens a reply may run to the end of the context window, or of the KV
    // cache when that is smaller.
    let room = context.min(model.engine.capacity_tokens());
    let max_tokens = match max_tokens {
        Some(n) => n,
        None if prompt.len() < room => room - prompt.len(),
        None => 1,
    };
    if prompt.len() + max_tokens > context {
        return Err(ApiError::context_length(context, prompt.len(), max_tokens));
    }
    let logprobs = sampling.top_logprobs.is_some();
    let params = SamplingParams {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        min_p: sampling.min_p,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        repetition_penalty: sampling.repetition_penalty,
        seed: sampling.seed,
        top_logprobs: sampling.top_logprobs,
    };
    params
        .validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Prepared {
        request: GenerationRequest {
            prompt,
            max_tokens,
            sampling: params,
            stop: sampling.stop,
            stop_token_ids: sampling.stop_token_ids,
            ignore_eos: sampling.ignore_eos,
            resume: None,
            // The direct server has no tenants: one unsalted scope; the queue worker sets
            // the job's.
            cache_scope: CacheScope::unsalted(),
            num_speculative_tokens: sampling.num_speculative_tokens,
        },
        shape: ResponseShape {
            stream,
            include_usage,
            logprobs,
        },
    })
}
