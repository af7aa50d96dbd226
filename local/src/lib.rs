//! `tidal up`: the whole platform in one process.
//!
//! The gateway, the in-process broker, the metering consumer on an SQLite ledger and a local
//! fleet of in-process workers run together. The fleet ([`fleet`]) is scaled by the same
//! `tidal_autoscaler::decide` the Kubernetes controller runs, so scale-to-zero here is the
//! production behaviour, not an imitation of it.

pub mod credentials;
pub mod fetch;
pub mod fleet;
pub mod launcher;
pub mod paths;
pub mod source;
pub mod up;
