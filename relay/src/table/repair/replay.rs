//! Replay (issue 47): send again rows the relay already delivered, by making them pending
//! again where they are.
//!
//! A delivered row is one the relay settled without an error: its processed-at column is set
//! and its error column is NULL (a dead letter has an error; `dead-letters requeue` is its
//! command). Replaying it sets processed-at and error back to NULL and attempts (when mapped)
//! to 0, so the running relay sends it like any pending row: with its own id as `message_id`
//! and at its own claim position, before newer pending rows. When the table has a headers
//! column, [`REPLAY_HEADER`] is merged into the row's headers, so the consumer can tell a
//! replay from the first delivery.
//!
//! The selection is walked in claim order, (claim-order column, id), by keyset pages: each page
//! reads the next ids after the last one seen (one read-only statement, no lock), and its ids
//! are reset in batches, each its own short transaction under a lock timeout. Nothing holds a
//! transaction across batches (a long one would keep VACUUM back on a table the relay churns),
//! and the statements touch only settled rows, which the relay's claims never lock.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use uuid::Uuid;

use crate::table::outbox::OutboxTable;
use crate::table::repair::quoted::QuotedTable;

/// The header a replayed message carries: the RFC 3339 time of the replay run. The relay sends
/// the headers column as AMQP 0-9-1 headers and as AMQP 1.0 application properties, like its
/// own `x-outbox-error` on dead letters. One value for every row of a run, so
/// (`message_id`, this header) names one delivery of one replay.
pub const REPLAY_HEADER: &str = "x-outbox-replay";

/// How long one batch waits for a row lock (a retention purge or another command holding the
/// row) before the replay stops, rather than queueing behind it.
const LOCK_TIMEOUT: &str = "5s";

/// Ids read per page of the walk: one pass over the table's settled rows per page (the
/// pending-row index does not cover them), so a page holds many batches.
const PAGE_BATCHES: usize = 50;

/// Which delivered rows to replay: every given part must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Claim-order range, from inclusive, to exclusive; None: open.
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Message types; empty: any.
    pub types: Vec<String>,
    /// Partition keys, compared as text; empty: any. Needs the partition-key column.
    pub keys: Vec<String>,
    /// Ids; empty: any.
    pub ids: Vec<Uuid>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.since.is_none()
            && self.until.is_none()
            && self.types.is_empty()
            && self.keys.is_empty()
            && self.ids.is_empty()
    }
}

/// The SQL pieces every statement here needs, quoted once.
struct Sql(QuotedTable);

impl std::ops::Deref for Sql {
    type Target = QuotedTable;

    fn deref(&self) -> &QuotedTable {
        &self.0
    }
}

impl Sql {
    fn new(table: &OutboxTable) -> Self {
        Self(QuotedTable::new(table))
    }

    /// Delivered rows: settled without an error. A row without a claim position is left out:
    /// the walk orders by it.
    fn delivered(&self) -> String {
        format!(
            "{processed} IS NOT NULL AND {error} IS NULL AND {occurred} IS NOT NULL",
            processed = self.processed,
            error = self.error,
            occurred = self.occurred,
        )
    }

    /// The delivered rows a [`Selection`] picks: `$1`/`$2 timestamptz` (range, NULL: open),
    /// `$3 text[]` types, `$4 text[]` keys, `$5 uuid[]` ids (empty: any). Without a
    /// partition-key column the keys must be empty (the command refuses `--key` before).
    fn selected(&self) -> String {
        let key = self.key.as_ref().map_or_else(
            || "cardinality($4::text[]) = 0".to_string(),
            |key| format!("(cardinality($4::text[]) = 0 OR {key}::text = ANY($4::text[]))"),
        );
        format!(
            "{delivered} AND ($1::timestamptz IS NULL OR {occurred} >= $1::timestamptz) \
             AND ($2::timestamptz IS NULL OR {occurred} < $2::timestamptz) \
             AND (cardinality($3::text[]) = 0 OR {kind}::text = ANY($3::text[])) \
             AND {key} AND (cardinality($5::uuid[]) = 0 OR {id} = ANY($5::uuid[]))",
            delivered = self.delivered(),
            occurred = self.occurred,
            kind = self.kind,
            id = self.id,
        )
    }

