//! Records of model pools: workers that hold one or more models and load or unload them on
//! command (`tidal runtime --pool`). A pool worker writes a [`PoolHeartbeat`] into
//! `{prefix}pool:{pool}:workers` every beat (besides the per-model [`crate::WorkerHeartbeat`]
//! of each model it has loaded, which gateway admission and autoscaling read as for any
//! worker); the controller (or the local fleet) writes each worker's assignment, the models
//! it should hold, into `{prefix}pool:{pool}:assign`, which the worker reads every beat.

use serde::{Deserialize, Serialize};

use crate::error::{QueueError, Result};
use crate::types::CapacityType;

/// A model loaded on a pool worker and serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolLoadedModel {
    /// The model id (its jobs stream is `{prefix}jobs:{model}`).
    pub model: String,
    /// Memory it takes, bytes, counted against the worker's memory: its weights, its KV
    /// cache and one step's activation buffers, as its memory plan works them out from the
    /// file's header and the engine settings before the load.
    pub bytes: u64,
    /// Its sequences running on this worker.
    pub running: u32,
    /// Its jobs held by this worker but waiting for KV blocks.
    pub waiting: u32,
    /// When the worker last held a job of it, or finished loading it (ms since the epoch).
    pub last_used_ms: u64,
    /// Completion tokens this worker delivered for the model since it loaded it: a counter
    /// that only grows while the model stays loaded (it starts again from zero when the
    /// model is loaded again).
    #[serde(default)]
    pub tokens_delivered: u64,
}

/// A model whose weights are in the worker node's local cache (the page cache or local
/// disk), so loading it is a swap rather than a download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedModel {
    /// The model id.
    pub model: String,
    /// Size of its weights file, bytes.
    pub bytes: u64,
    /// SHA-256 of the file (lower-case hex) when `--pool-model-sha256` or the model
    /// directory's manifest gives one; it is checked before the first load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Whether its pages were resident in the page cache at the last look (a load from
    /// memory rather than from disk).
    #[serde(default)]
    pub warm: bool,
}

/// A model a pool worker could not load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedLoad {
    /// The model id.
    pub model: String,
    /// Why, for operators.
    pub error: String,
}

/// A pool worker's report (`{prefix}pool:{pool}:workers` hash, field: the worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolHeartbeat {
    /// Worker name (pod name); also its consumer name in every model's jobs stream.
    pub worker: String,
    /// The pool it belongs to.
    pub pool: String,
    /// The node it runs on (its local cache is the node's).
    pub node: String,
    /// Capacity it runs on.
    pub capacity_type: CapacityType,
    /// Memory the worker lets its models take (weights, KV caches and activations), bytes.
    pub memory_total_bytes: u64,
    /// Of that, free: the total less what `loaded`, `loading` and `unloading` take.
    pub memory_free_bytes: u64,
    /// Models loaded and serving.
    pub loaded: Vec<PoolLoadedModel>,
    /// Models being loaded now (their memory is taken).
    pub loading: Vec<String>,
    /// Models unloading now: they claim nothing more and finish or re-enqueue what they
    /// hold (their memory is still taken).
    #[serde(default)]
    pub unloading: Vec<String>,
    /// Models whose weights are in the node's local cache, loaded or not.
    pub cached: Vec<CachedModel>,
    /// Models it was assigned but could not load (not in its model directory, a file whose
    /// SHA-256 differs, too big for its free memory, a broken file), with why. It does not
    /// try one again until the model leaves its assignment and comes back.
    #[serde(default)]
    pub failed: Vec<FailedLoad>,
    /// Whether the worker is shutting down (it claims nothing new for any model).
    pub draining: bool,
    /// When it reported (its clock, ms since the epoch).
    pub last_seen_ms: u64,
}

impl PoolHeartbeat {
    /// Whether it holds `model`, loaded or loading.
    pub fn holds(&self, model: &str) -> bool {
        self.loaded.iter().any(|l| l.model == model) || self.loading.iter().any(|m| m == model)
    }
}

/// Checks a pool or model name used inside a key: not empty, no whitespace or control
/// characters (they would make keys that operators cannot type).
pub fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(QueueError::Invalid(format!("the {what} name is empty")));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(QueueError::Invalid(format!(
            "the {what} name {name:?} holds whitespace or control characters"
        )));
    }
    Ok(())
}

/// Checks an assignment: valid, distinct model ids.
pub fn check_assignment(models: &[String]) -> Result<()> {
    for (i, m) in models.iter().enumerate() {
        check_name("model", m)?;
        if models[..i].contains(m) {
            return Err(QueueError::Invalid(format!(
                "model {m:?} is assigned twice"
            )));
        }
    }
    Ok(())
}

/// Whether pool heartbeat `beat` is stale at `now_ms` (the rule of [`crate::broker::is_stale`]).
pub fn is_pool_stale(beat: &PoolHeartbeat, now_ms: u64, max_age: std::time::Duration) -> bool {
    now_ms.saturating_sub(beat.last_seen_ms) > max_age.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_assignments_are_checked() {
        check_name("pool", "gpu-a").unwrap();
        check_name("model", "ns/m:1").unwrap();
        assert!(check_name("pool", "").is_err());
        assert!(check_name("pool", "a b").is_err());
        check_assignment(&["a".into(), "b".into()]).unwrap();
        check_assignment(&[]).unwrap();
        let e = check_assignment(&["a".into(), "a".into()]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn heartbeat_json_is_stable() {
        let beat = PoolHeartbeat {
            worker: "w".into(),
            pool: "p".into(),
            node: "n".into(),
            capacity_type: CapacityType::Spot,
            memory_total_bytes: 100,
            memory_free_bytes: 40,
            loaded: vec![PoolLoadedModel {
                model: "a".into(),
                bytes: 60,
                running: 1,
                waiting: 0,
                last_used_ms: 5,
                tokens_delivered: 12,
            }],
            loading: vec![],
            unloading: vec![],
            cached: vec![CachedModel {
                model: "a".into(),
                bytes: 60,
                sha256: None,
                warm: true,
            }],
            failed: vec![],
            draining: false,
            last_seen_ms: 7,
        };
        let json = serde_json::to_value(&beat).unwrap();
        assert_eq!(json["capacity_type"], "spot");
        assert_eq!(json["loaded"][0]["last_used_ms"], 5);
        assert_eq!(json["loaded"][0]["tokens_delivered"], 12);
        assert!(json["cached"][0].get("sha256").is_none());
        assert_eq!(serde_json::from_value::<PoolHeartbeat>(json).unwrap(), beat);
        assert!(beat.holds("a") && !beat.holds("b"));
        // A beat written before the counter existed reads as zero tokens.
        let mut old = serde_json::to_value(&beat).unwrap();
        old["loaded"][0]
            .as_object_mut()
            .unwrap()
            .remove("tokens_delivered");
        let read = serde_json::from_value::<PoolHeartbeat>(old).unwrap();
        assert_eq!(read.loaded[0].tokens_delivered, 0);
    }
}
