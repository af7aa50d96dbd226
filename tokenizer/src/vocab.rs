//! The vocabulary read from GGUF `tokenizer.ggml.*` metadata.
//!
//! Follows llama.cpp's `llama_vocab::impl::load`: per-family defaults for the special ids and
//! flags, overridden by the metadata; token types become attributes; the end-of-generation set
//! is built from eos/eot/eom and the well-known end-of-turn token texts (`llama_vocab_is_eog`).

use crate::error::TokenizerError;
use crate::pretokenize::PreTokenizer;
use ahash::AHashMap;
use candle_core::quantized::gguf_file::{Content, Value};
use std::collections::BTreeSet;

/// Token attributes (llama.cpp's `llama_token_attr`, from the GGUF token type).
pub(crate) mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const CONTROL: u8 = 4;
    pub const USER_DEFINED: u8 = 8;
    pub const UNUSED: u8 = 16;
    pub const BYTE: u8 = 32;
}

/// The tokenizer family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`tokenizer.ggml.model = gpt2`).
    Bpe(PreTokenizer),
    /// SentencePiece with byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
}

/// Token texts that end a turn, from llama.cpp's EOG detection.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// Token texts llama.cpp takes as the end-of-turn id when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// A loaded vocabulary.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub tokens: Vec<String>,
    pub token_to_id: AHashMap<String, u32>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u8>,
    pub merges: Vec<(String, String)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Control, user-defined and unknown tokens, longest text first (`cache_special_tokens`).
    pub specials: Vec<u32>,
}

fn get<'a>(ct: &'a Content, key: &'static str) -> Option<&'a Value> {
    ct.metadata.get(key)
}

/// Any unsigned or non-negative integer value.
pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(u64::from(*x)),
        Value::U16(x) => Some(u64::from(*x)),
        Value::U32(x) => Some(u64::from(*x)),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::I8(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::I32(x) => Some(i64::from(*x)),
        Value::I64(x) => Some(*x),
        other => as_u64(other).and_then(|x| i64::try_from(x).ok()),
    }
}

fn array<'a>(ct: &'a Content, key: &'static str) -> Result<Option<&'a [Value]>, TokenizerError> {
    match get(ct, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(TokenizerError::BadMetadata {
            key,
            reason: "not an array".into(),
        }),
    }
}

