//! The on-call repairs of `outbox-relay replay` and `outbox-relay dead-letters` (issue 47):
//! production commands that write to the outbox table (UPDATEs that make rows pending again or
//! settle dead letters for good), so they live under [`crate::table`], the one module that
//! writes SQL. The commands' options and printing are in `cli`.
//!
//! - [`replay`]: send again rows the relay already delivered;
//! - [`dead_letters`]: dead-lettered rows grouped by cause, sent again or settled;
//! - [`quoted`]: the table's identifiers, quoted once, for the statements both build.

pub mod dead_letters;
pub mod quoted;
pub mod replay;
