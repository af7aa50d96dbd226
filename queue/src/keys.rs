//! Key names of the broker protocol (design.md, "Broker protocol").

use uuid::Uuid;

/// Consumer group of every jobs stream.
pub const WORKERS_GROUP: &str = "workers";
/// Consumer group of the usage stream.
pub const BILLING_GROUP: &str = "billing";
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tidal:";

/// Builds the keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (e.g. `tidal:`).
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Hash: model id → [`crate::ModelRecord`] JSON.
    pub fn models(&self) -> String {
        format!("{}models", self.prefix)
    }

    /// Stream of jobs of one model (group [`WORKERS_GROUP`]).
    pub fn jobs(&self, model: &str) -> String {
        format!("{}jobs:{model}", self.prefix)
    }

    /// Stream of one model's re-enqueued (resumed) jobs, claimed before fresh ones
    /// (group [`WORKERS_GROUP`]).
    pub fn resumed(&self, model: &str) -> String {
        format!("{}resume:{model}", self.prefix)
    }

    /// The stream a job belongs in: resumed jobs jump the queue.
    pub fn job_stream(&self, model: &str, resumed: bool) -> String {
        if resumed {
            self.resumed(model)
        } else {
            self.jobs(model)
        }
    }

    /// Stream of response events of one request.
    pub fn resp(&self, id: Uuid) -> String {
        format!("{}resp:{id}", self.prefix)
    }

    /// Stream of usage events (group [`BILLING_GROUP`]).
    pub fn usage(&self) -> String {
        format!("{}usage", self.prefix)
    }

    /// Cancel flag of one request.
    pub fn cancel(&self, id: Uuid) -> String {
        format!("{}cancel:{id}", self.prefix)
    }

    /// Start gate of one request: `started` or `withdrawn` (see [`crate::Broker::withdraw`]).
    pub fn state(&self, id: Uuid) -> String {
        format!("{}state:{id}", self.prefix)
    }

    /// Record of one accepted request ([`crate::RequestRecord`] JSON).
    pub fn request(&self, id: Uuid) -> String {
        format!("{}req:{id}", self.prefix)
    }

    /// The first request id tenant `tenant` sent with idempotency key `key`.
    pub fn idempotency(&self, tenant: &str, key: &str) -> String {
        // The tenant's length keeps `a` + `b:c` apart from `a:b` + `c`.
        format!("{}idem:{}:{tenant}:{key}", self.prefix, tenant.len())
    }

    /// Counter of the prompt tokens enqueued for one model (estimated, see
    /// [`crate::Job::prompt_tokens_estimate`]).
    pub fn prompt_tokens(&self, model: &str) -> String {
        format!("{}prompt-tokens:{model}", self.prefix)
    }

    /// Set of the request ids of one model whose worker has delivered their first token
    /// ([`crate::Broker::mark_decoding`]); a job leaves it when acked, re-enqueued or
    /// delivered again (takeover).
    pub fn decoding(&self, model: &str) -> String {
        format!("{}decoding:{model}", self.prefix)
    }

    /// Heartbeat hash of one model's workers.
    pub fn workers(&self, model: &str) -> String {
        format!("{}workers:{model}", self.prefix)
    }

    /// Hash of one pool's workers: worker → [`crate::PoolHeartbeat`] JSON (memory, models
    /// loaded, loading and in the node cache).
    pub fn pool_workers(&self, pool: &str) -> String {
        format!("{}pool:{pool}:workers", self.prefix)
    }

    /// Hash of one pool's assignments: worker → JSON array of the model ids it should hold,
    /// written by the controller (or the local fleet) and read by the worker every beat.
    pub fn pool_assign(&self, pool: &str) -> String {
        format!("{}pool:{pool}:assign", self.prefix)
    }
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new(DEFAULT_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_design() {
        let k = Keys::default();
        let id = Uuid::nil();
        assert_eq!(k.models(), "tidal:models");
        assert_eq!(k.jobs("ns/m"), "tidal:jobs:ns/m");
        assert_eq!(k.resumed("ns/m"), "tidal:resume:ns/m");
        assert_eq!(k.job_stream("m", false), k.jobs("m"));
        assert_eq!(k.job_stream("m", true), k.resumed("m"));
        assert_eq!(k.resp(id), format!("tidal:resp:{id}"));
        assert_eq!(k.usage(), "tidal:usage");
        assert_eq!(k.cancel(id), format!("tidal:cancel:{id}"));
        assert_eq!(k.state(id), format!("tidal:state:{id}"));
        assert_eq!(k.request(id), format!("tidal:req:{id}"));
        assert_eq!(k.idempotency("acme", "k1"), "tidal:idem:4:acme:k1");
        assert_ne!(k.idempotency("a", "b:c"), k.idempotency("a:b", "c"));
        assert_eq!(k.workers("m"), "tidal:workers:m");
        assert_eq!(k.decoding("m"), "tidal:decoding:m");
        assert_eq!(k.pool_workers("gpu"), "tidal:pool:gpu:workers");
        assert_eq!(k.pool_assign("gpu"), "tidal:pool:gpu:assign");
        assert_eq!(Keys::new("x:").usage(), "x:usage");
    }
}
