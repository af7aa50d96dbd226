//! The prefix-cache scope of a job. Each tenant's prompts are cached under its own salt, so
//! no tenant reuses, or learns through `cached_tokens` or latency, another tenant's cached
//! prompt blocks, not even for an identical prompt. The one exception is opt-in: the
//! operator's shared prefixes (`tidal runtime --queue --shared-prefix-file`), public system
//! prompts every tenant may send. The blocks of a prompt lying wholly inside the longest
//! shared prefix it starts with (compared token by token) are cached unsalted, for every
//! tenant to reuse; everything after them is salted.

use tidal_tokenizer::ChatMessage;

use super::config::WorkerError;
use crate::kv_cache::CacheScope;
use crate::server::prepare::encode_with_bos;
use crate::server::LoadedModel;

/// One public prefix the operator shares between tenants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedPrefix {
    /// Prompt text as the model reads it, tokenised like a prompt (for a chat model, the
    /// start of the rendered chat template, special tokens included).
    Text(String),
    /// A system message, rendered through the model's chat template as a conversation's
    /// first turn.
    System(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

impl SharedPrefix {
    /// Parses a shared-prefix file: a JSON array whose entries are a string (prompt text),
    /// `{"system": "..."}` (a system message) or `{"tokens": [...]}` (token ids).
    pub fn parse_list(json: &str) -> Result<Vec<SharedPrefix>, WorkerError> {
        let bad = |m: String| WorkerError::Config(format!("shared prefixes: {m}"));
        let entries: Vec<serde_json::Value> =
            serde_json::from_str(json).map_err(|e| bad(format!("not a JSON array: {e}")))?;
        entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                let what = || {
                    bad(format!(
                        "entry {i}: expected a string, {{\"system\": \"...\"}} or {{\"tokens\": [...]}}"
                    ))
                };
                match entry {
                    serde_json::Value::String(text) => Ok(SharedPrefix::Text(text)),
                    serde_json::Value::Object(map) if map.len() == 1 => {
                        if let Some(system) = map.get("system") {
                            let text = system.as_str().ok_or_else(what)?;
                            Ok(SharedPrefix::System(text.to_owned()))
                        } else if let Some(tokens) = map.get("tokens") {
                            serde_json::from_value(tokens.clone())
                                .map(SharedPrefix::Tokens)
                                .map_err(|_| what())
                        } else {
                            Err(what())
                        }
                    }
                    _ => Err(what()),
                }
            })
            .collect()
    }

    /// The prefix as `model` tokenises it.
    fn tokens(&self, model: &LoadedModel) -> Result<Vec<u32>, String> {
        let tokenizer = model.engine.tokenizer();
        match self {
            SharedPrefix::Text(text) => Ok(encode_with_bos(tokenizer, text)),
            SharedPrefix::System(text) => {
                let template = model
                    .chat_template
                    .as_ref()
                    .ok_or("the model has no chat template to render a system message with")?;
                let rendered = template
                    .render(&[ChatMessage::new("system", text.as_str())], false)
                    .map_err(|e| format!("cannot render the system message: {e}"))?;
                Ok(encode_with_bos(tokenizer, &rendered))
            }
            SharedPrefix::Tokens(ids) => {
                let vocab = model.engine.model_config().vocab_size;
                match ids.iter().find(|&&t| t as usize >= vocab) {
                    Some(bad) => Err(format!(
                        "token id {bad} is outside the vocabulary (size {vocab})"
                    )),
                    None => Ok(ids.clone()),
                }
            }
        }
    }
}

/// The shared prefixes of one worker, tokenised, longest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedPrefixes(Vec<Vec<u32>>);

impl SharedPrefixes {
    /// Tokenises `prefixes` for `model`.
    pub fn new(model: &LoadedModel, prefixes: &[SharedPrefix]) -> Result<Self, WorkerError> {
        let mut out = Vec::with_capacity(prefixes.len());
        for (i, p) in prefixes.iter().enumerate() {
            let tokens = p
                .tokens(model)
                .map_err(|m| WorkerError::Config(format!("shared prefix {i}: {m}")))?;
            if tokens.is_empty() {
                return Err(WorkerError::Config(format!(
                    "shared prefix {i} encodes to no tokens"
                )));
            }
            out.push(tokens);
        }
        Ok(Self::from_tokens(out))
    }

    fn from_tokens(mut prefixes: Vec<Vec<u32>>) -> Self {
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
        SharedPrefixes(prefixes)
    }

    /// The scope of `tenant`'s `prompt`: salted with the tenant, except for the longest
    /// shared prefix the prompt starts with.
    pub fn scope(&self, tenant: &str, prompt: &[u32]) -> CacheScope {
        let shared = self
            .0
            .iter()
            .find(|p| prompt.starts_with(p))
            .map_or(0, Vec::len);
        CacheScope::salted(tenant).with_shared_prefix(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_entry_forms_and_refuses_anything_else() {
        let got = SharedPrefix::parse_list(
            r#"["<|im_start|>system\nBe brief.<|im_end|>\n", {"system": "Be brief."}, {"tokens": [1, 2, 3]}]"#,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                SharedPrefix::Text("<|im_start|>system\nBe brief.<|im_end|>\n".into()),
                SharedPrefix::System("Be brief.".into()),
                SharedPrefix::Tokens(vec![1, 2, 3]),
            ]
        );
        assert_eq!(SharedPrefix::parse_list("[]").unwrap(), vec![]);
        for bad in [
            r#"{"system": "x"}"#,
            r#"[1]"#,
            r#"[{"system": 1}]"#,
            r#"[{"tokens": [-1]}]"#,
            r#"[{"system": "x", "tokens": [1]}]"#,
            r#"[{"user": "x"}]"#,
            "not json",
        ] {
            let e = SharedPrefix::parse_list(bad).unwrap_err().to_string();
            assert!(e.contains("shared prefixes"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_longest_shared_prefix_a_prompt_starts_with_is_unsalted() {
        let p = SharedPrefixes::from_tokens(vec![vec![1, 2], vec![1, 2, 3, 4], vec![9]]);
        let scope = |prompt: &[u32]| p.scope("acme", prompt);
        assert_eq!(scope(&[1, 2, 3, 4, 5]).shared_tokens(), 4);
        assert_eq!(scope(&[1, 2, 3, 5]).shared_tokens(), 2);
        assert_eq!(scope(&[9, 1, 2]).shared_tokens(), 1);
        assert_eq!(scope(&[2, 1]).shared_tokens(), 0);
        assert_eq!(
            scope(&[1]).shared_tokens(),
            0,
            "a prompt shorter than any prefix"
        );
        assert_eq!(scope(&[1, 2]).salt(), Some("acme"));
        let none = SharedPrefixes::default().scope("acme", &[1, 2, 3]);
        assert_eq!(none, CacheScope::salted("acme"));
    }
}
