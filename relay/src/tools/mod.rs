//! Helpers for demos, benchmarks and tests, not part of the relay's data path.

pub mod consume;
pub mod seed;
