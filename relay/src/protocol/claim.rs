//! The claim: up to a batch of pending rows in claim order, locked `FOR UPDATE SKIP LOCKED`, from
//! where the [`super::cursor::ClaimCursor`] says, decoded into [`ClaimedRow`]s.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Column as _, Postgres, Row};

use super::row::{ClaimedRow, Column, Malformed};
use crate::table::sql::{SettlingClaims, Statements, columns};

/// How far before the database's now() the recent claim starts: a row whose transaction took
/// longer than this between taking its claim position and committing waits for the full claim.
pub const RECENT_WINDOW: Duration = Duration::from_secs(10);

/// Where one claim starts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStart {
    /// At the head of the pending index.
    #[default]
    Head,
    /// At the earlier of `horizon` (when known) and the database's now() minus
    /// [`RECENT_WINDOW`].
    Recent { horizon: Option<DateTime<Utc>> },
    /// At this claim position: the last claimed row's.
    After(DateTime<Utc>),
}

/// The claim statement for `start`, with its values bound; `lanes` are the lanes the worker
/// holds under per-key ordering (bound last), None otherwise.
pub fn claim_query(
    statements: &Statements,
    limit: i64,
    start: ClaimStart,
    lanes: Option<&[i32]>,
) -> Query<'static, Postgres, PgArguments> {
    let texts = [
        &statements.claim,
        &statements.claim_from,
        &statements.claim_recent,
    ];
    let query = start_query(texts, limit, start);
    match lanes {
        Some(lanes) => query.bind(lanes.to_vec()),
        None => query,
    }
}

/// The settling claim for `start` (unordered: no lanes), with its values bound: it marks what
/// it claims, see [`SettlingClaims`].
pub fn settling_claim_query(
    settling: &SettlingClaims,
    limit: i64,
    start: ClaimStart,
) -> Query<'static, Postgres, PgArguments> {
    let texts = [
        &settling.claim,
        &settling.claim_from,
        &settling.claim_recent,
    ];
    start_query(texts, limit, start)
}

/// `texts`: the statement that starts at the head, after a position, and at the recent window.
fn start_query(
    [head, after, recent]: [&Arc<str>; 3],
    limit: i64,
    start: ClaimStart,
) -> Query<'static, Postgres, PgArguments> {
    match start {
        ClaimStart::Head => sqlx::query(AssertSqlSafe(head.clone())).bind(limit),
        ClaimStart::Recent { horizon } => sqlx::query(AssertSqlSafe(recent.clone()))
            .bind(limit)
            .bind(horizon)
            .bind(RECENT_WINDOW.as_secs_f64()),
        ClaimStart::After(position) => sqlx::query(AssertSqlSafe(after.clone()))
            .bind(limit)
            .bind(position),
    }
}

/// Decodes the claimed rows by the claim's column names ([`columns`]).
pub fn decode_all(rows: &[PgRow]) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let positions = Positions::of(first)?;
    rows.iter().map(|row| positions.decode(row)).collect()
}

/// Where each named column of the claim is, looked up once per batch: every row of a result
/// has the same columns, and a lookup by name per row and column would cost a hash each.
struct Positions {
    id: usize,
    kind: usize,
    payload: usize,
    occurred_at: usize,
    routing_key: usize,
    headers: usize,
    attempts: usize,
    partition_key: usize,
    /// Only when the trace-context columns are mapped: a claim without them costs nothing more.
    traceparent: Option<usize>,
    tracestate: Option<usize>,
    /// Per-key claims only.
    lane: Option<usize>,
    /// Settling claims only.
    prior_error: Option<usize>,
}

impl Positions {
    fn of(row: &PgRow) -> Result<Self, sqlx::Error> {
        let at = |name: &str| row.try_column(name).map(|column| column.ordinal());
        Ok(Self {
            id: at(columns::ID)?,
            kind: at(columns::KIND)?,
            payload: at(columns::PAYLOAD)?,
            occurred_at: at(columns::OCCURRED_AT)?,
            routing_key: at(columns::ROUTING_KEY)?,
            headers: at(columns::HEADERS)?,
            attempts: at(columns::ATTEMPTS)?,
            partition_key: at(columns::PARTITION_KEY)?,
            traceparent: at(columns::TRACEPARENT).ok(),
            tracestate: at(columns::TRACESTATE).ok(),
            lane: at(columns::LANE).ok(),
            prior_error: at(columns::PRIOR_ERROR).ok(),
        })
    }

