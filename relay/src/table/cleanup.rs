//! Undoing the outbox migration of one table ([`crate::table::migrate`]), for the operator
//! when an OutboxRelay with `cleanupPolicy: delete` is deleted: the pending-row index, the
//! NOTIFY trigger and its function, the claim frontier sequence, the relay's rows in the report
//! table, and the autovacuum settings the migration set. The outbox table and its rows are never touched, nor is the
//! report table itself (every outbox table of the schema shares it).
//!
//! Every object is named exactly as the migration names it, and the same advisory lock
//! serialises the two, so a cleanup never races a migration of the same table. Each statement
//! runs under a short `lock_timeout`: dropping a trigger needs an ACCESS EXCLUSIVE lock on a
//! busy table, and a cleanup must fail (and be retried) rather than queue every writer of the
//! table behind a long transaction.

use sqlx::{AssertSqlSafe, PgConnection};

use crate::table::migrate::{
    MigrationOptions, QUEUE_AUTOVACUUM, index_name, lock_key, notify_object_name, qualified,
};
use crate::table::outbox::OutboxTable;

/// How long one statement may wait for a lock before the cleanup gives up this attempt.
const LOCK_TIMEOUT: &str = "5s";

/// What a cleanup removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// The pending-row index, when it existed and was dropped.
    pub index_dropped: Option<String>,
    pub trigger_dropped: bool,
    /// The claim frontier sequence the table's relays shared.
    pub frontier_dropped: bool,
    pub function_dropped: bool,
    /// The NOTIFY function stayed because another trigger still calls it.
    pub function_in_use: bool,
    pub report_rows_deleted: u64,
    /// The autovacuum settings reset to the server's defaults.
    pub autovacuum_reset: Vec<String>,
    /// The outbox table no longer exists (its index and trigger went with it).
    pub table_missing: bool,
}

impl CleanupReport {
    /// One line per action, for humans.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.table_missing {
            lines.push("the outbox table no longer exists".to_string());
        }
        if let Some(index) = &self.index_dropped {
            lines.push(format!("dropped index {index}"));
        }
        if self.trigger_dropped {
            lines.push("dropped the NOTIFY trigger".to_string());
        }
        if self.frontier_dropped {
            lines.push("dropped the claim frontier sequence".to_string());
        }
        if self.function_dropped {
            lines.push("dropped the NOTIFY function".to_string());
        }
        if self.function_in_use {
            lines.push("kept the NOTIFY function: another trigger still calls it".to_string());
        }
        if self.report_rows_deleted > 0 {
            lines.push(format!(
                "deleted {} report row(s) of the relay",
                self.report_rows_deleted
            ));
        }
        if !self.autovacuum_reset.is_empty() {
            lines.push(format!(
                "reset {} on the outbox table",
                self.autovacuum_reset.join(", ")
            ));
        }
        if lines.is_empty() {
            lines.push("nothing of the migration was left to remove".to_string());
        }
        lines
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("a migration of this table holds the advisory lock; retry shortly")]
    LockBusy,
    #[error("cleanup statement failed ({step}): {source}")]
    Statement {
        step: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl CleanupError {
    /// The driver's error, when one caused this (to tell a lost connection from a refusal).
    pub fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            Self::LockBusy => None,
            Self::Statement { source, .. } => Some(source),
        }
    }
}

/// Removes what [`crate::table::migrate::migrate`] created for `table` with `options`, and the
/// report rows of `relay` (the name its pods report under). Idempotent: what is already gone
/// is skipped, so a retry after a failure finishes the job.
pub async fn remove_migration(
    conn: &mut PgConnection,
    table: &OutboxTable,
    options: &MigrationOptions,
    relay: &str,
) -> Result<CleanupReport, CleanupError> {
    let key = lock_key(table);
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(&key)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed("take the migration lock"))?;
    if !locked {
        return Err(CleanupError::LockBusy);
    }
    let result = remove_locked(conn, table, options, relay).await;
    // Unlock and restore the session whatever happened; a lost connection took both along.
    let _ = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut *conn)
        .await;
    let _ = sqlx::raw_sql("RESET lock_timeout")
        .execute(&mut *conn)
        .await;
    result
}

async fn remove_locked(
    conn: &mut PgConnection,
    table: &OutboxTable,
    options: &MigrationOptions,
    relay: &str,
) -> Result<CleanupReport, CleanupError> {
    run(
        conn,
        "set lock_timeout",
        format!("SET lock_timeout = '{LOCK_TIMEOUT}'"),
    )
    .await?;
    let mut report = CleanupReport::default();
    let table_exists = exists(conn, "to_regclass", table.name.quoted()).await?;
    report.table_missing = !table_exists;
    if table_exists {
        drop_notify_trigger(conn, table, &mut report).await?;
        let index = qualified(table, &index_name(table, options));
        if exists(conn, "to_regclass", index.clone()).await? {
            run(
                conn,
                "drop index",
                format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"),
            )
            .await?;
            report.index_dropped = Some(index_name(table, options).to_string());
        }
        let sequence = table.frontier_sequence().quoted();
        if exists(conn, "to_regclass", sequence.clone()).await? {
            run(
                conn,
                "drop claim frontier sequence",
                format!("DROP SEQUENCE IF EXISTS {sequence}"),
            )
            .await?;
            report.frontier_dropped = true;
        }
        if !options.skip_autovacuum {
            report.autovacuum_reset = reset_autovacuum(conn, table).await?;
        }
    }
    drop_notify_function(conn, table, &mut report).await?;
    report.report_rows_deleted = delete_report_rows(conn, table, relay).await?;
    Ok(report)
}

