//! Dead letters handled in bulk (issue 47): group the dead-lettered rows by cause, send a
//! group again, or settle it for good.
//!
//! A dead-lettered row is one the relay gave up on: its processed-at column is set and its
//! error column holds why (see `protocol::settle::RowError`). A row settled by `discard` keeps
//! its processed-at and gets [`DISCARDED_PREFIX`] before its error, so the previous release,
//! which reads the same columns, sees a processed row, and `list` no longer shows it.
//!
//! The cause of a row is the *class* of its error text ([`classify`]): the text with every
//! quoted value and every word holding a digit (ids, counts, reply codes, timestamps) replaced,
//! so one cause met by many rows with different ids is one group. A group is named by a hash
//! of its class ([`group_name`]): the same cause has the same name on every run and release.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection, Row};
use uuid::Uuid;

use crate::table::outbox::OutboxTable;
use crate::table::repair::quoted::QuotedTable;

/// What `discard` puts before a row's error. `list`, `requeue` and `discard` leave such rows
/// alone; the text after it is the row's error as the relay wrote it.
pub const DISCARDED_PREFIX: &str = "discarded (outbox-relay dead-letters discard): ";

/// Stands for a quoted value in a class.
const VALUE: &str = "'…'";
/// Stands for a word holding a digit (a number, an id, a timestamp) in a class.
const NUMBER: &str = "#";

/// The class of an error text: quoted values ('…' or "…") become `'…'`, every word (a run of
/// letters, digits, `-`, `_`, `.`, `:`) holding a digit becomes `#`, runs of white space become
/// one space. `attempt 3/5: returned by the broker as unroutable: 312 NO_ROUTE` and the same
/// refusal after 7 attempts have one class.
pub fn classify(error: &str) -> String {
    let mut class = String::with_capacity(error.len());
    let mut chars = error.chars().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, class: &mut String| {
        if word.chars().any(|c| c.is_ascii_digit()) {
            class.push_str(NUMBER);
        } else {
            class.push_str(word);
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') {
            word.push(c);
            continue;
        }
        // A word ends before punctuation; a trailing `.` or `:` is punctuation, not part of it.
        let mut tail = String::new();
        while word.ends_with(['.', ':']) {
            tail.insert(0, word.pop().unwrap_or_default());
        }
        flush(&mut word, &mut class);
        class.push_str(&tail);
        match c {
            '\'' | '"' => {
                // A quoted value up to its closing quote; an unclosed quote takes the rest.
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                }
                class.push_str(VALUE);
            }
            c if c.is_whitespace() => {
                while chars.peek().is_some_and(|n| n.is_whitespace()) {
                    chars.next();
                }
                class.push(' ');
            }
            c => class.push(c),
        }
    }
    let mut tail = String::new();
    while word.ends_with(['.', ':']) {
        tail.insert(0, word.pop().unwrap_or_default());
    }
    flush(&mut word, &mut class);
    class.push_str(&tail);
    class.trim().to_string()
}

/// The short stable name of a class: `g` and 8 hex digits of its 64-bit FNV-1a hash. Written
/// out here (not a library's hasher, whose output may change between versions) so a name seen
/// in one run is valid in the next and in the next release.
pub fn group_name(class: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in class.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("g{:08x}", hash >> 32)
}