    fn decode(&self, row: &PgRow) -> Result<ClaimedRow, sqlx::Error> {
        let mut malformed = None;
        let kind = text_column(row, self.kind, Column::Type, &mut malformed)?;
        let routing_key = text_column(row, self.routing_key, Column::RoutingKey, &mut malformed)?;
        Ok(ClaimedRow {
            id: row.try_get(self.id)?,
            kind,
            payload: raw_bytes(row, self.payload)?,
            occurred_at: row.try_get(self.occurred_at)?,
            routing_key,
            headers: row.try_get(self.headers)?,
            attempts: row.try_get(self.attempts)?,
            partition_key: raw_bytes(row, self.partition_key)?,
            traceparent: lossy_text(row, self.traceparent)?,
            tracestate: lossy_text(row, self.tracestate)?,
            lane: match self.lane {
                Some(index) => row.try_get(index)?,
                None => None,
            },
            prior_error: match self.prior_error {
                Some(index) => row.try_get(index)?,
                None => None,
            },
            malformed,
        })
    }
}

/// Raw bytes of a text-like column, so bytes that are not UTF-8 (possible in a SQL_ASCII
/// database) never fail the batch. Claim casts json and jsonb payloads to text, so the bytes
/// are the document's text.
fn raw_bytes(row: &PgRow, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
    use sqlx::ValueRef;
    let value = row.try_get_raw(index)?;
    if value.is_null() {
        return Ok(None);
    }
    Ok(Some(
        value.as_bytes().map_err(sqlx::Error::Decode)?.to_vec(),
    ))
}

/// An optional text column whose bad bytes must not make the row malformed (a trace context
/// never holds a message back): they become U+FFFD, which the trace-context check refuses and
/// counts.
fn lossy_text(row: &PgRow, index: Option<usize>) -> Result<Option<String>, sqlx::Error> {
    let Some(index) = index else {
        return Ok(None);
    };
    Ok(
        raw_bytes(row, index)?.map(|bytes| match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }),
    )
}

/// A text column that must be UTF-8 for AMQP; bad bytes make the row malformed (the first
/// problem found is kept), not the batch.
fn text_column(
    row: &PgRow,
    index: usize,
    column: Column,
    malformed: &mut Option<Malformed>,
) -> Result<Option<String>, sqlx::Error> {
    Ok(match raw_bytes(row, index)? {
        None => None,
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Some(text),
            Err(_) => {
                malformed.get_or_insert(Malformed::NotUtf8(column));
                None
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::TableName;
    use crate::table::inspect::PayloadKind;
    use crate::table::outbox::OutboxTable;
    use sqlx::{Arguments, Execute};

    #[test]
    fn each_claim_binds_as_many_values_as_its_statement_takes() {
        let table = OutboxTable::new(TableName::parse("outbox").unwrap());
        let statements = Statements::new(&table, PayloadKind::Json);
        // table::sql's tests check that the statements take $1, $1..$3 and $1..$2.
        for (start, values) in [
            (ClaimStart::Head, 1),
            (ClaimStart::Recent { horizon: None }, 3),
            (ClaimStart::After(Utc::now()), 2),
        ] {
            let mut query = claim_query(&statements, 10, start, None);
            let arguments = query.take_arguments().unwrap().expect("bound values");
            assert_eq!(arguments.len(), values, "{start:?}");
            // The settling claim of the same start takes the same values.
            let settling = statements
                .settling
                .as_ref()
                .expect("mark mode settles in claim");
            let mut query = settling_claim_query(settling, 10, start);
            let arguments = query.take_arguments().unwrap().expect("bound values");
            assert_eq!(arguments.len(), values, "settling {start:?}");
        }
    }
}
