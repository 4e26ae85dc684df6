//! Helpers for demos, benchmarks and tests, not part of the relay's data path.

pub mod consume;
pub mod dead_letters;
pub mod quoted;
pub mod replay;
pub mod seed;
