//! One batch of the table protocol, inside one transaction:
//! claim (`FOR UPDATE SKIP LOCKED`) → publish pipelined → await confirms → settle every row in
//! one statement → commit. A row is settled as published only after its confirm.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};
use tokio::sync::Semaphore;

use super::claim::{ClaimStart, claim_query, decode_all};
use super::message::{dead_letter, to_message};
use super::row::{ClaimedRow, Malformed};
use super::settle::{RowError, RowOutcome, SettleCounts, settle_query};
use crate::broker::routing::RoutingKey;
use crate::broker::{
    BatchOutcome, BrokerFailure, Delivery, Message, Publisher, Rejection, Target, Unconfirmed,
};
use crate::metrics::{FailureReason, Metrics, Stage};
use crate::table::sql::Statements;

/// Longest wait for one database round trip; a stalled connection is replaced after it.
pub const DATABASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the batch protocol that do not change between batches.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    pub batch_size: usize,
    pub routing_key: RoutingKey,
    pub max_attempts: i32,
    pub has_attempts_column: bool,
    pub dead_letter_exchange: bool,
    /// Shared by the process's workers: at most this many batches are at the broker at once
    /// (see `--inflight-batches`); None publishes as soon as a batch is claimed.
    pub publish_slots: Option<Arc<Semaphore>>,
}

#[derive(Debug, Default, Clone)]
pub struct BatchReport {
    pub claimed: usize,
    pub published: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub untouched: usize,
    /// Set when the broker connection must be replaced before the next batch.
    pub broker_broken: Option<BrokerFailure>,
    /// The claim position (occurred-at) of the batch's first row, where nothing before it was
    /// pending for this worker; None when that row has no occurred-at.
    pub first_claimed: Option<DateTime<Utc>>,
    /// The claim position (occurred-at) of the batch's last row, for the next claim to seek
    /// from; None when that row has no occurred-at.
    pub last_claimed: Option<DateTime<Utc>>,
    /// How long the claim statement took.
    pub claim_time: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database did not answer within {0:?}")]
    DatabaseTimeout(Duration),
}

/// Awaits `future`, observing how long it took as `stage`; returns the output and that time.
async fn observed<T>(
    metrics: &Metrics,
    stage: Stage,
    future: impl Future<Output = T>,
) -> (T, Duration) {
    let started = Instant::now();
    let output = future.await;
    let elapsed = started.elapsed();
    metrics.stage(stage).observe(elapsed.as_secs_f64());
    (output, elapsed)
}

/// Awaits `future`, observing how long it took as `stage`.
async fn timed_wait<T>(metrics: &Metrics, stage: Stage, future: impl Future<Output = T>) -> T {
    observed(metrics, stage, future).await.0
}