fn string_array(ct: &Content, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(a) = array(ct, key)? else {
        return Ok(None);
    };
    a.iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(TokenizerError::BadMetadata {
                key,
                reason: "array element is not a string".into(),
            }),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn flag(ct: &Content, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match get(ct, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => as_u64(v)
            .map(|x| Some(x != 0))
            .ok_or(TokenizerError::BadMetadata {
                key,
                reason: "not a boolean".into(),
            }),
    }
}

/// A special id from the metadata: out-of-range ids are ignored as in llama.cpp.
fn special_id(ct: &Content, key: &'static str, default: Option<u32>, n: usize) -> Option<u32> {
    let default = default.filter(|&d| (d as usize) < n);
    match get(ct, key).and_then(as_u64) {
        Some(id) if (id as usize) < n => u32::try_from(id).ok(),
        Some(id) => {
            tracing::warn!(
                key,
                id,
                "special token id out of vocabulary range, using default"
            );
            default
        }
        None => default,
    }
}

impl Vocab {
    /// Reads the vocabulary from GGUF metadata.
    pub fn from_gguf(ct: &Content) -> Result<Self, TokenizerError> {
        let model = match get(ct, "tokenizer.ggml.model") {
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.model",
                    reason: "not a string".into(),
                })
            }
            None => return Err(TokenizerError::MissingKey("tokenizer.ggml.model")),
        };
        let pre_name = match get(ct, "tokenizer.ggml.pre") {
            Some(Value::String(s)) => s.as_str(),
            _ => "",
        };
        let tokens = string_array(ct, "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::BadMetadata {
                key: "tokenizer.ggml.tokens",
                reason: format!("{n} tokens"),
            });
        }

        // Family defaults (llama.cpp): BPE bos=eos=11; SPM bos=1, eos=2, unk=0, add_bos, prefix space.
        let (kind, mut add_bos, mut add_space_prefix, bos_d, eos_d, unk_d) = match model {
            "gpt2" => {
                let pre = PreTokenizer::from_name(pre_name)
                    .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
                let add_bos = matches!(pre, PreTokenizer::Llama3);
                (
                    VocabKind::Bpe(pre),
                    add_bos,
                    false,
                    Some(11),
                    Some(11),
                    None,
                )
            }
            "llama" => (VocabKind::Spm, true, true, Some(1), Some(2), Some(0)),
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        if let Some(b) = flag(ct, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }

        let merges = if matches!(kind, VocabKind::Bpe(_)) {
            string_array(ct, "tokenizer.ggml.merges")?
                .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?
                .into_iter()
                .map(|m| {
                    // llama.cpp splits at the first space after the first byte.
                    // (A space is one byte, so both halves stay on char boundaries.)
                    match m.bytes().skip(1).position(|b| b == b' ') {
                        Some(p) => (m[..p + 1].to_string(), m[p + 2..].to_string()),
                        None => (String::new(), String::new()),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };

        let scores = match array(ct, "tokenizer.ggml.scores")? {
            None => vec![0.0; n],
            Some(a) if a.len() >= n => a
                .iter()
                .take(n)
                .map(|v| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    other => as_i64(other)
                        .map(|x| x as f32)
                        .ok_or(TokenizerError::BadMetadata {
                            key: "tokenizer.ggml.scores",
                            reason: "not a number".into(),
                        }),
                })
                .collect::<Result<_, _>>()?,
            Some(a) => {
                return Err(TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.scores",
                    reason: format!("{} scores for {n} tokens", a.len()),
                })
            }
        };
        let mut attrs = match array(ct, "tokenizer.ggml.token_type")? {
            None => vec![attr::NORMAL; n],
            Some(a) if a.len() >= n => a
                .iter()
                .take(n)
                .map(|v| match as_i64(v) {
                    Some(1) => attr::NORMAL,
                    Some(2) => attr::UNKNOWN,
                    Some(3) => attr::CONTROL,
                    Some(4) => attr::USER_DEFINED,
                    Some(5) => attr::UNUSED,
                    Some(6) => attr::BYTE,
                    _ => 0,
                })
                .collect(),
            Some(a) => {
                return Err(TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.token_type",
                    reason: format!("{} types for {n} tokens", a.len()),
                })
            }
        };

        let tokens: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t
                }
            })
            .collect();
        let mut token_to_id = AHashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // Last one wins on duplicate texts, as in llama.cpp's `token_to_id[word] = i`.
            token_to_id.insert(t.clone(), i as u32);
        }

        let bos = special_id(ct, "tokenizer.ggml.bos_token_id", bos_d, n);
        let eos = special_id(ct, "tokenizer.ggml.eos_token_id", eos_d, n);
        let mut eot = special_id(ct, "tokenizer.ggml.eot_token_id", None, n);
        let eom = special_id(ct, "tokenizer.ggml.eom_token_id", None, n);
        let unk = special_id(ct, "tokenizer.ggml.unknown_token_id", unk_d, n);
        let pad = special_id(ct, "tokenizer.ggml.padding_token_id", None, n);
        if let Some(b) = flag(ct, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        let add_eos = flag(ct, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

        if eot.is_none() {
            eot = EOT_TEXTS.iter().find_map(|t| token_to_id.get(*t).copied());
        }
        let mut eog: BTreeSet<u32> = EOG_TEXTS
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied())
            .collect();
        for key in [
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
        ] {
            eog.extend(special_id(ct, key, None, n));
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        // o200k_harmony: `<|end|>` is not an end of generation when `<|return|>`/`<|call|>` exist.
        let has = |t: &str| token_to_id.get(t).is_some_and(|id| eog.contains(id));
        if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
            if let Some(end) = token_to_id.get("<|end|>") {
                eog.remove(end);
            }
        }
        // llama.cpp marks every end-of-generation token as control.
        for &id in &eog {
            attrs[id as usize] |= attr::CONTROL;
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        Ok(Self {
            kind,
            tokens,
            token_to_id,
            scores,
            attrs,
            merges,
            bos,
            eos,
            eot,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            specials,
        })
    }
}

