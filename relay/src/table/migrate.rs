//! The outbox migration: the pending-row index, the report table, autovacuum settings suited
//! to a queue table and, optionally, the NOTIFY trigger. Used by `outbox-relay migrate` and by
//! the operator, so both follow the same rules:
//! - indexes are built with `CREATE INDEX CONCURRENTLY`, one statement per round trip (it fails
//!   inside a transaction or a multi-statement string);
//! - an INVALID index left by a failed build is dropped and rebuilt (`IF NOT EXISTS` would keep
//!   it silently);
//! - migrations are serialised with `pg_try_advisory_lock`, never the blocking form, which
//!   deadlocks with a concurrent index build; a busy lock is reported so the caller retries.
//!   The one blocking lock, `pg_advisory_xact_lock` around the report table shared by a
//!   schema's outbox tables, is held only for that table's create-or-upgrade, never across an
//!   index build, so no build can wait on its holder.

use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::table::ident::{Ident, TableName};
use crate::table::inspect::{InspectError, TableShape, inspect};
use crate::table::outbox::OutboxTable;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationOptions {
    /// Build the reference article's covering index `(occurred, processed) INCLUDE (id, type,
    /// payload)`. Off by default: a B-tree entry is limited to 2704 bytes, so once a payload
    /// outgrows that every INSERT of such a row fails. `FOR UPDATE` visits the heap anyway, so
    /// the covering index buys little for the claim.
    pub covering_index: bool,
    /// Install a statement-level trigger that NOTIFYs idle relays when rows are inserted.
    pub notify: bool,
    /// Leave the table's autovacuum settings alone.
    pub skip_autovacuum: bool,
}

/// What happened to the pending-row index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexAction {
    Created,
    AlreadyValid,
    /// An INVALID index from an earlier failed build was dropped and built again.
    RebuiltInvalid,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    pub index_name: String,
    pub index: IndexAction,
    pub reports_table_created: bool,
    /// The sequence in which the table's relays share their claim frontier was created.
    pub frontier_created: bool,
    pub autovacuum_changed: bool,
    pub notify_installed: bool,
    /// Autovacuum is off on the server, so the table's settings above have no effect.
    pub server_autovacuum_off: bool,
}

/// What to tell a user whose server does not run autovacuum.
pub const AUTOVACUUM_OFF_WARNING: &str = "autovacuum is off on this PostgreSQL server \
    (autovacuum or track_counts = off): nothing reclaims the dead rows that processed rows leave, \
    so the outbox table and its pending index keep growing and claims slow down; turn autovacuum \
    on, or VACUUM the outbox table regularly";

impl MigrationReport {
    /// One line per action, for humans.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![match self.index {
            IndexAction::Created => format!("created index {}", self.index_name),
            IndexAction::AlreadyValid => {
                format!("index {} already present and valid", self.index_name)
            }
            IndexAction::RebuiltInvalid => {
                format!(
                    "index {} was INVALID (a failed earlier build); dropped and rebuilt it",
                    self.index_name
                )
            }
        }];
        lines.push(if self.reports_table_created {
            "created the lag report table".into()
        } else {
            "lag report table already present".into()
        });
        lines.push(if self.frontier_created {
            "created the claim frontier sequence the relays share".into()
        } else {
            "claim frontier sequence already present".into()
        });
        lines.push(if self.autovacuum_changed {
            "set queue-friendly autovacuum settings on the outbox table".into()
        } else {
            "autovacuum settings already in place (or skipped)".into()
        });
        if self.notify_installed {
            lines.push("installed the NOTIFY trigger".into());
        }
        if self.server_autovacuum_off {
            lines.push(format!("warning: {AUTOVACUUM_OFF_WARNING}"));
        }
        lines
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("another migration of this table holds the advisory lock; retry shortly")]
    LockBusy,
    #[error(transparent)]
    Table(#[from] InspectError),
    /// The id is the key of the settle statement and the AMQP `message_id`; duplicate ids
    /// would settle rows that were never published and defeat consumers' deduplication, so
    /// the migration refuses the table rather than index it. It is the user's table to fix.
    #[error(
        "invalid --id-column: column {column} of table {table} has no primary key or unique index: \
         settling by id and deduplicating by message_id need unique ids; add PRIMARY KEY ({column}) \
         or a unique index on it"
    )]
    IdNotUnique { table: String, column: String },
    #[error("migration statement failed ({step}): {source}")]
    Statement {
        step: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("database error during migration: {0}")]
    Database(#[from] sqlx::Error),
}

