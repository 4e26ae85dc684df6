//! `make chaos`: relay many rows with several relay processes while faults are injected at
//! seeded random points, then count what was lost, duplicated and left pending.

pub mod consumer;
pub mod faults;
pub mod leaks;
pub mod report;
