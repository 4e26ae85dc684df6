//! Settling a batch: one statement marks (or deletes) every row the broker confirmed and records
//! the error of every row it refused, so a batch costs one round trip whatever its outcomes.

use sqlx::AssertSqlSafe;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::row::{ClaimedRow, Malformed};
use crate::broker::Rejection;
use crate::table::sql::Statements;

/// Why a row was not published, as its error column records it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// Refused by the broker with attempts left.
    #[error("attempt {attempt}/{max_attempts}: {rejection}")]
    Retrying {
        attempt: i32,
        max_attempts: i32,
        rejection: Rejection,
    },
    /// Refused by the broker once too often.
    #[error("dead-lettered after {attempts} attempt(s): {rejection}")]
    GaveUp { attempts: i32, rejection: Rejection },
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

/// What the batch decided for one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOutcome {
    Published,
    /// Refused by the broker; stays pending with its error and one more attempt.
    Retry(RowError),
    /// Given up on: settled with its error so it never blocks the rest.
    DeadLettered(RowError),
    /// Not known to the broker or not confirmed: left untouched, released at commit.
    Untouched,
}

/// How many rows of a batch ended which way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SettleCounts {
    pub published: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub untouched: usize,
}

/// The one statement that settles the batch, with its values bound; None when every row is
/// left untouched (nothing to write).
pub fn settle_query(
    statements: &Statements,
    rows: &[ClaimedRow],
    outcomes: &[RowOutcome],
) -> (SettleCounts, Option<Query<'static, Postgres, PgArguments>>) {
    let mut counts = SettleCounts::default();
    let mut ids = Vec::with_capacity(rows.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(rows.len());
    let mut done = Vec::with_capacity(rows.len());
    for (row, outcome) in rows.iter().zip(outcomes) {
        let (error, finished) = match outcome {
            RowOutcome::Published => {
                counts.published += 1;
                (None, true)
            }
            RowOutcome::Retry(e) => {
                counts.retried += 1;
                (Some(e.to_string()), false)
            }
            RowOutcome::DeadLettered(e) => {
                counts.dead_lettered += 1;
                (Some(e.to_string()), true)
            }
            RowOutcome::Untouched => {
                counts.untouched += 1;
                continue;
            }
        };
        ids.push(row.id);
        errors.push(error);
        done.push(finished);
    }
    if ids.is_empty() {
        return (counts, None);
    }
    let query = if counts.published == ids.len() {
        sqlx::query(AssertSqlSafe(statements.settle_all_published.clone())).bind(ids)
    } else {
        sqlx::query(AssertSqlSafe(statements.settle_outcomes.clone()))
            .bind(ids)
            .bind(errors)
            .bind(done)
    };
    (counts, Some(query))
}