/// One cause: its dead letters' count and span in claim order, and the error texts it covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: String,
    pub class: String,
    pub rows: i64,
    pub oldest: Option<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
    /// The distinct error texts of the group: `requeue` and `discard` select by them.
    pub errors: Vec<String>,
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

    /// The rows that are dead letters: settled with an error, not discarded.
    fn dead(&self) -> String {
        // `left(…) <>` rather than LIKE: the prefix has no wildcard to escape this way.
        format!(
            "{processed} IS NOT NULL AND {error} IS NOT NULL \
             AND left({error}, {len}) <> '{prefix}'",
            processed = self.processed,
            error = self.error,
            len = DISCARDED_PREFIX.chars().count(),
            prefix = DISCARDED_PREFIX.replace('\'', "''"),
        )
    }

    /// The dead letters a [`Selection`] picks: `$1 text[]` (error texts, NULL: any),
    /// `$2 uuid[]` (ids, empty: any), `$3`/`$4 timestamptz` (claim-order range, NULL: open).
    fn selected(&self) -> String {
        format!(
            "{dead} AND ($1::text[] IS NULL OR {error} = ANY($1::text[])) \
             AND (cardinality($2::uuid[]) = 0 OR {id} = ANY($2::uuid[])) \
             AND ($3::timestamptz IS NULL OR {occurred} >= $3::timestamptz) \
             AND ($4::timestamptz IS NULL OR {occurred} < $4::timestamptz)",
            dead = self.dead(),
            error = self.error,
            id = self.id,
            occurred = self.occurred,
        )
    }
}

/// The dead letters grouped by cause, the largest group first. One read-only statement that
/// groups by error text in the database; the texts are merged into classes here.
pub async fn list(conn: &mut PgConnection, table: &OutboxTable) -> Result<Vec<Group>, sqlx::Error> {
    let sql = Sql::new(table);
    let statement = format!(
        "SELECT {error}::text, count(*), min({occurred})::timestamptz, max({occurred})::timestamptz \
         FROM {table} WHERE {dead} GROUP BY {error}",
        error = sql.error,
        occurred = sql.occurred,
        table = sql.table,
        dead = sql.dead(),
    );
    let rows = sqlx::query(AssertSqlSafe(statement))
        .fetch_all(&mut *conn)
        .await?;
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for row in rows {
        let error: String = row.try_get(0)?;
        let count: i64 = row.try_get(1)?;
        let oldest: Option<DateTime<Utc>> = row.try_get(2)?;
        let newest: Option<DateTime<Utc>> = row.try_get(3)?;
        let class = classify(&error);
        let group = groups.entry(class.clone()).or_insert_with(|| Group {
            name: group_name(&class),
            class,
            rows: 0,
            oldest: None,
            newest: None,
            errors: Vec::new(),
        });
        group.rows += count;
        group.oldest = earliest(group.oldest, oldest);
        group.newest = latest(group.newest, newest);
        group.errors.push(error);
    }
    let mut groups: Vec<Group> = groups.into_values().collect();
    groups.sort_by(|a, b| b.rows.cmp(&a.rows).then_with(|| a.name.cmp(&b.name)));
    Ok(groups)
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn latest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Which dead letters a `requeue` or `discard` acts on: every given part must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// The error texts of a group; None: any error.
    pub errors: Option<Vec<String>>,
    /// Empty: any id.
    pub ids: Vec<Uuid>,
    /// Claim-order range, from inclusive, to exclusive.
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// How many dead letters a selection holds and their span in claim order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preview {
    pub rows: i64,
    pub oldest: Option<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
}

/// Counts the selection, writing nothing.
pub async fn preview(
    conn: &mut PgConnection,
    table: &OutboxTable,
    selection: &Selection,
) -> Result<Preview, sqlx::Error> {
    let sql = Sql::new(table);
    let statement = format!(
        "SELECT count(*), min({occurred})::timestamptz, max({occurred})::timestamptz \
         FROM {table} WHERE {selected}",
        occurred = sql.occurred,
        table = sql.table,
        selected = sql.selected(),
    );
    let row = sqlx::query(AssertSqlSafe(statement))
        .bind(selection.errors.clone())
        .bind(selection.ids.clone())
        .bind(selection.from)
        .bind(selection.to)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Preview {
        rows: row.try_get(0)?,
        oldest: row.try_get(1)?,
        newest: row.try_get(2)?,
    })
}

/// What to do with the selected dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pending again: processed-at and error cleared, attempts back to 0.
    Requeue,
    /// Settled for good: [`DISCARDED_PREFIX`] before the error.
    Discard,
}

impl Action {
    pub fn verb(self) -> &'static str {
        match self {
            Action::Requeue => "requeue",
            Action::Discard => "discard",
        }
    }
}

