//! One module per subcommand; shared flag groups and parsing helpers.

pub mod bench;
pub mod bench_profile;
pub mod billing;
pub mod controller;
pub mod crd;
pub mod engine_args;
pub mod gateway;
pub mod keys;
pub mod logging;
pub mod models;
pub mod report;
pub mod runtime;
pub mod signals;
pub mod status;
pub mod up;