/// Autovacuum settings for a table that behaves like a queue: every row is inserted once,
/// updated (or deleted) once, and the claim walks the head of the pending index. The default
/// scale factor (20 % of the table) lets dead index entries pile up at that head for millions
/// of rows, and the claim slows with them; a fixed threshold keeps vacuum running every few
/// thousand processed rows, and no cost delay lets it keep pace.
pub const QUEUE_AUTOVACUUM: &[(&str, &str)] = &[
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "5000"),
    ("autovacuum_vacuum_insert_scale_factor", "0"),
    ("autovacuum_vacuum_insert_threshold", "50000"),
    ("autovacuum_analyze_scale_factor", "0.02"),
    ("autovacuum_vacuum_cost_delay", "0"),
];

/// The channel the NOTIFY trigger signals for a table.
pub fn notify_channel(table: &OutboxTable) -> String {
    let mut name = format!("outbox_{}", table.name).replace('.', "_");
    name.truncate(63);
    name
}

/// The advisory lock key text for migrations of one table (and for undoing them, see
/// [`crate::table::cleanup`], so a cleanup never races a migration of the same table).
pub(crate) fn lock_key(table: &OutboxTable) -> String {
    format!("outbox-relay:migrate:{}", table.name.quoted())
}

/// The pending-row index these options build ([`OutboxTable::pending_index`]).
pub fn index_name(table: &OutboxTable, options: &MigrationOptions) -> Ident {
    table.pending_index(options.covering_index)
}

/// The `CREATE INDEX CONCURRENTLY` statement, sent alone.
pub fn create_index_sql(table: &OutboxTable, options: &MigrationOptions) -> String {
    let c = &table.columns;
    let name = index_name(table, options).quoted();
    let t = table.name.quoted();
    let (occurred, processed) = (c.occurred_at.quoted(), c.processed_at.quoted());
    if options.covering_index {
        format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {t} ({occurred}, {processed}) \
             INCLUDE ({}, {}, {}) WHERE {processed} IS NULL",
            c.id.quoted(),
            c.kind.quoted(),
            c.payload.quoted()
        )
    } else {
        format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {t} ({occurred}) INCLUDE ({}) \
             WHERE {processed} IS NULL",
            c.id.quoted()
        )
    }
}

pub(crate) fn qualified(table: &OutboxTable, object: &Ident) -> String {
    match &table.name.schema {
        Some(schema) => format!("{}.{}", schema.quoted(), object.quoted()),
        None => object.quoted(),
    }
}

/// Runs the migration. Idempotent; returns what it did. Holds the advisory lock on `conn` only
/// for its duration.
pub async fn migrate(
    conn: &mut PgConnection,
    table: &OutboxTable,
    options: &MigrationOptions,
) -> Result<MigrationReport, MigrateError> {
    let shape = inspect(conn, table).await?;
    if !id_is_unique(conn, table).await? {
        return Err(MigrateError::IdNotUnique {
            table: table.name.to_string(),
            column: table.columns.id.to_string(),
        });
    }
    let key = lock_key(table);
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(&key)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Err(MigrateError::LockBusy);
    }
    let result = migrate_locked(conn, table, options, &shape).await;
    // Unlock whatever happened; if the connection is gone, the lock went with it.
    let _ = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut *conn)
        .await;
    result
}

/// True when a valid, non-partial unique index (a primary key, a UNIQUE constraint or a
/// unique index) has the id column as its only key column: only that guarantees no two rows
/// share an id. A composite unique key such as (id, tenant) does not.
async fn id_is_unique(conn: &mut PgConnection, table: &OutboxTable) -> Result<bool, MigrateError> {
    let unique: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_index i \
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
          WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid \
            AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL \
            AND a.attname = $2)",
    )
    .bind(table.name.quoted())
    .bind(table.columns.id.to_string())
    .fetch_one(&mut *conn)
    .await?;
    Ok(unique)
}