    /// What a replayed row gets: pending again, attempts reset, the replay header (`$6 text`)
    /// merged into its headers. Headers that are not an object cannot have been delivered
    /// (the relay dead-letters them), so NULL and JSON null become a new object.
    fn reset(&self) -> String {
        let mut set = format!("{} = NULL, {} = NULL", self.processed, self.error);
        if let Some(attempts) = &self.attempts {
            let _ = write!(set, ", {attempts} = 0");
        }
        if let Some(headers) = &self.headers {
            // jsonb → json is an assignment cast, so a json column takes the result too.
            let _ = write!(
                set,
                ", {headers} = CASE WHEN jsonb_typeof({headers}::jsonb) = 'object' \
                 THEN {headers}::jsonb ELSE '{{}}'::jsonb END \
                 || jsonb_build_object('{REPLAY_HEADER}', $6::text)"
            );
        }
        set
    }
}

fn bind_selection<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    selection: &Selection,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(selection.since)
        .bind(selection.until)
        .bind(selection.types.clone())
        .bind(selection.keys.clone())
        .bind(selection.ids.clone())
}

/// The rows of one message type in a selection.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeCount {
    pub kind: String,
    pub rows: i64,
}

/// How many delivered rows a selection holds, their span in claim order and their types.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preview {
    pub rows: i64,
    pub oldest: Option<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
    /// The largest type first.
    pub types: Vec<TypeCount>,
}

/// Counts the selection by type in one read-only statement, writing nothing.
pub async fn preview(
    conn: &mut PgConnection,
    table: &OutboxTable,
    selection: &Selection,
) -> Result<Preview, sqlx::Error> {
    let sql = Sql::new(table);
    let statement = format!(
        "SELECT {kind}::text, count(*), min({occurred})::timestamptz, max({occurred})::timestamptz \
         FROM {table} WHERE {selected} GROUP BY 1",
        kind = sql.kind,
        occurred = sql.occurred,
        table = sql.table,
        selected = sql.selected(),
    );
    let rows = bind_selection(sqlx::query(AssertSqlSafe(statement)), selection)
        .fetch_all(&mut *conn)
        .await?;
    let mut preview = Preview::default();
    let mut types = BTreeMap::new();
    for row in rows {
        let kind: Option<String> = row.try_get(0)?;
        let count: i64 = row.try_get(1)?;
        let oldest: Option<DateTime<Utc>> = row.try_get(2)?;
        let newest: Option<DateTime<Utc>> = row.try_get(3)?;
        preview.rows += count;
        preview.oldest = [preview.oldest, oldest].into_iter().flatten().min();
        preview.newest = [preview.newest, newest].into_iter().flatten().max();
        *types.entry(kind.unwrap_or_default()).or_insert(0) += count;
    }
    preview.types = types
        .into_iter()
        .map(|(kind, rows)| TypeCount { kind, rows })
        .collect();
    preview
        .types
        .sort_by(|a, b| b.rows.cmp(&a.rows).then_with(|| a.kind.cmp(&b.kind)));
    Ok(preview)
}

/// Whether the table holds any settled row at all: when it holds none, the relay deletes
/// what it delivers (delete mode) or a retention purged everything.
pub async fn any_settled(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> Result<bool, sqlx::Error> {
    let sql = Sql::new(table);
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE {processed} IS NOT NULL)",
        table = sql.table,
        processed = sql.processed,
    )))
    .fetch_one(&mut *conn)
    .await
}

/// Where the walk is: the last row reset, in claim order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    pub occurred: DateTime<Utc>,
    pub id: Uuid,
}

/// How far a replay got.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// Rows made pending again so far.
    pub rows: u64,
    /// The last row of the last committed batch.
    pub position: Option<Position>,
}

/// A replay that stopped: how far it got, and why.
#[derive(Debug)]
pub struct Stopped {
    pub progress: Progress,
    pub error: sqlx::Error,
}

