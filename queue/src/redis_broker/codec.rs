//! Encoding of protocol records as stream fields, and decoding of Redis stream replies.
//! Pure: no I/O, tested here.

use redis::Value;

use crate::error::{QueueError, Result};
use crate::types::{Job, Resume};

/// One stream entry: id and field/value pairs (`None` fields: the entry was deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub id: String,
    pub fields: Option<Vec<(String, Vec<u8>)>>,
}

impl Entry {
    /// The value of `name`.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .as_ref()?
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> QueueError {
    QueueError::Malformed {
        what,
        detail: detail.into(),
    }
}

/// Bytes of a string-like reply.
pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

/// A string-like reply as UTF-8.
pub(crate) fn string(v: &Value) -> Option<String> {
    bytes(v).and_then(|b| String::from_utf8(b).ok())
}

/// An integer reply (or an integer written as a string).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => string(other)?.parse().ok(),
    }
}

/// The elements of an array-like reply.
pub(crate) fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) | Value::Set(a) => Some(a),
        _ => None,
    }
}

fn field_pairs(v: &Value) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    match v {
        Value::Map(m) => {
            for (k, v) in m {
                let k = string(k).ok_or_else(|| malformed("stream entry", "field name"))?;
                out.push((k, bytes(v).unwrap_or_default()));
            }
        }
        other => {
            let a = items(other).ok_or_else(|| malformed("stream entry", "fields"))?;
            for pair in a.chunks(2) {
                let [k, v] = pair else {
                    return Err(malformed("stream entry", "odd field list"));
                };
                let k = string(k).ok_or_else(|| malformed("stream entry", "field name"))?;
                out.push((k, bytes(v).unwrap_or_default()));
            }
        }
    }
    Ok(out)
}

/// Parses a list of entries (`XRANGE`, or the entries of one stream in `XREAD`).
pub(crate) fn entries(v: &Value) -> Result<Vec<Entry>> {
    let list = match v {
        Value::Nil => return Ok(Vec::new()),
        other => items(other).ok_or_else(|| malformed("stream reply", "entry list"))?,
    };
    list.iter()
        .map(|e| {
            let a = items(e).ok_or_else(|| malformed("stream reply", "entry"))?;
            let id = a
                .first()
                .and_then(string)
                .ok_or_else(|| malformed("stream reply", "entry id"))?;
            let fields = match a.get(1) {
                None | Some(Value::Nil) => None,
                Some(f) => Some(field_pairs(f)?),
            };
            Ok(Entry { id, fields })
        })
        .collect()
}

/// Parses an `XREAD`/`XREADGROUP` reply (RESP2 array or RESP3 map) into the entries of all
/// streams, in reply order.
pub(crate) fn read_reply(v: &Value) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    match v {
        Value::Nil => {}
        Value::Map(m) => {
            for (_, es) in m {
                out.extend(entries(es)?);
            }
        }
        other => {
            for s in items(other).ok_or_else(|| malformed("read reply", "stream list"))? {
                let pair = items(s).ok_or_else(|| malformed("read reply", "stream"))?;
                let es = pair
                    .get(1)
                    .ok_or_else(|| malformed("read reply", "stream entries"))?;
                out.extend(entries(es)?);
            }
        }
    }
    Ok(out)
}

/// Parses an `XAUTOCLAIM` reply: next cursor and the claimed entries.
pub(crate) fn autoclaim_reply(v: &Value) -> Result<(String, Vec<Entry>)> {
    let a = items(v).ok_or_else(|| malformed("autoclaim reply", "not an array"))?;
    let next = a
        .first()
        .and_then(string)
        .ok_or_else(|| malformed("autoclaim reply", "cursor"))?;
    let es = match a.get(1) {
        Some(es) => entries(es)?,
        None => Vec::new(),
    };
    Ok((next, es))
}

/// Stream fields of a job (design.md: id, tenant, body, enqueued_at, deadline, resume).
pub(crate) fn job_fields(job: &Job) -> Result<Vec<(&'static str, String)>> {
    let mut f = vec![
        ("id", job.id.to_string()),
        ("tenant", job.tenant.clone()),
        ("model", job.model.clone()),
        ("body", serde_json::to_string(&job.body)?),
        ("enqueued_at", job.enqueued_at_ms.to_string()),
        ("deadline", job.deadline_ms.to_string()),
    ];
    if let Some(r) = &job.resume {
        f.push(("resume", serde_json::to_string(r)?));
    }
    Ok(f)
}

fn text<'a>(e: &'a Entry, name: &'static str) -> Result<&'a str> {
    let b = e
        .field(name)
        .ok_or_else(|| malformed("job", format!("entry {} lacks {name}", e.id)))?;
    std::str::from_utf8(b).map_err(|_| malformed("job", format!("{name} is not UTF-8")))
}

fn number(e: &Entry, name: &'static str) -> Result<u64> {
    text(e, name)?
        .parse()
        .map_err(|_| malformed("job", format!("{name} is not a number")))
}