/// Runs a database step under [`DATABASE_TIMEOUT`].
async fn bounded<T>(future: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, BatchError> {
    let result = tokio::time::timeout(DATABASE_TIMEOUT, future)
        .await
        .map_err(|_| BatchError::DatabaseTimeout(DATABASE_TIMEOUT))?;
    Ok(result?)
}

/// Runs a database step under [`DATABASE_TIMEOUT`], observing its time as `stage`.
async fn timed<T>(
    metrics: &Metrics,
    stage: Stage,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, BatchError> {
    timed_wait(metrics, stage, bounded(future)).await
}

/// Decides a row's fate after a broker refusal: retry while attempts remain.
fn after_rejection(row: &ClaimedRow, rejection: Rejection, settings: &BatchSettings) -> RowOutcome {
    let attempts_after = row.attempts.saturating_add(1);
    if settings.has_attempts_column && attempts_after < settings.max_attempts {
        RowOutcome::Retry(RowError::Retrying {
            attempt: attempts_after,
            max_attempts: settings.max_attempts,
            rejection,
        })
    } else {
        RowOutcome::DeadLettered(RowError::GaveUp {
            attempts: attempts_after,
            rejection,
        })
    }
}

/// The metric label of a broker refusal.
fn rejection_reason(rejection: &Rejection) -> FailureReason {
    match rejection {
        Rejection::Nack => FailureReason::Nack,
        Rejection::Unroutable { .. } => FailureReason::Unroutable,
        Rejection::Refused { .. } => FailureReason::Rejected,
    }
}

/// The metric label of a message nothing is known about.
fn unconfirmed_reason(unconfirmed: Unconfirmed) -> FailureReason {
    match unconfirmed {
        Unconfirmed::BrokerUnavailable => FailureReason::BrokerUnavailable,
        Unconfirmed::Timeout => FailureReason::Timeout,
        Unconfirmed::Released => FailureReason::Released,
    }
}

/// Runs one batch, claiming from `start` (see [`super::cursor::ClaimCursor`]). Returns
/// how many rows it claimed (0 means nothing for us there). Its span carries the batch size and
/// sits inside the worker's and the relay's, so a log line of the batch says which relay,
/// worker and size without repeating them.
#[tracing::instrument(name = "batch", skip_all, fields(batch_size = settings.batch_size))]
pub async fn run_batch<P: Publisher>(
    conn: &mut PgConnection,
    publisher: &mut P,
    statements: &Statements,
    settings: &BatchSettings,
    metrics: &Metrics,
    start: ClaimStart,
) -> Result<BatchReport, BatchError> {
    let mut tx = timed(metrics, Stage::Claim, conn.begin()).await?;
    let claim = claim_query(statements, settings.batch_size as i64, start);
    // The claim cursor schedules the wide claims by their cost, so it gets the time too.
    let (rows, claim_time) =
        observed(metrics, Stage::Claim, bounded(claim.fetch_all(&mut *tx))).await;
    let rows = rows?;
    metrics.batch_size.observe(rows.len() as f64);
    if rows.is_empty() {
        timed(metrics, Stage::Commit, tx.commit()).await?;
        return Ok(BatchReport {
            claim_time,
            ..BatchReport::default()
        });
    }
    let rows = decode_all(&rows)?;

    // Publish every well-formed row; malformed ones are settled as dead letters right away.
    let prepared: Vec<Result<Message<'_>, Malformed>> = rows
        .iter()
        .map(|row| to_message(row, &settings.routing_key))
        .collect();
    let messages: Vec<Message<'_>> = prepared
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    let BatchOutcome {
        deliveries,
        mut broken,
        ..
    } = publish_in_slot(publisher, &messages, settings, metrics).await;

    let mut outcomes = Vec::with_capacity(rows.len());
    let mut delivered = deliveries.into_iter();
    for (row, prepared) in rows.iter().zip(&prepared) {
        let outcome = match prepared {
            Err(malformed) => {
                metrics.failure(FailureReason::Malformed);
                RowOutcome::DeadLettered(RowError::Malformed(malformed.clone()))
            }
            Ok(_) => match delivered.next().expect("one delivery per message") {
                Delivery::Confirmed => RowOutcome::Published,
                Delivery::Rejected(rejection) => {
                    metrics.failure(rejection_reason(&rejection));
                    after_rejection(row, rejection, settings)
                }
                Delivery::Unknown(unconfirmed) => {
                    metrics.failure(unconfirmed_reason(unconfirmed));
                    RowOutcome::Untouched
                }
            },
        };
        outcomes.push(outcome);
    }

    if settings.dead_letter_exchange {
        forward_dead_letters(
            publisher,
            &rows,
            &mut outcomes,
            &settings.routing_key,
            &mut broken,
        )
        .await;
    }

    let (counts, settle) = settle_query(statements, &rows, &outcomes);
    if let Some(settle) = settle {
        timed(metrics, Stage::Mark, settle.execute(&mut *tx)).await?;
    }
    timed(metrics, Stage::Commit, tx.commit()).await?;
    metrics.published.inc_by(counts.published as u64);
    metrics.dead_lettered.inc_by(counts.dead_lettered as u64);
    let SettleCounts {
        published,
        retried,
        dead_lettered,
        untouched,
    } = counts;
    Ok(BatchReport {
        claimed: rows.len(),
        published,
        retried,
        dead_lettered,
        untouched,
        broker_broken: broken,
        first_claimed: rows.first().and_then(|row| row.occurred_at),
        last_claimed: rows.last().and_then(|row| row.occurred_at),
        claim_time,
    })
}

/// Publishes a batch to the main exchange once a publish slot is free, observing the slot
/// wait, publish and confirm stages. Holding the claimed rows' locks while waiting is cheap;
/// another worker's batch at the broker finishes faster alone (a queue confirms one batch at a
/// time most efficiently). With nothing to publish (every row malformed) no slot is taken.
async fn publish_in_slot<P: Publisher>(
    publisher: &mut P,
    messages: &[Message<'_>],
    settings: &BatchSettings,
    metrics: &Metrics,
) -> BatchOutcome {
    if messages.is_empty() {
        return BatchOutcome::empty();
    }
    let slot = match &settings.publish_slots {
        Some(slots) => Some(
            timed_wait(metrics, Stage::Slot, slots.acquire())
                .await
                .expect("the slots are never closed"),
        ),
        None => None,
    };
    let started = Instant::now();
    let outcome = publisher.publish_batch(Target::Main, messages).await;
    drop(slot);
    metrics
        .stage(Stage::Publish)
        .observe(outcome.publish_time.as_secs_f64());
    metrics.stage(Stage::Confirm).observe(
        started
            .elapsed()
            .saturating_sub(outcome.publish_time)
            .as_secs_f64(),
    );
    outcome
}

/// Publishes dead letters to the dead-letter exchange with their error in a header. A dead
/// letter the broker did not confirm stays pending, so it is never dropped silently.
async fn forward_dead_letters<P: Publisher>(
    publisher: &mut P,
    rows: &[ClaimedRow],
    outcomes: &mut [RowOutcome],
    routing: &RoutingKey,
    broken: &mut Option<BrokerFailure>,
) {
    // The error texts first: the letters borrow them.
    let (indexes, errors): (Vec<usize>, Vec<String>) = outcomes
        .iter()
        .enumerate()
        .filter_map(|(index, outcome)| match outcome {
            RowOutcome::DeadLettered(error) => Some((index, error.to_string())),
            _ => None,
        })
        .unzip();
    let letters: Vec<Message<'_>> = indexes
        .iter()
        .zip(&errors)
        .map(|(&index, error)| dead_letter(&rows[index], error, routing))
        .collect();
    if letters.is_empty() {
        return;
    }
    let outcome = publisher.publish_batch(Target::DeadLetter, &letters).await;
    if broken.is_none() {
        *broken = outcome.broken;
    }
    for (index, delivery) in indexes.into_iter().zip(outcome.deliveries) {
        if delivery != Delivery::Confirmed {
            outcomes[index] = RowOutcome::Untouched;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ClaimedRow {
        ClaimedRow::sample()
    }

    #[test]
    fn rejections_retry_until_max_attempts() {
        let settings = BatchSettings {
            batch_size: 10,
            routing_key: RoutingKey::Type,
            max_attempts: 3,
            has_attempts_column: true,
            dead_letter_exchange: false,
            publish_slots: None,
        };
        let first = after_rejection(&row(), Rejection::Nack, &settings);
        assert!(
            matches!(first, RowOutcome::Retry(ref e) if e.to_string().starts_with("attempt 1/3"))
        );
        let last = after_rejection(
            &ClaimedRow {
                attempts: 2,
                ..row()
            },
            Rejection::Nack,
            &settings,
        );
        assert!(matches!(last, RowOutcome::DeadLettered(_)));
        let no_column = BatchSettings {
            has_attempts_column: false,
            ..settings
        };
        assert!(matches!(
            after_rejection(&row(), Rejection::Nack, &no_column),
            RowOutcome::DeadLettered(_)
        ));
    }
}
