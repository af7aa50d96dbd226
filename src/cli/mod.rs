//! One module per subcommand; shared flag groups and parsing helpers.

pub mod bench;
pub mod billing;
pub mod engine_args;
pub mod logging;
pub mod report;
pub mod runtime;
