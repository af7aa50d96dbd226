//! `tidal`'s command line as a library: the subcommands' flag definitions and their entry
//! points. The binary (`src/main.rs`) only parses and dispatches; tests use the same
//! definitions to render `docs/configuration.md` and to check the command lines in the docs.

pub mod cli;