/// Applies `action` to the selection in batches of `batch` rows, oldest first in claim order,
/// each batch its own short transaction (never one over the whole selection, which would hold
/// its row locks against the relay and keep VACUUM back for its whole length). The selection's
/// ids are read once, in claim order (one pass over the table, 16 bytes a row); each batch then
/// finds its rows by primary key and checks again that each is still a selected dead letter, so
/// a row a concurrent command already handled is skipped. Oldest first so that, with a relay
/// running, no requeued row of a key is pending before an older requeued row of that key.
/// `progress` is told the running total after every batch.
pub async fn apply(
    conn: &mut PgConnection,
    table: &OutboxTable,
    selection: &Selection,
    action: Action,
    batch: usize,
    mut progress: impl FnMut(u64),
) -> Result<u64, sqlx::Error> {
    let sql = Sql::new(table);
    let ids: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT {id} FROM {table} WHERE {selected} ORDER BY {occurred}, {id}",
        id = sql.id,
        table = sql.table,
        selected = sql.selected(),
        occurred = sql.occurred,
    )))
    .bind(selection.errors.clone())
    .bind(selection.ids.clone())
    .bind(selection.from)
    .bind(selection.to)
    .fetch_all(&mut *conn)
    .await?;
    let set = match action {
        Action::Requeue => {
            let mut set = format!("{} = NULL, {} = NULL", sql.processed, sql.error);
            if let Some(attempts) = &sql.attempts {
                let _ = write!(set, ", {attempts} = 0");
            }
            set
        }
        Action::Discard => format!("{error} = $6::text || {error}", error = sql.error),
    };
    let statement = format!(
        "UPDATE {table} SET {set} WHERE {id} = ANY($5::uuid[]) AND {selected}",
        table = sql.table,
        id = sql.id,
        selected = sql.selected(),
    );
    let mut done = 0u64;
    for chunk in ids.chunks(batch.max(1)) {
        let result = sqlx::query(AssertSqlSafe(statement.clone()))
            .bind(selection.errors.clone())
            .bind(selection.ids.clone())
            .bind(selection.from)
            .bind(selection.to)
            .bind(chunk.to_vec())
            .bind(DISCARDED_PREFIX)
            .execute(&mut *conn)
            .await?;
        done += result.rows_affected();
        progress(done);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cause_with_different_ids_and_counts_is_one_class() {
        let a = classify(
            "dead-lettered after 5 attempt(s): returned by the broker as unroutable: 312 NO_ROUTE",
        );
        let b = classify(
            "dead-lettered after 12 attempt(s): returned by the broker as unroutable: 312 NO_ROUTE",
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            "dead-lettered after # attempt(s): returned by the broker as unroutable: # NO_ROUTE"
        );
        let c = classify(
            "rejected by the broker: queue 'orders-7' for id 3f0b6c1e-8f4a-4c7e-9d2a-1b2c3d4e5f60",
        );
        let d = classify(
            "rejected by the broker: queue \"billing\" for id 00000000-0000-0000-0000-000000000001",
        );
        assert_eq!(c, d);
        assert_eq!(c, "rejected by the broker: queue '…' for id #");
    }

    #[test]
    fn different_causes_are_different_classes_and_names() {
        let unroutable = classify("returned by the broker as unroutable: 312 NO_ROUTE");
        let malformed = classify("malformed row: the payload column is NULL");
        assert_ne!(unroutable, malformed);
        assert_ne!(group_name(&unroutable), group_name(&malformed));
        assert_eq!(malformed, "malformed row: the payload column is NULL");
    }

    #[test]
    fn group_names_are_stable() {
        // Pinned: a name printed by one release must be accepted by the next.
        assert_eq!(group_name(""), "gcbf29ce4");
        assert_eq!(group_name("a").len(), 9);
        assert_eq!(group_name("x"), group_name("x"));
    }

    #[test]
    fn white_space_and_trailing_punctuation_do_not_split_classes() {
        assert_eq!(classify("  at most 255.  "), "at most #.");
        assert_eq!(classify("unclosed 'quote"), "unclosed '…'");
    }
}
