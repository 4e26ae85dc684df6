//! Checks at start that the configured table and every mapped column exist with usable types,
//! so a typo is reported once, clearly, instead of as a failing claim in a loop.

use sqlx::PgConnection;

use crate::database::PoolMode;
use crate::table::outbox::{ColumnRole, OutboxTable};

/// Autovacuum runs on this server: it needs both settings on (without `track_counts` the
/// launcher never learns that a table has dead rows). The start-up inspection and the health
/// measure both read it; it lives here, below both, because in the health module it made the
/// inspection import health, which imports the migration, which imports the inspection.
pub const SERVER_AUTOVACUUM_SQL: &str =
    "current_setting('autovacuum')::bool AND current_setting('track_counts')::bool";

/// How the payload column is read and which content type it implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    Json,
    Text,
    Bytes,
}

impl PayloadKind {
    pub fn default_content_type(self) -> &'static str {
        match self {
            PayloadKind::Json => "application/json",
            PayloadKind::Text => "text/plain",
            PayloadKind::Bytes => "application/octet-stream",
        }
    }
}

/// What the relay learned about the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    pub payload: PayloadKind,
    /// The database stores text as SQL_ASCII: its bytes need not be UTF-8, so text columns are
    /// read as raw bytes (a UTF-8 client would make the server refuse the whole batch).
    pub raw_text: bool,
    /// Autovacuum runs on this server (`autovacuum` and `track_counts` both on). When it does
    /// not, nothing reclaims the dead rows every processed row leaves, and the claim slows.
    pub server_autovacuum: bool,
    /// The table keeps its rows in one heap: not partitioned, no inheritance children. Only then
    /// does a ctid name one row of it (the settling claim finds its rows by ctid).
    pub single_heap: bool,
    /// The table's frontier sequence exists (the migration makes it) and this session may read
    /// and advance it: the relays of the table share where their claims got to.
    pub shared_frontier: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("invalid --table: table {0} does not exist; create it or fix the name")]
    TableMissing(String),
    #[error("invalid column mapping: table {table} has no column {}; fix the options or add the columns", list(.missing))]
    ColumnsMissing {
        table: String,
        missing: Vec<(String, String)>,
    },
    #[error("invalid --{option}: column {column} has type {found}; expected {expected}")]
    WrongType {
        option: String,
        column: String,
        found: String,
        expected: &'static str,
    },
    #[error("database error while inspecting the table: {0}")]
    Database(#[from] sqlx::Error),
}

impl InspectError {
    /// True when the user's configuration is at fault (exit code 2), false for outages.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, InspectError::Database(_))
    }
}

fn list(missing: &[(String, String)]) -> String {
    missing
        .iter()
        .map(|(option, column)| format!("{column} (--{option})"))
        .collect::<Vec<_>>()
        .join(", ")
}

const STRING_TYPES: &[&str] = &["text", "varchar", "bpchar"];
const TIME_TYPES: &[&str] = &["timestamptz", "timestamp"];

fn expected_types(role: ColumnRole) -> (&'static [&'static str], &'static str) {
    match role {
        ColumnRole::Id => (&["uuid"], "uuid"),
        ColumnRole::Type
        | ColumnRole::Error
        | ColumnRole::RoutingKey
        | ColumnRole::Traceparent
        | ColumnRole::Tracestate => (STRING_TYPES, "text or varchar"),
        ColumnRole::Payload => (
            &["jsonb", "json", "text", "varchar", "bytea"],
            "jsonb, json, text or bytea",
        ),
        ColumnRole::OccurredAt | ColumnRole::ProcessedAt => {
            (TIME_TYPES, "timestamptz or timestamp")
        }
        ColumnRole::Headers => (&["jsonb", "json"], "jsonb or json"),
        ColumnRole::Attempts => (&["int2", "int4", "int8"], "an integer type"),
        // Compared as text: an aggregate id is usually one of these.
        ColumnRole::PartitionKey => (
            &["text", "varchar", "bpchar", "uuid", "int2", "int4", "int8"],
            "text, varchar, uuid or an integer type",
        ),
    }
}

/// Looks the table up (through the search path when it is not schema-qualified) and checks
/// every mapped column.
pub async fn inspect(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> Result<TableShape, InspectError> {
    inspect_with(conn, table, PoolMode::Session).await
}

/// [`inspect`] over a connection that reaches `pool_mode`; under a transaction pool the caller
/// runs it inside a transaction, since its statements then go unnamed.
pub async fn inspect_with(
    conn: &mut PgConnection,
    table: &OutboxTable,
    pool_mode: PoolMode,
) -> Result<TableShape, InspectError> {
    let persistent = pool_mode.named_statements();
    let exists: Option<bool> = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table.name.quoted())
        .persistent(persistent)
        .fetch_one(&mut *conn)
        .await?;
    if exists != Some(true) {
        return Err(InspectError::TableMissing(table.name.to_string()));
    }
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.attname::text, t.typname::text
           FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
          WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(table.name.quoted())
    .persistent(persistent)
    .fetch_all(&mut *conn)
    .await?;

    let mut missing = Vec::new();
    let mut payload = PayloadKind::Json;
    for (role, column) in table.columns.mapped() {
        let Some((_, found)) = columns.iter().find(|(name, _)| name == column.as_str()) else {
            missing.push((role.option().to_string(), column.to_string()));
            continue;
        };
        let (allowed, expected) = expected_types(role);
        if !allowed.contains(&found.as_str()) {
            return Err(InspectError::WrongType {
                option: role.option().to_string(),
                column: column.to_string(),
                found: found.clone(),
                expected,
            });
        }
        if role == ColumnRole::Payload {
            payload = match found.as_str() {
                "jsonb" | "json" => PayloadKind::Json,
                "bytea" => PayloadKind::Bytes,
                _ => PayloadKind::Text,
            };
        }
    }
    if !missing.is_empty() {
        return Err(InspectError::ColumnsMissing {
            table: table.name.to_string(),
            missing,
        });
    }
    let (encoding, server_autovacuum, single_heap, shared_frontier): (String, bool, bool, bool) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT current_setting('server_encoding'), {SERVER_AUTOVACUUM_SQL}, \
                    c.relkind = 'r' AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = c.oid), \
                    coalesce((SELECT has_sequence_privilege(s.oid, 'SELECT, UPDATE') \
                                FROM pg_class s WHERE s.oid = to_regclass($2) AND s.relkind = 'S'), false) \
               FROM pg_class c WHERE c.oid = to_regclass($1)"
        )))
        .bind(table.name.quoted())
        .bind(table.frontier_sequence().quoted())
        .persistent(persistent)
        .fetch_one(&mut *conn)
        .await?;
    Ok(TableShape {
        payload,
        raw_text: encoding.eq_ignore_ascii_case("SQL_ASCII"),
        server_autovacuum,
        single_heap,
        shared_frontier,
    })
}
