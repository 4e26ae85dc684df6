//! The shape of an outbox table: its name, the column mapping and the delivery mode.
//! Shared by the relay, the migration and the operator, so the table is described once.

use crate::defaults;
use crate::table::ident::{Ident, TableName};

/// The lag-report table, next to every outbox table in its schema.
pub const REPORTS_TABLE: &str = "outbox_relay_reports";
/// The limits table, next to the report table: the per-pod share of an OutboxRelay's
/// `spec.relay.maxRate`, written by the operator and read by the pods at each report.
pub const LIMITS_TABLE: &str = "outbox_relay_limits";

/// What happens to a row once the broker confirmed it. The operator's CRD uses this type too.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryMode {
    /// Set the processed-at column (the reference article's behaviour; rows stay for audit).
    #[default]
    Mark,
    /// Delete the row: no dead tuples pile up at the head of the pending index.
    Delete,
}

impl DeliveryMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mark => "mark",
            Self::Delete => "delete",
        }
    }
}

/// In what order rows reach the broker. The operator's CRD has its own spelling (`perKey`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryOrder {
    /// No promise: parallel workers and pods publish concurrently.
    #[default]
    Unordered,
    /// Rows of one partition key reach the broker in claim order, one at a time; different
    /// keys in parallel (see `runtime::lanes`).
    PerKey,
}

impl DeliveryOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unordered => "unordered",
            Self::PerKey => "per-key",
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
    /// The partition key (e.g. the aggregate id) that per-key ordering orders by.
    pub partition_key: Option<Ident>,
    /// The W3C `traceparent` the producing service wrote (text), sent on as a message header.
    pub traceparent: Option<Ident>,
    /// The W3C `tracestate` that goes with it (text).
    pub tracestate: Option<Ident>,
}

/// A column of the outbox table that a user can map, with the option that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnRole {
    Id,
    Type,
    Payload,
    OccurredAt,
    ProcessedAt,
    Error,
    RoutingKey,
    Headers,
    Attempts,
    PartitionKey,
    Traceparent,
    Tracestate,
}

impl ColumnRole {
    pub const ALL: [ColumnRole; 12] = [
        ColumnRole::Id,
        ColumnRole::Type,
        ColumnRole::Payload,
        ColumnRole::OccurredAt,
        ColumnRole::ProcessedAt,
        ColumnRole::Error,
        ColumnRole::RoutingKey,
        ColumnRole::Headers,
        ColumnRole::Attempts,
        ColumnRole::PartitionKey,
        ColumnRole::Traceparent,
        ColumnRole::Tracestate,
    ];

    /// The flag (without dashes) that maps the column; messages name it.
    pub fn option(self) -> &'static str {
        match self {
            ColumnRole::Id => "id-column",
            ColumnRole::Type => "type-column",
            ColumnRole::Payload => "payload-column",
            ColumnRole::OccurredAt => "occurred-at-column",
            ColumnRole::ProcessedAt => "processed-at-column",
            ColumnRole::Error => "error-column",
            ColumnRole::RoutingKey => "routing-key-column",
            ColumnRole::Headers => "headers-column",
            ColumnRole::Attempts => "attempts-column",
            ColumnRole::PartitionKey => "partition-key-column",
            ColumnRole::Traceparent => "traceparent-column",
            ColumnRole::Tracestate => "tracestate-column",
        }
    }

    /// The reference article's name for a required column; None for the optional ones, which
    /// are used only when mapped.
    pub fn default_name(self) -> Option<&'static str> {
        match self {
            ColumnRole::Id => Some(defaults::columns::ID),
            ColumnRole::Type => Some(defaults::columns::TYPE),
            ColumnRole::Payload => Some(defaults::columns::PAYLOAD),
            ColumnRole::OccurredAt => Some(defaults::columns::OCCURRED_AT),
            ColumnRole::ProcessedAt => Some(defaults::columns::PROCESSED_AT),
            ColumnRole::Error => Some(defaults::columns::ERROR),
            ColumnRole::RoutingKey
            | ColumnRole::Headers
            | ColumnRole::Attempts
            | ColumnRole::PartitionKey
            | ColumnRole::Traceparent
            | ColumnRole::Tracestate => None,
        }
    }
}

impl Default for Columns {
    fn default() -> Self {
        Self::from_roles(|_| Ok::<_, std::convert::Infallible>(None))
            .unwrap_or_else(|never| match never {})
    }
}

