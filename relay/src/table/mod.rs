//! Everything about the outbox table: validated identifiers, the table's shape and column
//! mapping, the SQL of the protocol, the migration (and its undoing), the lag reports and the
//! on-call repairs ([`repair`]: replay, dead letters). The only module that writes SQL.

pub mod cleanup;
pub mod health;
pub mod ident;
pub mod inspect;
pub mod limits;
pub mod migrate;
pub mod outbox;
pub mod repair;
pub mod reports;
pub mod sql;

pub use outbox::{Columns, DeliveryMode, LIMITS_TABLE, OutboxTable, REPORTS_TABLE};
