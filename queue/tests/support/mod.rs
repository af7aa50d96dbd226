//! Shared test support: harnesses for both brokers and the one suite of cases they pass.
#![allow(dead_code)]

pub mod cases;
pub mod harness;