/// Decodes a job entry.
pub(crate) fn job_from_entry(e: &Entry) -> Result<Job> {
    let id = text(e, "id")?
        .parse()
        .map_err(|_| malformed("job", "id is not a UUID"))?;
    let resume: Option<Resume> = match e.field("resume") {
        Some(b) => Some(serde_json::from_slice(b)?),
        None => None,
    };
    Ok(Job {
        id,
        tenant: text(e, "tenant")?.to_owned(),
        model: text(e, "model")?.to_owned(),
        body: serde_json::from_str(text(e, "body")?)?,
        enqueued_at_ms: number(e, "enqueued_at")?,
        deadline_ms: number(e, "deadline")?,
        resume,
    })
}

/// Decodes the JSON record in field `name` of an entry.
pub(crate) fn json_field<T: serde::de::DeserializeOwned>(
    e: &Entry,
    name: &'static str,
    what: &'static str,
) -> Result<T> {
    let b = e
        .field(name)
        .ok_or_else(|| malformed(what, format!("entry {} lacks {name}", e.id)))?;
    Ok(serde_json::from_slice(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn job(resume: Option<Resume>) -> Job {
        Job {
            id: Uuid::now_v7(),
            tenant: "acme".into(),
            model: "ns/m".into(),
            body: serde_json::json!({"prompt": "hi", "max_tokens": 4}),
            enqueued_at_ms: 1_700_000_000_000,
            deadline_ms: 1_700_000_030_000,
            resume,
        }
    }

    fn entry_of(job: &Job) -> Entry {
        Entry {
            id: "5-0".into(),
            fields: Some(
                job_fields(job)
                    .unwrap()
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.into_bytes()))
                    .collect(),
            ),
        }
    }

    #[test]
    fn job_round_trips_through_fields() {
        for j in [
            job(None),
            job(Some(Resume {
                token_ids: vec![1, 2],
                text_len: 7,
                last_seq: 2,
                segments: 1,
            })),
        ] {
            assert_eq!(job_from_entry(&entry_of(&j)).unwrap(), j);
        }
    }

    #[test]
    fn job_without_resume_has_no_resume_field() {
        let f = job_fields(&job(None)).unwrap();
        assert!(f.iter().all(|(k, _)| *k != "resume"));
    }

    #[test]
    fn missing_or_bad_fields_are_malformed() {
        let j = job(None);
        let mut e = entry_of(&j);
        e.fields.as_mut().unwrap().retain(|(k, _)| k != "tenant");
        assert!(matches!(
            job_from_entry(&e),
            Err(QueueError::Malformed { what: "job", .. })
        ));
        let mut e = entry_of(&j);
        for (k, v) in e.fields.as_mut().unwrap() {
            if k == "deadline" {
                *v = b"soon".to_vec();
            }
        }
        assert!(job_from_entry(&e).is_err());
        let deleted = Entry {
            id: "1-0".into(),
            fields: None,
        };
        assert!(job_from_entry(&deleted).is_err());
    }

    #[test]
    fn parses_resp2_read_reply() {
        let v = Value::Array(vec![Value::Array(vec![
            bulk("k"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("a"), bulk("x")])]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let es = read_reply(&v).unwrap();
        assert_eq!(es.len(), 2);
        assert_eq!(es[0].id, "1-0");
        assert_eq!(es[0].field("a"), Some(&b"x"[..]));
        assert_eq!(es[1].fields, None);
        assert_eq!(read_reply(&Value::Nil).unwrap(), vec![]);
    }

    #[test]
    fn parses_resp3_read_reply() {
        let v = Value::Map(vec![(
            bulk("k"),
            Value::Array(vec![Value::Array(vec![
                bulk("3-1"),
                Value::Map(vec![(bulk("f"), bulk("v"))]),
            ])]),
        )]);
        let es = read_reply(&v).unwrap();
        assert_eq!(es[0].id, "3-1");
        assert_eq!(es[0].field("f"), Some(&b"v"[..]));
    }

    #[test]
    fn parses_autoclaim_reply() {
        let v = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![Value::Array(vec![
                bulk("7-0"),
                Value::Array(vec![bulk("ev"), bulk("{}")]),
            ])]),
            Value::Array(vec![]),
        ]);
        let (next, es) = autoclaim_reply(&v).unwrap();
        assert_eq!(next, "0-0");
        assert_eq!(es.len(), 1);
        assert_eq!(es[0].id, "7-0");
    }

    #[test]
    fn odd_field_lists_are_malformed() {
        let v = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("a")]),
        ])]);
        assert!(entries(&v).is_err());
    }

    #[test]
    fn scalar_helpers() {
        assert_eq!(int(&Value::Int(4)), Some(4));
        assert_eq!(int(&bulk("12")), Some(12));
        assert_eq!(int(&Value::Nil), None);
        assert_eq!(
            string(&Value::SimpleString("ok".into())).as_deref(),
            Some("ok")
        );
    }
}