/// Drops the trigger only when it is there: `DROP TRIGGER IF EXISTS` would take the table's
/// ACCESS EXCLUSIVE lock even when there is nothing to drop. The trigger is dropped whatever
/// `notifyTrigger` says now: it may have been on in an earlier generation, and its name is
/// this table's own.
async fn drop_notify_trigger(
    conn: &mut PgConnection,
    table: &OutboxTable,
    report: &mut CleanupReport,
) -> Result<(), CleanupError> {
    let name = notify_object_name(table);
    let present: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger \
          WHERE tgrelid = to_regclass($1) AND tgname = $2 AND NOT tgisinternal)",
    )
    .bind(table.name.quoted())
    .bind(name.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(failed("find the NOTIFY trigger"))?;
    if present {
        run(
            conn,
            "drop notify trigger",
            format!(
                "DROP TRIGGER IF EXISTS {} ON {}",
                name.quoted(),
                table.name.quoted()
            ),
        )
        .await?;
        report.trigger_dropped = true;
    }
    Ok(())
}

/// Drops the trigger function unless another trigger still calls it: without CASCADE,
/// PostgreSQL refuses (2BP01) to drop a function something depends on, which is exactly the
/// check wanted, made atomically by the server.
async fn drop_notify_function(
    conn: &mut PgConnection,
    table: &OutboxTable,
    report: &mut CleanupReport,
) -> Result<(), CleanupError> {
    let function = format!("{}()", qualified(table, &notify_object_name(table)));
    if !exists(conn, "to_regprocedure", function.clone()).await? {
        return Ok(());
    }
    let dropped = sqlx::raw_sql(AssertSqlSafe(format!("DROP FUNCTION IF EXISTS {function}")))
        .execute(&mut *conn)
        .await;
    match dropped {
        Ok(_) => report.function_dropped = true,
        Err(e) if sql_state(&e).as_deref() == Some(DEPENDENT_OBJECTS_STILL_EXIST) => {
            report.function_in_use = true;
        }
        Err(source) => {
            return Err(CleanupError::Statement {
                step: "drop notify function",
                source,
            });
        }
    }
    Ok(())
}

/// Resets the [`QUEUE_AUTOVACUUM`] settings that still hold the migration's value; one the
/// user changed since is theirs and stays.
async fn reset_autovacuum(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> Result<Vec<String>, CleanupError> {
    let current: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)")
            .bind(table.name.quoted())
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed("read the autovacuum settings"))?
            .flatten();
    let current = current.unwrap_or_default();
    let ours: Vec<String> = QUEUE_AUTOVACUUM
        .iter()
        .filter(|(key, value)| current.contains(&format!("{key}={value}")))
        .map(|(key, _)| key.to_string())
        .collect();
    if !ours.is_empty() {
        run(
            conn,
            "reset autovacuum",
            format!(
                "ALTER TABLE {} RESET ({})",
                table.name.quoted(),
                ours.join(", ")
            ),
        )
        .await?;
    }
    Ok(ours)
}

/// Deletes `relay`'s rows from the schema's report table, which other outbox tables share.
async fn delete_report_rows(
    conn: &mut PgConnection,
    table: &OutboxTable,
    relay: &str,
) -> Result<u64, CleanupError> {
    let reports = table.reports_table().quoted();
    if !exists(conn, "to_regclass", reports.clone()).await? {
        return Ok(0);
    }
    let deleted = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {reports} WHERE relay = $1"
    )))
    .bind(relay)
    .execute(&mut *conn)
    .await
    .map_err(failed("delete the report rows"))?;
    crate::table::limits::delete_share(conn, &table.limits_table(), relay)
        .await
        .map_err(failed("delete the rate-limit share"))?;
    Ok(deleted.rows_affected())
}

/// Whether `lookup` (`to_regclass` or `to_regprocedure`) finds `name`.
async fn exists(
    conn: &mut PgConnection,
    lookup: &'static str,
    name: String,
) -> Result<bool, CleanupError> {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT {lookup}($1) IS NOT NULL")))
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed("look up an object"))
}

/// One statement, alone (the simple protocol; `DROP INDEX CONCURRENTLY` refuses to run inside
/// a transaction or a multi-statement string).
async fn run(conn: &mut PgConnection, step: &'static str, sql: String) -> Result<(), CleanupError> {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .map(drop)
        .map_err(failed(step))
}

fn failed(step: &'static str) -> impl FnOnce(sqlx::Error) -> CleanupError {
    move |source| CleanupError::Statement { step, source }
}

const DEPENDENT_OBJECTS_STILL_EXIST: &str = "2BP01";

fn sql_state(error: &sqlx::Error) -> Option<String> {
    let code = error.as_database_error()?.code()?;
    Some(code.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cleanup_says_so() {
        assert_eq!(
            CleanupReport::default().lines(),
            vec!["nothing of the migration was left to remove"]
        );
    }

    #[test]
    fn the_report_names_each_removal() {
        let report = CleanupReport {
            index_dropped: Some("orders_pending_idx".into()),
            trigger_dropped: true,
            frontier_dropped: true,
            function_dropped: true,
            report_rows_deleted: 2,
            autovacuum_reset: vec!["autovacuum_vacuum_threshold".into()],
            ..Default::default()
        };
        let text = report.lines().join("; ");
        assert_eq!(
            text,
            "dropped index orders_pending_idx; dropped the NOTIFY trigger; dropped the claim \
             frontier sequence; dropped the NOTIFY function; deleted 2 report row(s) of the relay; reset autovacuum_vacuum_threshold \
             on the outbox table"
        );
    }
}
