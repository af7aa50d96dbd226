//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja the way Hugging Face `transformers` renders it (`trim_blocks`, `lstrip_blocks`,
//! Python string methods through minijinja-contrib's pycompat, `raise_exception`,
//! `strftime_now`, and `{% generation %}` blocks, which only mark assistant text for training
//! masks and render as their content).

use crate::error::ChatTemplateError;
use candle_core::quantized::gguf_file::{Content, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

const NAME: &str = "chat";

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with this role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The message a template passed to `raise_exception`, carried as the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Raised {}

/// A compiled chat template with the model's bos/eos token texts.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// Context variable carrying the render time for `strftime_now` (injected, not read inside).
const NOW_VAR: &str = "__tidal_now_unix";

#[derive(Serialize)]
struct Ctx<'a> {
    messages: &'a [ChatMessage],
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
    #[serde(rename = "__tidal_now_unix")]
    now_unix: i64,
}

/// Rewrites HF's `{% generation %}` / `{% endgeneration %}` tags (an assistant-mask extension
/// minijinja does not know) to `{% if true %}` / `{% endif %}`, keeping whitespace control.
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..close];
        let lead = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
        let trail = inner
            .strip_suffix(['-', '+'])
            .map_or("", |_| &inner[inner.len() - 1..]);
        let word = inner[lead.len()..inner.len() - trail.len()].trim();
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates insert.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(
                    minijinja::Error::new(ErrorKind::InvalidOperation, "raise_exception")
                        .with_source(Raised(msg)),
                )
            },
        );
        env.add_function(
            "strftime_now",
            |state: &minijinja::State, fmt: String| -> Result<String, minijinja::Error> {
                let now = state
                    .lookup(NOW_VAR)
                    .and_then(|v| i64::try_from(v).ok())
                    .ok_or_else(|| {
                        minijinja::Error::new(ErrorKind::InvalidOperation, "no render time")
                    })?;
                Ok(crate::strftime::format_utc(now, &fmt))
            },
        );
        env.add_template_owned(NAME, strip_generation_tags(source))
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        Ok(Self {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Reads `tokenizer.chat_template` and the bos/eos texts from GGUF metadata.
    pub fn from_gguf(ct: &Content) -> Result<Self, ChatTemplateError> {
        let source = match ct.metadata.get("tokenizer.chat_template") {
            Some(Value::String(s)) if !s.trim().is_empty() => s,
            _ => return Err(ChatTemplateError::Missing),
        };
        let token_text = |key: &str| -> String {
            let id = ct.metadata.get(key).and_then(crate::vocab::as_u64);
            match (id, ct.metadata.get("tokenizer.ggml.tokens")) {
                (Some(id), Some(Value::Array(tokens))) => match tokens.get(id as usize) {
                    Some(Value::String(s)) => s.clone(),
                    _ => String::new(),
                },
                _ => String::new(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        Self::new(source, bos, eos)
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins. `strftime_now` sees the current time.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.render_at(messages, add_generation_prompt, now)
    }

    /// [`ChatTemplate::render`] with the time `strftime_now` sees given as Unix seconds (UTC).
    pub fn render_at(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        now_unix: i64,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Render(e.to_string()))?;
        let ctx = Ctx {
            messages,
            add_generation_prompt,
            bos_token: &self.bos_token,
            eos_token: &self.eos_token,
            now_unix,
        };
        tmpl.render(minijinja::value::Serde(&ctx)).map_err(|e| {
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = src {
                if let Some(raised) = err.downcast_ref::<Raised>() {
                    return ChatTemplateError::Raised(raised.0.clone());
                }
                src = err.source();
            }
            ChatTemplateError::Render(e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_exception_message_is_returned() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}ok",
            "<s>",
            "</s>",
        )
        .unwrap();
        match t.render(&[ChatMessage::new("user", "hi")], true) {
            Err(ChatTemplateError::Raised(m)) => assert_eq!(m, "first message must be system"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            t.render(&[ChatMessage::new("system", "x")], true).unwrap(),
            "ok"
        );
    }

    #[test]
    fn python_string_methods_and_block_trimming_work() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {{ m.role.upper() }}:{{ m['content'].strip() }}{% if m.content.startswith(' ') %}!{% endif %}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi  ")], false)
            .unwrap();
        // trim_blocks eats the newline after `{% endif %}`, as in Jinja2.
        assert_eq!(out, "  USER:hi!");
    }

    #[test]
    fn strftime_now_uses_the_given_time() {
        let t = ChatTemplate::new("Today is {{ strftime_now('%d %b %Y') }}.", "", "").unwrap();
        assert_eq!(
            t.render_at(&[], false, 1_721_999_109).unwrap(),
            "Today is 26 Jul 2024."
        );
    }

    #[test]
    fn generation_blocks_render_their_content() {
        let src = "{% for m in messages %}[{%- generation -%} {{ m.content }} {%- endgeneration %}]{% endfor %}";
        assert_eq!(
            strip_generation_tags(src),
            "{% for m in messages %}[{%- if true -%} {{ m.content }} {%- endif %}]{% endfor %}"
        );
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("assistant", "x")], false)
                .unwrap(),
            "[x]"
        );
        // Other tags and unterminated text pass through unchanged.
        assert_eq!(
            strip_generation_tags("{% if a %}b{% endif %}{%"),
            "{% if a %}b{% endif %}{%"
        );
    }

    #[test]
    fn syntax_errors_are_typed() {
        assert!(matches!(
            ChatTemplate::new("{% if %}", "", ""),
            Err(ChatTemplateError::Syntax(_))
        ));
    }
}