async fn run_alone(
    conn: &mut PgConnection,
    step: &'static str,
    sql: String,
) -> Result<(), MigrateError> {
    // raw_sql uses the simple protocol; each call carries exactly one statement.
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|source| MigrateError::Statement { step, source })
}

async fn migrate_locked(
    conn: &mut PgConnection,
    table: &OutboxTable,
    options: &MigrationOptions,
    shape: &TableShape,
) -> Result<MigrationReport, MigrateError> {
    let index = index_name(table, options);
    let qualified_index = qualified(table, &index);

    let validity: Option<bool> = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
    )
    .bind(&qualified_index)
    .fetch_optional(&mut *conn)
    .await?;
    let action = match validity {
        Some(true) => IndexAction::AlreadyValid,
        Some(false) => {
            run_alone(
                conn,
                "drop invalid index",
                format!("DROP INDEX CONCURRENTLY IF EXISTS {qualified_index}"),
            )
            .await?;
            run_alone(conn, "create index", create_index_sql(table, options)).await?;
            IndexAction::RebuiltInvalid
        }
        None => {
            run_alone(conn, "create index", create_index_sql(table, options)).await?;
            IndexAction::Created
        }
    };

    let reports_created =
        ensure_reports_table(conn, &table.reports_table(), &table.limits_table()).await?;

    let frontier_created = ensure_frontier_sequence(conn, table).await?;

    let autovacuum_changed = !options.skip_autovacuum && apply_autovacuum(conn, table).await?;

    if options.notify {
        for (step, sql) in notify_trigger_sql(table) {
            run_alone(conn, step, sql).await?;
        }
    }

    Ok(MigrationReport {
        index_name: index.to_string(),
        index: action,
        reports_table_created: reports_created,
        frontier_created,
        autovacuum_changed,
        notify_installed: options.notify,
        server_autovacuum_off: !shape.server_autovacuum,
    })
}

/// Creates the sequence where the table's relays share their claim frontier, unless it exists;
/// true when it was created. Owned by the table (dropped with it); starting at 0, which no claim
/// position precedes, so a fresh sequence moves no seek.
async fn ensure_frontier_sequence(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> Result<bool, MigrateError> {
    let sequence = table.frontier_sequence().quoted();
    let existed: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&sequence)
        .fetch_one(&mut *conn)
        .await?;
    if existed {
        return Ok(false);
    }
    run_alone(
        conn,
        "create claim frontier sequence",
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint MINVALUE 0 START WITH 0 \
             OWNED BY {}.{}",
            table.name.quoted(),
            table.columns.id.quoted()
        ),
    )
    .await?;
    Ok(true)
}

/// Creates the report table, or brings one made by an earlier version up to date; true when it
/// was created. The table is shared by every outbox table of its schema while the migration's
/// advisory lock is per outbox table, so the first migrations of a fresh schema would race on
/// `CREATE TABLE IF NOT EXISTS` (the loser fails on pg_type's unique index). A transaction-level
/// lock on the report table's name serialises just this step: it holds no table lock another
/// session waits on, and is over in milliseconds.
async fn ensure_reports_table(
    conn: &mut PgConnection,
    reports: &TableName,
    limits: &TableName,
) -> Result<bool, MigrateError> {
    let step = "create or upgrade report table";
    let failed = |source: sqlx::Error| MigrateError::Statement { step, source };
    let mut tx = conn.begin().await.map_err(failed)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-relay:reports:{}", reports.quoted()))
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    let existed: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(reports.quoted())
        .fetch_one(&mut *tx)
        .await
        .map_err(failed)?;
    let sql = if existed {
        crate::table::reports::upgrade_table_sql(reports)
    } else {
        crate::table::reports::create_table_sql(reports)
    };
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    // The limits table (issue 47) is shared by the schema's relays like the report table, so
    // it is created under the same lock; added, never changed, so relays of the previous
    // release, which do not know it, run beside it.
    sqlx::raw_sql(AssertSqlSafe(crate::table::limits::create_table_sql(
        limits,
    )))
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    Ok(!existed)
}

