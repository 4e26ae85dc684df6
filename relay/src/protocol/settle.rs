//! Settling a batch: one statement marks (or deletes) every row the broker confirmed and records
//! the error of every row it refused, so a batch costs one round trip whatever its outcomes.

use sqlx::AssertSqlSafe;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use uuid::Uuid;

use super::row::{ClaimedRow, Malformed};
use crate::broker::Rejection;
use crate::table::sql::{SettlingClaims, Statements};

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

/// What the settling statement writes for one row: its error (None: cleared), whether it is done
/// (published or dead-lettered), whether it spent an attempt.
struct RowWrite {
    error: Option<String>,
    done: bool,
    spent: bool,
}

impl RowOutcome {
    /// What this outcome writes, counting it in `counts`.
    fn write(&self, counts: &mut SettleCounts) -> Option<RowWrite> {
        let (error, done, spent) = match self {
            RowOutcome::Published => {
                counts.published += 1;
                (None, true, false)
            }
            RowOutcome::Retry(e) => {
                counts.retried += 1;
                (Some(e.to_string()), false, true)
            }
            RowOutcome::DeadLettered(e) => {
                counts.dead_lettered += 1;
                (Some(e.to_string()), true, true)
            }
            RowOutcome::Untouched => {
                counts.untouched += 1;
                return None;
            }
        };
        Some(RowWrite { error, done, spent })
    }
}

/// The per-row values of one settling statement, as the parallel arrays it binds.
struct RowWrites {
    ids: Vec<Uuid>,
    errors: Vec<Option<String>>,
    done: Vec<bool>,
    spent: Vec<bool>,
}

impl RowWrites {
    fn with_capacity(rows: usize) -> Self {
        Self {
            ids: Vec::with_capacity(rows),
            errors: Vec::with_capacity(rows),
            done: Vec::with_capacity(rows),
            spent: Vec::with_capacity(rows),
        }
    }

    fn push(&mut self, id: Uuid, write: RowWrite) {
        self.ids.push(id);
        self.errors.push(write.error);
        self.done.push(write.done);
        self.spent.push(write.spent);
    }
}

/// The one statement that settles the batch, with its values bound; None when every row is
/// left untouched (nothing to write).
pub fn settle_query(
    statements: &Statements,
    rows: &[ClaimedRow],
    outcomes: &[RowOutcome],
) -> (SettleCounts, Option<Query<'static, Postgres, PgArguments>>) {
    let mut counts = SettleCounts::default();
    let mut writes = RowWrites::with_capacity(rows.len());
    for (row, outcome) in rows.iter().zip(outcomes) {
        if let Some(write) = outcome.write(&mut counts) {
            writes.push(row.id, write);
        }
    }
    if writes.ids.is_empty() {
        return (counts, None);
    }
    // This statement derives a spent attempt from the error it writes.
    let query = if counts.published == writes.ids.len() {
        sqlx::query(AssertSqlSafe(statements.settle_all_published.clone())).bind(writes.ids)
    } else {
        sqlx::query(AssertSqlSafe(statements.settle_outcomes.clone()))
            .bind(writes.ids)
            .bind(writes.errors)
            .bind(writes.done)
    };
    (counts, Some(query))
}

/// After a settling claim, which marked every row processed and left its error as it was: the
/// one statement that puts back every row that was not published and clears the error of every
/// published row that had one, with its values bound; None when there is no such row (the usual
/// batch: nothing more to write). An untouched row goes back as it was claimed, with its prior
/// error and no attempt spent.
pub fn revert_query(
    settling: &SettlingClaims,
    rows: &[ClaimedRow],
    outcomes: &[RowOutcome],
) -> (SettleCounts, Option<Query<'static, Postgres, PgArguments>>) {
    let mut counts = SettleCounts::default();
    let mut writes = RowWrites::with_capacity(0);
    for (row, outcome) in rows.iter().zip(outcomes) {
        let write = outcome.write(&mut counts).unwrap_or_else(|| RowWrite {
            error: row.prior_error.clone(),
            done: false,
            spent: false,
        });
        if *outcome == RowOutcome::Published && row.prior_error.is_none() {
            continue; // settled by the claim, nothing to clear
        }
        writes.push(row.id, write);
    }
    if writes.ids.is_empty() {
        return (counts, None);
    }
    let query = sqlx::query(AssertSqlSafe(settling.revert.clone()))
        .bind(writes.ids)
        .bind(writes.errors)
        .bind(writes.done)
        .bind(writes.spent);
    (counts, Some(query))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::TableName;
    use crate::table::inspect::PayloadKind;
    use crate::table::outbox::OutboxTable;
    use sqlx::{Arguments, Execute};

    fn rows(n: usize, prior_error: Option<&str>) -> Vec<ClaimedRow> {
        (0..n)
            .map(|i| ClaimedRow {
                id: uuid::Uuid::from_u128(i as u128),
                prior_error: prior_error.map(str::to_string),
                ..ClaimedRow::sample()
            })
            .collect()
    }

    fn settling() -> SettlingClaims {
        let table = OutboxTable::new(TableName::parse("outbox").unwrap());
        Statements::new(&table, PayloadKind::Json)
            .settling
            .expect("mark mode settles in claim")
    }

    #[test]
    fn a_fully_published_settling_batch_writes_nothing_more() {
        let outcomes = vec![RowOutcome::Published; 3];
        let (counts, query) = revert_query(&settling(), &rows(3, None), &outcomes);
        assert_eq!(counts.published, 3);
        assert!(query.is_none());
        // Published rows that had an error get it cleared.
        let (counts, query) = revert_query(&settling(), &rows(3, Some("earlier")), &outcomes);
        assert_eq!(counts.published, 3);
        assert!(query.is_some());
    }

    #[test]
    fn a_settling_batch_puts_back_every_row_not_published() {
        let rows = rows(4, None);
        let refused = RowError::Retrying {
            attempt: 1,
            max_attempts: 5,
            rejection: Rejection::Unroutable {
                reply: "312 NO_ROUTE".into(),
            },
        };
        let gave_up = RowError::GaveUp {
            attempts: 5,
            rejection: Rejection::Unroutable {
                reply: "312 NO_ROUTE".into(),
            },
        };
        let outcomes = vec![
            RowOutcome::Published,
            RowOutcome::Untouched,
            RowOutcome::Retry(refused),
            RowOutcome::DeadLettered(gave_up),
        ];
        let (counts, query) = revert_query(&settling(), &rows, &outcomes);
        assert_eq!(
            counts,
            SettleCounts {
                published: 1,
                retried: 1,
                dead_lettered: 1,
                untouched: 1
            }
        );
        let mut query = query.expect("a revert");
        let arguments = query.take_arguments().unwrap().expect("bound values");
        // ids, errors, done and spent: one array each.
        assert_eq!(arguments.len(), 4);
    }
}
