//! The claim: up to a batch of pending rows in claim order, locked `FOR UPDATE SKIP LOCKED`, from
//! where the [`super::cursor::ClaimCursor`] says, decoded into [`ClaimedRow`]s.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, Row};
use uuid::Uuid;

use crate::table::sql::Statements;

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

/// The claim statement for `start`, with its values bound.
pub fn claim_query(
    statements: &Statements,
    limit: i64,
    start: ClaimStart,
) -> Query<'static, Postgres, PgArguments> {
    match start {
        ClaimStart::Head => sqlx::query(AssertSqlSafe(statements.claim.clone())).bind(limit),
        ClaimStart::Recent { horizon } => {
            sqlx::query(AssertSqlSafe(statements.claim_recent.clone()))
                .bind(limit)
                .bind(horizon)
                .bind(RECENT_WINDOW.as_secs_f64())
        }
        ClaimStart::After(position) => sqlx::query(AssertSqlSafe(statements.claim_from.clone()))
            .bind(limit)
            .bind(position),
    }
}

/// A claimed row, decoded.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: Uuid,
    pub kind: Option<String>,
    pub payload: Option<Vec<u8>>,
    pub occurred_at: Option<DateTime<Utc>>,
    pub routing_key: Option<String>,
    pub headers: Option<serde_json::Value>,
    pub attempts: i32,
    /// Set when a column could not be read as the message needs it.
    pub malformed: Option<String>,
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

/// A text column that must be UTF-8 for AMQP; bad bytes make the row malformed, not the batch.
fn text_column(
    row: &PgRow,
    index: usize,
    what: &str,
    problems: &mut Vec<String>,
) -> Result<Option<String>, sqlx::Error> {
    Ok(match raw_bytes(row, index)? {
        None => None,
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Some(text),
            Err(_) => {
                problems.push(format!("malformed row: the {what} is not valid UTF-8"));
                None
            }
        },
    })
}

pub fn decode(row: &PgRow) -> Result<ClaimedRow, sqlx::Error> {
    let mut problems = Vec::new();
    let kind = text_column(row, 1, "type", &mut problems)?;
    let routing_key = text_column(row, 4, "routing key", &mut problems)?;
    Ok(ClaimedRow {
        id: row.try_get(0)?,
        kind,
        payload: raw_bytes(row, 2)?,
        occurred_at: row.try_get(3)?,
        routing_key,
        headers: row.try_get(5)?,
        attempts: row.try_get(6)?,
        malformed: problems.into_iter().next(),
    })
}

#[cfg(test)]
impl ClaimedRow {
    /// A well-formed row, for tests to vary.
    pub fn sample() -> Self {
        ClaimedRow {
            id: Uuid::nil(),
            kind: Some("OrderCreated".into()),
            payload: Some(b"{}".to_vec()),
            occurred_at: None,
            routing_key: Some("orders".into()),
            headers: None,
            attempts: 0,
            malformed: None,
        }
    }
}