/// Sets [`QUEUE_AUTOVACUUM`] when the table does not already carry it; true when it changed.
async fn apply_autovacuum(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> Result<bool, MigrateError> {
    let current: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)")
            .bind(table.name.quoted())
            .fetch_optional(&mut *conn)
            .await?
            .flatten();
    let current = current.unwrap_or_default();
    let wanted: Vec<String> = QUEUE_AUTOVACUUM
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if wanted.iter().all(|w| current.contains(w)) {
        return Ok(false);
    }
    let settings = QUEUE_AUTOVACUUM
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    run_alone(
        conn,
        "set autovacuum",
        format!("ALTER TABLE {} SET ({settings})", table.name.quoted()),
    )
    .await?;
    Ok(true)
}

/// The name of the NOTIFY trigger and of its function (in the table's schema): derived from
/// the table, so each outbox table has its own pair.
pub fn notify_object_name(table: &OutboxTable) -> Ident {
    table.name.derived("outbox_notify")
}

/// The trigger function and trigger that wake LISTENing relays. Statement-level, so a bulk
/// insert costs one notification.
pub fn notify_trigger_sql(table: &OutboxTable) -> Vec<(&'static str, String)> {
    let function = qualified(table, &notify_object_name(table));
    let trigger_name = notify_object_name(table);
    let trigger = trigger_name.quoted();
    let channel = notify_channel(table);
    vec![
        (
            "create notify function",
            format!(
                "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS \
                 $fn$ BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $fn$"
            ),
        ),
        (
            "create notify trigger",
            // `CREATE OR REPLACE TRIGGER` is PostgreSQL 14+, and dropping then creating would
            // take an ACCESS EXCLUSIVE lock on a busy table on every run. The trigger's
            // definition never changes (the function above is what a new version replaces), so
            // it is created only when missing; idents have no quote, so they are safe literals.
            format!(
                "DO $do$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_trigger \
                 WHERE tgrelid = '{table}'::regclass AND tgname = '{name}' AND NOT tgisinternal) \
                 THEN CREATE TRIGGER {trigger} AFTER INSERT ON {table} \
                 FOR EACH STATEMENT EXECUTE FUNCTION {function}(); END IF; END $do$",
                table = table.name.quoted(),
                name = trigger_name.as_str(),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::TableName;

    #[test]
    fn default_index_keeps_the_payload_out() {
        let table = OutboxTable::new(TableName::parse("outbox_messages").unwrap());
        let sql = create_index_sql(&table, &MigrationOptions::default());
        assert_eq!(
            sql,
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"outbox_messages_pending_idx\" ON \"outbox_messages\" \
             (\"occurred_on_utc\") INCLUDE (\"id\") WHERE \"processed_on_utc\" IS NULL"
        );
        assert!(!sql.contains("content"));
    }

    #[test]
    fn a_server_without_autovacuum_is_reported_as_a_warning() {
        let mut report = MigrationReport {
            index_name: "i".into(),
            index: IndexAction::AlreadyValid,
            reports_table_created: false,
            frontier_created: false,
            autovacuum_changed: false,
            notify_installed: false,
            server_autovacuum_off: false,
        };
        assert!(
            !report
                .lines()
                .iter()
                .any(|l| l.contains("autovacuum is off"))
        );
        report.server_autovacuum_off = true;
        let last = report.lines().pop().unwrap();
        assert!(last.starts_with("warning: autovacuum is off"), "{last}");
        assert!(last.contains("VACUUM the outbox table"), "{last}");
    }

    #[test]
    fn covering_index_is_the_articles() {
        let table = OutboxTable::new(TableName::parse("s.o").unwrap());
        let options = MigrationOptions {
            covering_index: true,
            ..Default::default()
        };
        let sql = create_index_sql(&table, &options);
        assert!(sql.contains("ON \"s\".\"o\" (\"occurred_on_utc\", \"processed_on_utc\") INCLUDE (\"id\", \"type\", \"content\")"));
    }

    #[test]
    fn notify_channel_is_a_plain_name() {
        let table = OutboxTable::new(TableName::parse("app.events").unwrap());
        assert_eq!(notify_channel(&table), "outbox_app_events");
    }
}