impl Columns {
    /// Builds the mapping from the name `name` gives each role (None: unmapped). A required
    /// role left unnamed gets the reference article's name.
    pub fn from_roles<E>(
        mut name: impl FnMut(ColumnRole) -> Result<Option<Ident>, E>,
    ) -> Result<Self, E> {
        let mut required = |role: ColumnRole| -> Result<Ident, E> {
            Ok(name(role)?.unwrap_or_else(|| {
                let default = role.default_name().expect("required roles have a default");
                Ident::new(default).expect("default column names are valid")
            }))
        };
        let (id, kind, payload) = (
            required(ColumnRole::Id)?,
            required(ColumnRole::Type)?,
            required(ColumnRole::Payload)?,
        );
        let (occurred_at, processed_at, error) = (
            required(ColumnRole::OccurredAt)?,
            required(ColumnRole::ProcessedAt)?,
            required(ColumnRole::Error)?,
        );
        Ok(Self {
            id,
            kind,
            payload,
            occurred_at,
            processed_at,
            error,
            routing_key: name(ColumnRole::RoutingKey)?,
            headers: name(ColumnRole::Headers)?,
            attempts: name(ColumnRole::Attempts)?,
            partition_key: name(ColumnRole::PartitionKey)?,
            traceparent: name(ColumnRole::Traceparent)?,
            tracestate: name(ColumnRole::Tracestate)?,
        })
    }

    /// The column mapped to `role`, if any.
    pub fn get(&self, role: ColumnRole) -> Option<&Ident> {
        match role {
            ColumnRole::Id => Some(&self.id),
            ColumnRole::Type => Some(&self.kind),
            ColumnRole::Payload => Some(&self.payload),
            ColumnRole::OccurredAt => Some(&self.occurred_at),
            ColumnRole::ProcessedAt => Some(&self.processed_at),
            ColumnRole::Error => Some(&self.error),
            ColumnRole::RoutingKey => self.routing_key.as_ref(),
            ColumnRole::Headers => self.headers.as_ref(),
            ColumnRole::Attempts => self.attempts.as_ref(),
            ColumnRole::PartitionKey => self.partition_key.as_ref(),
            ColumnRole::Traceparent => self.traceparent.as_ref(),
            ColumnRole::Tracestate => self.tracestate.as_ref(),
        }
    }

    /// Every mapped column with its role, for existence checks and messages.
    pub fn mapped(&self) -> Vec<(ColumnRole, &Ident)> {
        ColumnRole::ALL
            .into_iter()
            .filter_map(|role| Some((role, self.get(role)?)))
            .collect()
    }
}

/// One outbox table as the relay sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    pub name: TableName,
    pub columns: Columns,
    pub mode: DeliveryMode,
    /// Per-key ordering needs `columns.partition_key`; configuration checks both together.
    pub ordering: DeliveryOrder,
}

impl OutboxTable {
    pub fn new(name: TableName) -> Self {
        Self {
            name,
            columns: Columns::default(),
            mode: DeliveryMode::Mark,
            ordering: DeliveryOrder::Unordered,
        }
    }

    /// The pending-row index the migration builds: the reference article's covering index
    /// `(occurred, processed) INCLUDE (id, type, payload)` or the plain one. Named here, with
    /// the table, because the migration builds it and the health measure reads its size; in
    /// the migration module it made health import the migration, which imports the inspection,
    /// which imports health's SQL: a circle.
    pub fn pending_index(&self, covering_index: bool) -> Ident {
        self.name.derived(if covering_index {
            "pending_covering_idx"
        } else {
            "pending_idx"
        })
    }

    /// The report table lives next to the outbox table, in the same schema.
    pub fn reports_table(&self) -> TableName {
        TableName {
            schema: self.name.schema.clone(),
            table: Ident::new(REPORTS_TABLE).expect("constant is valid"),
        }
    }

    /// The limits table lives next to the report table.
    pub fn limits_table(&self) -> TableName {
        TableName {
            schema: self.name.schema.clone(),
            table: Ident::new(LIMITS_TABLE).expect("constant is valid"),
        }
    }

    /// The sequence in which every relay of this table shares its claim frontier: the latest
    /// claim position any of them took, in microseconds since the epoch (see
    /// `protocol::shared_cursor`). Next to the table, owned by it.
    pub fn frontier_sequence(&self) -> TableName {
        TableName {
            schema: self.name.schema.clone(),
            table: self.name.derived("claim_frontier"),
        }
    }
}
