//! One batch of the table protocol, inside one transaction: claim → publish → await confirms →
//! settle → commit. Generic over the [`crate::broker::Publisher`], so the claim loop knows no
//! broker protocol.

pub mod batch;
pub mod claim;
pub mod cursor;
pub mod message;
pub mod publish_notices;
pub mod report;
pub mod row;
pub mod settle;
pub mod shared_cursor;
pub mod trace_report;
