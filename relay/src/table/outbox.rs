//! The shape of an outbox table: its name, the column mapping and the delivery mode.
//! Shared by the relay, the migration and the operator, so the table is described once.

use crate::table::ident::{Ident, TableName};

/// The lag-report table, next to every outbox table in its schema.
pub const REPORTS_TABLE: &str = "outbox_relay_reports";

/// What happens to a row once the broker confirmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMode {
    /// Set the processed-at column (the reference article's behaviour; rows stay for audit).
    #[default]
    Mark,
    /// Delete the row: no dead tuples pile up at the head of the pending index.
    Delete,
}

impl DeliveryMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "mark" => Some(Self::Mark),
            "delete" => Some(Self::Delete),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mark => "mark",
            Self::Delete => "delete",
        }
    }
}

/// Column names of the outbox table. Required ones exist in the reference article's table;
/// optional ones are used when the user maps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub id: Ident,
    pub kind: Ident,
    pub payload: Ident,
    pub occurred_at: Ident,
    pub processed_at: Ident,
    pub error: Ident,
    pub routing_key: Option<Ident>,
    pub headers: Option<Ident>,
    pub attempts: Option<Ident>,
}

impl Default for Columns {
    fn default() -> Self {
        let name = |n: &str| Ident::new(n).expect("default column names are valid");
        Self {
            id: name("id"),
            kind: name("type"),
            payload: name("content"),
            occurred_at: name("occurred_on_utc"),
            processed_at: name("processed_on_utc"),
            error: name("error"),
            routing_key: None,
            headers: None,
            attempts: None,
        }
    }
}

impl Columns {
    /// Every mapped column with the option that named it, for existence checks and messages.
    pub fn mapped(&self) -> Vec<(&'static str, &Ident)> {
        let mut all = vec![
            ("id-column", &self.id),
            ("type-column", &self.kind),
            ("payload-column", &self.payload),
            ("occurred-at-column", &self.occurred_at),
            ("processed-at-column", &self.processed_at),
            ("error-column", &self.error),
        ];
        for (option, column) in [
            ("routing-key-column", &self.routing_key),
            ("headers-column", &self.headers),
            ("attempts-column", &self.attempts),
        ] {
            if let Some(column) = column {
                all.push((option, column));
            }
        }
        all
    }
}

/// One outbox table as the relay sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    pub name: TableName,
    pub columns: Columns,
    pub mode: DeliveryMode,
}

impl OutboxTable {
    pub fn new(name: TableName) -> Self {
        Self {
            name,
            columns: Columns::default(),
            mode: DeliveryMode::Mark,
        }
    }

    /// The report table lives next to the outbox table, in the same schema.
    pub fn reports_table(&self) -> TableName {
        TableName {
            schema: self.name.schema.clone(),
            table: Ident::new(REPORTS_TABLE).expect("constant is valid"),
        }
    }
}
