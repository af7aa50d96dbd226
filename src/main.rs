//! `tidal`: one binary, many roles.
fn main() {}
