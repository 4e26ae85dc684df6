//! An outbox table's identifiers, quoted once, for the statements the on-call commands
//! (`dead-letters`, `replay`) build around them.

use crate::table::outbox::OutboxTable;

/// The table's name and the columns the commands read or reset, each quoted; the optional
/// columns are `None` when the table does not map them.
pub struct QuotedTable {
    pub table: String,
    pub id: String,
    pub kind: String,
    pub occurred: String,
    pub processed: String,
    pub error: String,
    pub attempts: Option<String>,
    pub headers: Option<String>,
    pub key: Option<String>,
}

impl QuotedTable {
    pub fn new(table: &OutboxTable) -> Self {
        let c = &table.columns;
        Self {
            table: table.name.quoted(),
            id: c.id.quoted(),
            kind: c.kind.quoted(),
            occurred: c.occurred_at.quoted(),
            processed: c.processed_at.quoted(),
            error: c.error.quoted(),
            attempts: c.attempts.as_ref().map(|a| a.quoted()),
            headers: c.headers.as_ref().map(|h| h.quoted()),
            key: c.partition_key.as_ref().map(|k| k.quoted()),
        }
    }
}
