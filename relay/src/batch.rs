//! One batch of the table protocol, inside one transaction:
//! claim (`FOR UPDATE SKIP LOCKED`) → publish pipelined → await confirms → settle every row in
//! one statement → commit. A row is settled as published only after its confirm.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::claim_cursor::{ClaimStart, RECENT_WINDOW};
use crate::config::{AMQP_SHORT_STRING_MAX, RoutingKey};
use crate::metrics::{FailureReason, Metrics, Stage};
use crate::publisher::{BatchOutcome, Delivery, Message, Publisher, Target, headers_from_json};
use crate::sql::Statements;

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

/// What the batch decided for one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOutcome {
    Published,
    /// Refused by the broker; stays pending with its error and one more attempt.
    Retry(String),
    /// Given up on: settled with its error so it never blocks the rest.
    DeadLettered(String),
    /// Not known to the broker or not confirmed: left untouched, released at commit.
    Untouched,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub published: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub untouched: usize,
    /// Set when the broker connection must be replaced before the next batch.
    pub broker_broken: Option<String>,
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

/// Raw bytes of a text-like column, so bytes that are not UTF-8 (possible in a SQL_ASCII
/// database) never fail the batch. Claim casts json and jsonb payloads to text, so the bytes
/// are the document's text.
fn raw_bytes(row: &sqlx::postgres::PgRow, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
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
    row: &sqlx::postgres::PgRow,
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

fn decode(row: &sqlx::postgres::PgRow) -> Result<ClaimedRow, sqlx::Error> {
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

/// Turns a row into a message, or says why it cannot be one.
pub fn to_message<'a>(row: &'a ClaimedRow, routing: &'a RoutingKey) -> Result<Message<'a>, String> {
    if let Some(problem) = &row.malformed {
        return Err(problem.clone());
    }
    let kind = row
        .kind
        .as_deref()
        .ok_or("malformed row: the type column is NULL")?;
    if kind.len() > AMQP_SHORT_STRING_MAX {
        return Err(format!(
            "malformed row: type is {} bytes; AMQP allows at most 255",
            kind.len()
        ));
    }
    let payload = row
        .payload
        .as_deref()
        .ok_or("malformed row: the payload column is NULL")?;
    let routing_key = match routing {
        RoutingKey::Type => kind,
        RoutingKey::Column => row.routing_key.as_deref().unwrap_or(kind),
        RoutingKey::Static(key) => key.as_str(),
    };
    if routing_key.len() > AMQP_SHORT_STRING_MAX {
        return Err(format!(
            "malformed row: routing key is {} bytes; AMQP allows at most 255",
            routing_key.len()
        ));
    }
    let headers = match &row.headers {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => Some(headers_from_json(value).map_err(|e| format!("malformed row: {e}"))?),
    };
    Ok(Message {
        id: row.id,
        kind,
        routing_key,
        payload,
        timestamp: row
            .occurred_at
            .and_then(|t| u64::try_from(t.timestamp()).ok()),
        headers,
    })
}

/// Decides a row's fate after a broker refusal: retry while attempts remain.
fn after_rejection(row: &ClaimedRow, detail: String, settings: &BatchSettings) -> RowOutcome {
    let attempts_after = row.attempts.saturating_add(1);
    if settings.has_attempts_column && attempts_after < settings.max_attempts {
        RowOutcome::Retry(format!(
            "attempt {attempts_after}/{}: {detail}",
            settings.max_attempts
        ))
    } else {
        RowOutcome::DeadLettered(format!(
            "dead-lettered after {attempts_after} attempt(s): {detail}"
        ))
    }
}

/// Runs one batch, claiming from `start` (see [`crate::claim_cursor::ClaimCursor`]). Returns
/// how many rows it claimed (0 means nothing for us there).
pub async fn run_batch<P: Publisher>(
    conn: &mut PgConnection,
    publisher: &mut P,
    statements: &Statements,
    settings: &BatchSettings,
    metrics: &Metrics,
    start: ClaimStart,
) -> Result<BatchReport, BatchError> {
    let mut tx = timed(metrics, Stage::Claim, conn.begin()).await?;
    let limit = settings.batch_size as i64;
    let claim = match start {
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
    };
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
    let rows = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;

    // Publish every well-formed row; malformed ones are settled as dead letters right away.
    let prepared: Vec<Result<Message<'_>, String>> = rows
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
            Err(error) => {
                metrics.failure(FailureReason::Malformed);
                RowOutcome::DeadLettered(error.clone())
            }
            Ok(_) => match delivered.next().expect("one delivery per message") {
                Delivery::Confirmed => RowOutcome::Published,
                Delivery::Rejected { reason, detail } => {
                    metrics.failure(reason);
                    after_rejection(row, detail, settings)
                }
                Delivery::Unknown { reason } => {
                    metrics.failure(reason);
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

    let report = settle(&mut tx, statements, &rows, &outcomes, metrics).await?;
    timed(metrics, Stage::Commit, tx.commit()).await?;
    metrics.published.inc_by(report.published as u64);
    metrics.dead_lettered.inc_by(report.dead_lettered as u64);
    Ok(BatchReport {
        claimed: rows.len(),
        broker_broken: broken,
        first_claimed: rows.first().and_then(|row| row.occurred_at),
        last_claimed: rows.last().and_then(|row| row.occurred_at),
        claim_time,
        ..report
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
        return BatchOutcome {
            deliveries: Vec::new(),
            broken: None,
            publish_time: Duration::ZERO,
        };
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
    broken: &mut Option<String>,
) {
    let mut indexes = Vec::new();
    let mut letters = Vec::new();
    for (index, (row, outcome)) in rows.iter().zip(outcomes.iter()).enumerate() {
        let RowOutcome::DeadLettered(error) = outcome else {
            continue;
        };
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "x-outbox-error".into(),
            lapin::types::AMQPValue::LongString(error.as_str().into()),
        );
        let kind = row.kind.as_deref().unwrap_or("");
        letters.push(Message {
            id: row.id,
            kind: if kind.len() > AMQP_SHORT_STRING_MAX {
                ""
            } else {
                kind
            },
            routing_key: match routing {
                RoutingKey::Static(key) => key.as_str(),
                _ if kind.len() <= AMQP_SHORT_STRING_MAX => kind,
                _ => "",
            },
            payload: row.payload.as_deref().unwrap_or(&[]),
            timestamp: row
                .occurred_at
                .and_then(|t| u64::try_from(t.timestamp()).ok()),
            headers: Some(headers),
        });
        indexes.push(index);
    }
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

/// Settles the batch with one statement.
async fn settle(
    tx: &mut PgConnection,
    statements: &Statements,
    rows: &[ClaimedRow],
    outcomes: &[RowOutcome],
    metrics: &Metrics,
) -> Result<BatchReport, BatchError> {
    let mut report = BatchReport::default();
    let mut ids = Vec::with_capacity(rows.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(rows.len());
    let mut done = Vec::with_capacity(rows.len());
    for (row, outcome) in rows.iter().zip(outcomes) {
        let (error, finished) = match outcome {
            RowOutcome::Published => {
                report.published += 1;
                (None, true)
            }
            RowOutcome::Retry(e) => {
                report.retried += 1;
                (Some(e.clone()), false)
            }
            RowOutcome::DeadLettered(e) => {
                report.dead_lettered += 1;
                (Some(e.clone()), true)
            }
            RowOutcome::Untouched => {
                report.untouched += 1;
                continue;
            }
        };
        ids.push(row.id);
        errors.push(error);
        done.push(finished);
    }
    if ids.is_empty() {
        return Ok(report);
    }
    let query = if report.published == ids.len() {
        sqlx::query(AssertSqlSafe(statements.settle_all_published.clone())).bind(ids)
    } else {
        sqlx::query(AssertSqlSafe(statements.settle_outcomes.clone()))
            .bind(ids)
            .bind(errors)
            .bind(done)
    };
    timed(metrics, Stage::Mark, query.execute(&mut *tx)).await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ClaimedRow {
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

    #[test]
    fn routing_key_follows_the_setting() {
        let r = row();
        assert_eq!(
            to_message(&r, &RoutingKey::Type).unwrap().routing_key,
            "OrderCreated"
        );
        assert_eq!(
            to_message(&r, &RoutingKey::Column).unwrap().routing_key,
            "orders"
        );
        let fixed = RoutingKey::Static("all".into());
        assert_eq!(to_message(&r, &fixed).unwrap().routing_key, "all");
        let no_column = ClaimedRow {
            routing_key: None,
            ..row()
        };
        assert_eq!(
            to_message(&no_column, &RoutingKey::Column)
                .unwrap()
                .routing_key,
            "OrderCreated"
        );
    }

    #[test]
    fn malformed_rows_say_why() {
        let null_payload = ClaimedRow {
            payload: None,
            ..row()
        };
        assert!(
            to_message(&null_payload, &RoutingKey::Type)
                .unwrap_err()
                .contains("payload column is NULL")
        );
        let long_type = ClaimedRow {
            kind: Some("t".repeat(256)),
            ..row()
        };
        assert!(
            to_message(&long_type, &RoutingKey::Type)
                .unwrap_err()
                .contains("256 bytes")
        );
        let bad_headers = ClaimedRow {
            headers: Some(serde_json::json!([1])),
            ..row()
        };
        assert!(
            to_message(&bad_headers, &RoutingKey::Type)
                .unwrap_err()
                .contains("JSON object")
        );
        let null_type = ClaimedRow {
            kind: None,
            ..row()
        };
        assert!(
            to_message(&null_type, &RoutingKey::Type)
                .unwrap_err()
                .contains("type column is NULL")
        );
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
        let first = after_rejection(&row(), "nack".into(), &settings);
        assert!(matches!(first, RowOutcome::Retry(ref e) if e.starts_with("attempt 1/3")));
        let last = after_rejection(
            &ClaimedRow {
                attempts: 2,
                ..row()
            },
            "nack".into(),
            &settings,
        );
        assert!(matches!(last, RowOutcome::DeadLettered(_)));
        let no_column = BatchSettings {
            has_attempts_column: false,
            ..settings
        };
        assert!(matches!(
            after_rejection(&row(), "nack".into(), &no_column),
            RowOutcome::DeadLettered(_)
        ));
    }
}