/// Replays the selection in batches of `batch` rows, oldest first in claim order, each batch
/// its own transaction (see the module's docs). `replayed_at` is the header's value.
/// `progress` is told the running total and position after every batch.
pub async fn apply(
    conn: &mut PgConnection,
    table: &OutboxTable,
    selection: &Selection,
    batch: usize,
    replayed_at: &str,
    mut progress: impl FnMut(Progress),
) -> Result<Progress, Stopped> {
    let sql = Sql::new(table);
    let batch = batch.max(1);
    let page_size = i64::try_from(batch.saturating_mul(PAGE_BATCHES)).unwrap_or(i64::MAX);
    // The next page: after the position ($6, $7; NULL: from the start), in claim order. The
    // row comparison on (claim order, id) makes the walk total even among equal times.
    let page_statement = format!(
        "SELECT {occurred}::timestamptz, {id} FROM {table} WHERE {selected} \
         AND ($6::timestamptz IS NULL OR ({occurred}, {id}) > ($6::timestamptz, $7::uuid)) \
         ORDER BY {occurred}, {id} LIMIT $8",
        occurred = sql.occurred,
        id = sql.id,
        table = sql.table,
        selected = sql.selected(),
    );
    // Checks each row again: one the relay or another command changed since the page was read
    // (no longer delivered) is left alone.
    let reset_statement = format!(
        "UPDATE {table} SET {set} WHERE {id} = ANY($7::uuid[]) AND {selected}",
        table = sql.table,
        set = sql.reset(),
        id = sql.id,
        selected = sql.selected(),
    );
    let mut done = Progress::default();
    loop {
        let after = done.position;
        let page = match read_page(conn, &page_statement, selection, after, page_size).await {
            Ok(page) => page,
            Err(error) => {
                return Err(Stopped {
                    progress: done,
                    error,
                });
            }
        };
        for chunk in page.chunks(batch) {
            let ids: Vec<Uuid> = chunk.iter().map(|(_, id)| *id).collect();
            let reset = reset_batch(conn, &reset_statement, selection, replayed_at, ids).await;
            match reset {
                Ok(rows) => {
                    done.rows += rows;
                    let (occurred, id) = chunk[chunk.len() - 1];
                    done.position = Some(Position { occurred, id });
                    progress(done);
                }
                Err(error) => {
                    return Err(Stopped {
                        progress: done,
                        error,
                    });
                }
            }
        }
        if page.len() < usize::try_from(page_size).unwrap_or(usize::MAX) {
            return Ok(done);
        }
    }
}

/// The next page of the walk after `after`: (claim position, id), in claim order.
async fn read_page(
    conn: &mut PgConnection,
    statement: &str,
    selection: &Selection,
    after: Option<Position>,
    limit: i64,
) -> Result<Vec<(DateTime<Utc>, Uuid)>, sqlx::Error> {
    let rows = bind_selection(sqlx::query(AssertSqlSafe(statement.to_string())), selection)
        .bind(after.map(|p| p.occurred))
        .bind(after.map(|p| p.id))
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// One batch in its own transaction, waiting at most [`LOCK_TIMEOUT`] for a row lock.
async fn reset_batch(
    conn: &mut PgConnection,
    statement: &str,
    selection: &Selection,
    replayed_at: &str,
    ids: Vec<Uuid>,
) -> Result<u64, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
    )))
    .execute(&mut *tx)
    .await?;
    let result = bind_selection(sqlx::query(AssertSqlSafe(statement.to_string())), selection)
        .bind(replayed_at)
        .bind(ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(result.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::{Ident, TableName};

    fn table() -> OutboxTable {
        OutboxTable::new(TableName::parse("outbox").unwrap())
    }

    #[test]
    fn the_reset_touches_only_delivered_rows_and_marks_them_when_it_can() {
        let mut t = table();
        let plain = Sql::new(&t);
        assert!(plain.selected().starts_with(
            "\"processed_on_utc\" IS NOT NULL AND \"error\" IS NULL AND \"occurred_on_utc\" IS NOT NULL"
        ));
        assert_eq!(
            plain.reset(),
            "\"processed_on_utc\" = NULL, \"error\" = NULL"
        );
        assert!(plain.selected().contains("cardinality($4::text[]) = 0 AND"));
        t.columns.headers = Some(Ident::new("h").unwrap());
        t.columns.attempts = Some(Ident::new("n").unwrap());
        t.columns.partition_key = Some(Ident::new("k").unwrap());
        let full = Sql::new(&t);
        let reset = full.reset();
        assert!(reset.contains("\"n\" = 0"), "{reset}");
        assert!(
            reset.ends_with("|| jsonb_build_object('x-outbox-replay', $6::text)"),
            "{reset}"
        );
        assert!(full.selected().contains("\"k\"::text = ANY($4::text[])"));
    }

    #[test]
    fn an_empty_selection_is_empty() {
        assert!(Selection::default().is_empty());
        let typed = Selection {
            types: vec!["a".into()],
            ..Default::default()
        };
        assert!(!typed.is_empty());
    }
}
