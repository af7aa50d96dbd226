//! The broker protocol between gateway, workers, controller and billing
//! (design.md, "Broker protocol" and "Preemption-safe generation").
//!
//! [`Broker`] is the interface; [`RedisBroker`] implements it on Redis Streams with consumer
//! groups (production) and [`MemoryBroker`] in process (`tidal up`, tests). Both pass one
//! test suite (`tests/broker_suite.rs`). The rules they share (start gate, response fencing,
//! ownership) are documented on [`broker`].
//!
//! Keys beyond design.md's list (see [`Keys`]): `{prefix}resume:{model}`, the stream of
//! re-enqueued jobs that claims serve first, `{prefix}state:{id}`, a request's start gate, and
//! `{prefix}req:{id}`, the gateway's [`RequestRecord`] of who owns the request (for reattaching).
//! Model pools (workers holding several models, [`pool`]) add `{prefix}pool:{pool}:workers`
//! and `{prefix}pool:{pool}:assign`.
//! Response events carry their seq in every variant, `done` and `error` included.

pub mod bench;
pub mod broker;
pub mod clock;
mod error;
mod fail;
pub mod keys;
mod memory;
pub mod metrics;
pub mod pool;
mod redis_broker;
pub mod testing;
mod types;

pub use broker::{Broker, BrokerConfig};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{QueueError, Result};
pub use fail::{fail_job, JobFailure};
pub use keys::Keys;
pub use memory::MemoryBroker;
pub use pool::{CachedModel, FailedLoad, PoolHeartbeat, PoolLoadedModel};
pub use redis_broker::RedisBroker;
pub use types::*;