/// Builds in-memory GGUF metadata for unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
    use std::collections::HashMap;

    /// A GGUF header with a tokenizer: `tokens` are (text, type); `extra` adds keys.
    pub fn content(
        model: &str,
        pre: Option<&str>,
        tokens: &[(&str, i32)],
        scores: Option<&[f32]>,
        merges: &[&str],
        extra: Vec<(&str, Value)>,
    ) -> Content {
        let mut m: HashMap<String, Value> = HashMap::new();
        m.insert("tokenizer.ggml.model".into(), Value::String(model.into()));
        if let Some(p) = pre {
            m.insert("tokenizer.ggml.pre".into(), Value::String(p.into()));
        }
        let strs = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        m.insert(
            "tokenizer.ggml.tokens".into(),
            strs(tokens.iter().map(|t| t.0.to_string()).collect()),
        );
        m.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(tokens.iter().map(|t| Value::I32(t.1)).collect()),
        );
        if let Some(s) = scores {
            m.insert(
                "tokenizer.ggml.scores".into(),
                Value::Array(s.iter().map(|&x| Value::F32(x)).collect()),
            );
        }
        if !merges.is_empty() {
            m.insert(
                "tokenizer.ggml.merges".into(),
                strs(merges.iter().map(|s| s.to_string()).collect()),
            );
        }
        for (k, v) in extra {
            m.insert(k.into(), v);
        }
        Content {
            magic: VersionedMagic::GgufV3,
            metadata: m,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::content;
    use super::*;

    #[test]
    fn unknown_model_and_pre_tokenizer_are_named_in_errors() {
        let c = content("t5", None, &[("a", 1)], None, &[], vec![]);
        let e = Vocab::from_gguf(&c).unwrap_err();
        assert!(matches!(&e, TokenizerError::UnsupportedModel(m) if m == "t5"));
        assert!(e.to_string().contains("`t5`"));
        let c = content(
            "gpt2",
            Some("chatglm-bpe"),
            &[("a", 1)],
            None,
            &["a a"],
            vec![],
        );
        let e = Vocab::from_gguf(&c).unwrap_err();
        assert!(e.to_string().contains("`chatglm-bpe`"), "{e}");
    }

    #[test]
    fn missing_keys_are_reported() {
        let mut c = content("gpt2", Some("gpt-2"), &[("a", 1)], None, &[], vec![]);
        assert!(matches!(
            Vocab::from_gguf(&c),
            Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))
        ));
        c.metadata.remove("tokenizer.ggml.tokens");
        assert!(matches!(
            Vocab::from_gguf(&c),
            Err(TokenizerError::MissingKey("tokenizer.ggml.tokens"))
        ));
        c.metadata.remove("tokenizer.ggml.model");
        assert!(matches!(
            Vocab::from_gguf(&c),
            Err(TokenizerError::MissingKey("tokenizer.ggml.model"))
        ));
    }

    #[test]
    fn family_defaults_and_metadata_overrides() {
        let toks = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("a", 1)];
        let v = Vocab::from_gguf(&content("llama", None, &toks, None, &[], vec![])).unwrap();
        assert_eq!((v.unk, v.bos, v.eos), (Some(0), Some(1), Some(2)));
        assert!(v.add_bos && !v.add_eos && v.add_space_prefix);
        let extra = vec![
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
            ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ("tokenizer.ggml.eos_token_id", Value::U32(3)),
            // Out of range: ignored, default kept.
            ("tokenizer.ggml.bos_token_id", Value::U32(99)),
        ];
        let v = Vocab::from_gguf(&content("llama", None, &toks, None, &[], extra)).unwrap();
        assert!(!v.add_bos && !v.add_space_prefix);
        assert_eq!((v.bos, v.eos), (Some(1), Some(3)));
        // The end-of-generation set always holds eos.
        assert!(v.eog.contains(&3));
    }

    #[test]
    fn eog_set_follows_llama_cpp_texts() {
        let toks = [
            ("<|endoftext|>", 3),
            ("<|im_start|>", 3),
            ("<|im_end|>", 1),
            ("<|eot_id|>", 4),
            ("x", 1),
        ];
        let extra = vec![("tokenizer.ggml.eos_token_id", Value::U32(0))];
        let v = Vocab::from_gguf(&content(
            "gpt2",
            Some("gpt-2"),
            &toks,
            None,
            &["x x"],
            extra,
        ))
        .unwrap();
        assert_eq!(v.eog.iter().copied().collect::<Vec<_>>(), vec![0, 2, 3]);
        // The first matching end-of-turn text in llama.cpp's order.
        assert_eq!(v.eot, Some(3));
        // End-of-generation tokens become control tokens even when typed otherwise.
        assert_ne!(v.attrs[2] & attr::CONTROL, 0);
        // Specials are sorted longest first.
        assert_eq!(v.specials, vec![0, 1, 2, 3]);
        let lens: Vec<usize> = v
            .specials
            .iter()
            .map(|&i| v.tokens[i as usize].len())
            .collect();
        assert!(lens.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn merges_split_at_first_space_after_first_byte() {
        let toks = [("Ġ", 1), ("Ġa", 1), ("a", 1), (" ", 1), ("  ", 1)];
        let v = Vocab::from_gguf(&content(
            "gpt2",
            Some("gpt-2"),
            &toks,
            None,
            &["Ġ a", "   "],
            vec![],
        ))
        .unwrap();
        assert_eq!(v.merges[0], ("Ġ".to_string(), "a".to_string()));
        // "   " splits as (" ", " "): the search starts after the first byte.
        assert_eq!(v.merges[1], (" ".to_string(), " ".to_string()));
    }
}
