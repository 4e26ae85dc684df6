//! One batch of the table protocol, inside one transaction:
//! claim (`FOR UPDATE SKIP LOCKED`) → publish pipelined → await confirms → settle every row in
//! one statement → commit. A row is settled as published only after its confirm.
//!
//! Where the statements offer a settling claim (see [`crate::table::sql::SettlingClaims`]), the
//! claim itself marks the rows, and the settle step puts back those not published; it writes
//! nothing when every row was confirmed. Either way, what COMMIT makes visible is the same.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::sync::Semaphore;
use tracing::warn;

use super::claim::{ClaimStart, claim_query, decode_all, settling_claim_query};
use super::message::{dead_letter, to_message};
use super::publish_notices::{HoldBack, PublishNotices};
pub use super::report::BatchReport;
use super::report::ClaimFound;
use super::row::{ClaimedRow, Malformed};
use super::settle::{RowError, RowOutcome, SettleCounts, revert_query, settle_query};
use super::shared_cursor::SharedCursor;
use crate::broker::routing::RoutingKey;
use crate::broker::{
    BatchOutcome, BrokerFailure, Delivery, Message, Publisher, Rejection, Target, Unconfirmed,
};
use crate::metrics::{FailureReason, KeyEvent, Metrics, Stage};
use crate::table::sql::Statements;
use crate::telemetry::batch_spans::{BatchEnd, BatchSpans, BatchTimeline, SettledCounts};

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
    /// Shared by the process's workers: what a publish that just ended badly tells the next.
    pub publish_notices: Arc<PublishNotices>,
    /// The bound on COMMIT (`--commit-timeout`), apart from [`DATABASE_TIMEOUT`]: a primary
    /// waiting for a synchronous standby that is gone never answers it.
    pub commit_timeout: Duration,
    /// The batch spans, while OTEL_EXPORTER_OTLP_* configure an export (see
    /// [`crate::telemetry`]); None: the batch notes nothing for them.
    pub spans: Option<BatchSpans>,
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database did not answer within {0:?}")]
    DatabaseTimeout(Duration),
    /// The batch is not counted as settled: the server may have committed it locally and
    /// makes it visible once its standby answers, or loses it in a failover (its rows then go
    /// again: duplicates, never a loss).
    #[error(
        "COMMIT did not return within {0:?} (--commit-timeout): the server may be waiting for a \
         synchronous standby that is gone (synchronous_standby_names); the batch counts as not \
         settled"
    )]
    CommitTimeout(Duration),
}

/// A claim, mark or commit slower than this is said (sqlx's own slow-statement warning is
/// turned down to debug, since a migration's index build is slow by nature): on a healthy table
/// they take milliseconds.
pub const SLOW_DATABASE_STEP: Duration = Duration::from_secs(1);

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
    if elapsed > SLOW_DATABASE_STEP && matches!(stage, Stage::Claim | Stage::Mark | Stage::Commit) {
        warn!(
            stage = stage.label(),
            elapsed_ms = elapsed.as_millis() as u64,
            "slow {} of the outbox table: dead rows at the head of the pending index (VACUUM held \
             back by a long transaction), lock waits or a busy server; `outbox-relay lag` shows \
             the table's health",
            stage.label()
        );
    }
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

/// Commits under `settings.commit_timeout`, observing its time.
async fn commit(
    metrics: &Metrics,
    settings: &BatchSettings,
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
) -> Result<(), BatchError> {
    let bounded = tokio::time::timeout(settings.commit_timeout, tx.commit());
    match timed_wait(metrics, Stage::Commit, bounded).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(BatchError::CommitTimeout(settings.commit_timeout)),
    }
}

/// Decides a row's fate after the broker refused the message itself (unroutable, an AMQP 1.0
/// `rejected`): retry while attempts remain. A nack never comes here (see
/// [`Unconfirmed::Nacked`]).
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

/// What a row's delivery makes of it. None: held back behind an earlier row of its key that
/// was not confirmed; it was never sent, and waits for the next claim, behind that row.
fn row_outcome(
    row: &ClaimedRow,
    delivery: Option<Delivery>,
    settings: &BatchSettings,
    metrics: &Metrics,
) -> RowOutcome {
    match delivery {
        Some(Delivery::Confirmed) => RowOutcome::Published,
        Some(Delivery::Rejected(rejection)) => {
            metrics.failure(rejection_reason(&rejection));
            after_rejection(row, rejection, settings)
        }
        // Nothing known about the message, or the broker nacked it (its state, not the
        // message's fault): pending again at commit, attempts unchanged.
        Some(Delivery::Unknown(unconfirmed)) => {
            metrics.failure(unconfirmed_reason(unconfirmed));
            RowOutcome::Untouched
        }
        None => RowOutcome::Untouched,
    }
}

/// The metric label of a broker refusal.
fn rejection_reason(rejection: &Rejection) -> FailureReason {
    match rejection {
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
        Unconfirmed::Nacked => FailureReason::Nack,
    }
}

/// Where a batch's claim starts.
#[derive(Debug, Clone, Copy)]
pub enum ClaimFrom<'a> {
    /// Here: per-key claims (at the head of their lanes), and tests.
    Start(ClaimStart),
    /// Where the process's cursor says, in turn with the process's other workers.
    Cursor(&'a SharedCursor),
}

/// Runs one batch, claiming from where `claim_from` says (see [`super::cursor::ClaimCursor`]). Returns
/// how many rows it claimed (0 means nothing for us there). Its span carries the batch size and
/// sits inside the worker's and the relay's, so a log line of the batch says which relay,
/// worker and size without repeating them.
///
/// `lanes` are the lanes the worker holds under per-key ordering: the claim takes only their
/// rows, and the batch goes out in waves (see [`waves`]) so that no row is published before
/// every earlier row of its key in the batch was confirmed. None: unordered, one wave.
pub async fn run_batch<P: Publisher>(
    conn: &mut PgConnection,
    publisher: &mut P,
    statements: &Statements,
    settings: &BatchSettings,
    metrics: &Metrics,
    claim_from: ClaimFrom<'_>,
    lanes: Option<&[i32]>,
) -> Result<BatchReport, BatchError> {
    let limit = settings.batch_size;
    run_batch_up_to(
        conn, publisher, statements, settings, metrics, claim_from, lanes, limit,
    )
    .await
}

/// [`run_batch`], claiming at most `limit` rows (at most the batch size): what the rate limit
/// granted (see `runtime::rate`).
#[allow(clippy::too_many_arguments)]
#[tracing::instrument(name = "batch", skip_all, fields(batch_size = limit))]
pub async fn run_batch_up_to<P: Publisher>(
    conn: &mut PgConnection,
    publisher: &mut P,
    statements: &Statements,
    settings: &BatchSettings,
    metrics: &Metrics,
    claim_from: ClaimFrom<'_>,
    lanes: Option<&[i32]>,
    limit: usize,
) -> Result<BatchReport, BatchError> {
    // Only while spans are on does the batch note its steps (see `note`).
    let settling = statements.settling.is_some() && lanes.is_none();
    let mut timeline = settings
        .spans
        .as_ref()
        .map(|_| BatchTimeline::start(settling));
    let result = claim_publish_settle(
        conn,
        publisher,
        statements,
        settings,
        metrics,
        claim_from,
        lanes,
        limit,
        &mut timeline,
    )
    .await;
    if let (Some(spans), Some(timeline)) = (&settings.spans, timeline) {
        let end = match &result {
            Ok(report) => BatchEnd::Settled(SettledCounts {
                published: report.published,
                retried: report.retried,
                dead_lettered: report.dead_lettered,
                untouched: report.untouched,
                nacked: report.nacked,
            }),
            Err(error) => BatchEnd::Failed(error.to_string()),
        };
        spans.record(timeline, end);
    }
    result
}

/// Notes a step of the batch for its spans, when they are built.
fn note(timeline: &mut Option<BatchTimeline>, step: impl FnOnce(&mut BatchTimeline)) {
    if let Some(timeline) = timeline {
        step(timeline);
    }
}

/// The batch itself (see [`run_batch_up_to`]), noting its steps in `timeline` when it is Some.
#[allow(clippy::too_many_arguments)]
async fn claim_publish_settle<P: Publisher>(
    conn: &mut PgConnection,
    publisher: &mut P,
    statements: &Statements,
    settings: &BatchSettings,
    metrics: &Metrics,
    claim_from: ClaimFrom<'_>,
    lanes: Option<&[i32]>,
    limit: usize,
    timeline: &mut Option<BatchTimeline>,
) -> Result<BatchReport, BatchError> {
    let mut tx = timed(metrics, Stage::Claim, conn.begin()).await?;
    let limit = limit.clamp(1, settings.batch_size.max(1)) as i64;
    let settling = statements.settling.as_ref().filter(|_| lanes.is_none());
    // Under a transaction pool the statements go unnamed (a named one would outlive this
    // transaction on a server session other clients get next); on a session they stay named
    // and prepared once per connection, sqlx's default.
    let persistent = statements.persistent();
    let (turn, start) = match claim_from {
        ClaimFrom::Start(start) => (None, start),
        ClaimFrom::Cursor(cursor) => {
            let turn = cursor.turn().await;
            let start = turn.start;
            (Some(turn), start)
        }
    };
    let claim = match settling {
        Some(settling) => settling_claim_query(settling, limit, start),
        None => claim_query(statements, limit, start, lanes),
    }
    .persistent(persistent);
    // The claim cursor schedules the wide claims by their cost, so it gets the time too.
    let (rows, claim_time) =
        observed(metrics, Stage::Claim, bounded(claim.fetch_all(&mut *tx))).await;
    let rows = rows?;
    metrics.batch_size.observe(rows.len() as f64);
    note(timeline, |t| t.claimed(rows.len()));
    if rows.is_empty() {
        let found = ClaimFound {
            time: claim_time,
            ..ClaimFound::default()
        };
        if let Some(turn) = turn {
            turn.claimed(&found, limit as usize);
        }
        commit(metrics, settings, tx).await?;
        return Ok(BatchReport {
            found,
            ..BatchReport::default()
        });
    }
    let mut rows = decode_all(&rows)?;
    if settling.is_some() {
        // An UPDATE returns its rows in no promised order; the batch goes out, and the cursor
        // moves on, in claim order. (Stable and nearly sorted already: cheap.)
        rows.sort_by_key(|row| row.occurred_at);
    }
    let found = ClaimFound {
        claimed: rows.len(),
        first: rows.first().and_then(|row| row.occurred_at),
        last: rows.last().and_then(|row| row.occurred_at),
        time: claim_time,
    };
    // The turn ends as soon as the claim's rows are known: the next worker's claim starts
    // past them while this one publishes.
    if let Some(turn) = turn {
        turn.claimed(&found, limit as usize);
    }
    // And the other relays' claims, through the table's frontier, at once (setval is not
    // transactional): each seek of theirs then starts past this batch too.
    if let (Some(advance), Some(last), None) = (&statements.advance_frontier, found.last, lanes) {
        let advance = sqlx::query(AssertSqlSafe(advance.clone()))
            .bind(last.timestamp_micros())
            .persistent(persistent);
        bounded(advance.execute(&mut *tx)).await?;
    }

    // Publish every well-formed row; malformed ones are settled as dead letters right away.
    let prepared: Vec<Result<Message<'_>, Malformed>> = rows
        .iter()
        .map(|row| to_message(row, &settings.routing_key))
        .collect();
    super::trace_report::count_dropped(prepared.iter().flatten(), metrics);
    note(timeline, |t| t.messages(prepared.iter().flatten()));
    let publish_started = timeline.as_ref().map(|_| SystemTime::now());
    let (delivered, mut broken) = match lanes {
        None => {
            let messages: Vec<Message<'_>> = prepared
                .iter()
                .filter_map(|p| p.as_ref().ok().cloned())
                .collect();
            let outcome = publish_in_slot(publisher, &messages, settings, metrics).await;
            (
                outcome.deliveries.into_iter().map(Some).collect(),
                outcome.broken,
            )
        }
        Some(_) => {
            // The well-formed rows, as (row index, message), in claim order.
            let sendable: Vec<(usize, Message<'_>)> = prepared
                .iter()
                .enumerate()
                .filter_map(|(index, p)| Some((index, p.as_ref().ok()?.clone())))
                .collect();
            publish_in_waves(publisher, &rows, &sendable, settings, metrics).await
        }
    };
    if let (Some(timeline), Some(started)) = (timeline.as_mut(), publish_started) {
        timeline.published(started, broken.as_ref().map(ToString::to_string));
    }

    let mut outcomes = Vec::with_capacity(rows.len());
    let mut nacked = 0;
    let mut delivered = delivered.into_iter();
    for (row, prepared) in rows.iter().zip(&prepared) {
        let outcome = match prepared {
            Err(malformed) => {
                metrics.failure(FailureReason::Malformed);
                RowOutcome::DeadLettered(RowError::Malformed(malformed.clone()))
            }
            Ok(_) => {
                let delivery = delivered.next().expect("one delivery per message");
                nacked += usize::from(delivery == Some(Delivery::Unknown(Unconfirmed::Nacked)));
                row_outcome(row, delivery, settings, metrics)
            }
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

    let (counts, settle) = match settling {
        Some(settling) => revert_query(settling, &rows, &outcomes),
        None => settle_query(statements, &rows, &outcomes),
    };
    if let Some(settle) = settle {
        note(timeline, BatchTimeline::marked);
        let settle = settle.persistent(persistent);
        timed(metrics, Stage::Mark, settle.execute(&mut *tx)).await?;
    }
    commit(metrics, settings, tx).await?;
    if lanes.is_some() {
        metrics.blocked_keys.record(key_events(&rows, &outcomes));
    }
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
        nacked,
        broker_broken: broken,
        found,
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
    // While the slot was awaited another worker may have met the broker's alarm: publishing
    // now would only wait out the publish timeout with the rows locked. Given back instead.
    if publisher.is_blocked() || metrics.broker_blocked.get() > 0 {
        return BatchOutcome::not_sent(messages.len());
    }
    // The same for what the publish before this one found (see `publish_notices`): a blocked
    // connection, or no confirm on a connection older than it, whose silent path this one most
    // likely shares (a cut); waiting out its own deadline would hold the rows that long again,
    // once per worker queued for the slot. Reconnecting tells at once, without rows.
    match settings.publish_notices.hold_back(publisher.opened_at()) {
        Some(HoldBack::Blocked) => return BatchOutcome::not_sent(messages.len()),
        Some(HoldBack::PeerTimedOut) => {
            return BatchOutcome::not_sent_replacing(messages.len(), BrokerFailure::PeerTimedOut);
        }
        None => {}
    }
    let started = Instant::now();
    let outcome = publisher.publish_batch(Target::Main, messages).await;
    if publisher.is_blocked() {
        // Before the slot goes to the next worker, whose own connection looks unblocked
        // until it publishes.
        settings.publish_notices.note_blocked();
    } else if matches!(outcome.broken, Some(BrokerFailure::ConfirmTimeout(_))) {
        settings.publish_notices.note_timed_out();
    }
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

/// The waves of a per-key batch: indexes into `keys` (one per message, in claim order), wave
/// `n` holding the `n`-th message of every key. A message without a key is unordered and goes
/// in the first wave.
pub fn waves(keys: &[Option<&[u8]>]) -> Vec<Vec<usize>> {
    let mut seen: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        let wave = match key {
            None => 0,
            Some(key) => {
                let count = seen.entry(key).or_default();
                *count += 1;
                *count - 1
            }
        };
        if waves.len() <= wave {
            waves.resize_with(wave + 1, Vec::new);
        }
        waves[wave].push(index);
    }
    waves
}

/// Publishes a per-key batch wave by wave, each wave awaited before the next: a message goes
/// out only once the message before it of its key was confirmed. After a refusal or an unknown
/// outcome the rest of that key's messages are held back (None), as is everything once the
/// connection broke. Returns one entry per message of `sendable`.
async fn publish_in_waves<P: Publisher>(
    publisher: &mut P,
    rows: &[ClaimedRow],
    sendable: &[(usize, Message<'_>)],
    settings: &BatchSettings,
    metrics: &Metrics,
) -> (Vec<Option<Delivery>>, Option<BrokerFailure>) {
    let keys: Vec<Option<&[u8]>> = sendable
        .iter()
        .map(|(index, _)| rows[*index].partition_key.as_deref())
        .collect();
    let mut delivered: Vec<Option<Delivery>> = vec![None; sendable.len()];
    let mut stopped: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
    let mut broken = None;
    for wave in waves(&keys) {
        if broken.is_some() {
            break;
        }
        let go: Vec<usize> = wave
            .into_iter()
            .filter(|&i| keys[i].is_none_or(|key| !stopped.contains(key)))
            .collect();
        let messages: Vec<Message<'_>> = go.iter().map(|&i| sendable[i].1.clone()).collect();
        let outcome = publish_in_slot(publisher, &messages, settings, metrics).await;
        broken = outcome.broken;
        for (i, delivery) in go.into_iter().zip(outcome.deliveries) {
            if delivery != Delivery::Confirmed
                && let Some(key) = keys[i]
            {
                stopped.insert(key);
            }
            delivered[i] = Some(delivery);
        }
    }
    (delivered, broken)
}

/// What a per-key batch did to each keyed row's key, in claim order: a row that will be tried
/// again holds its key back; one settled lets it move on. Rows left untouched (held back, or no
/// answer from the broker) change nothing.
fn key_events<'a>(
    rows: &'a [ClaimedRow],
    outcomes: &'a [RowOutcome],
) -> impl Iterator<Item = (&'a [u8], i32, KeyEvent)> {
    rows.iter().zip(outcomes).filter_map(|(row, outcome)| {
        let event = match outcome {
            RowOutcome::Retry(_) => KeyEvent::Refused,
            RowOutcome::Published | RowOutcome::DeadLettered(_) => KeyEvent::Settled,
            RowOutcome::Untouched => return None,
        };
        Some((row.partition_key.as_deref()?, row.lane?, event))
    })
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
    fn waves_take_one_message_per_key_in_claim_order() {
        let (a, b) = (Some(&b"a"[..]), Some(&b"b"[..]));
        assert_eq!(
            waves(&[a, b, a, None, a, b, None]),
            vec![vec![0, 1, 3, 6], vec![2, 5], vec![4]]
        );
        assert_eq!(waves(&[None, None]), vec![vec![0, 1]]);
        assert!(waves(&[]).is_empty());
    }

    fn settings() -> BatchSettings {
        BatchSettings {
            batch_size: 10,
            routing_key: RoutingKey::Type,
            max_attempts: 1,
            has_attempts_column: true,
            dead_letter_exchange: true,
            publish_slots: None,
            publish_notices: Arc::default(),
            commit_timeout: crate::defaults::COMMIT_TIMEOUT,
            spans: None,
        }
    }

    /// A broker that went silent: every publish waits out its deadline.
    struct SilentBroker {
        publishes: usize,
        opened_at: Instant,
    }

    impl SilentBroker {
        fn opened() -> Self {
            Self {
                publishes: 0,
                opened_at: Instant::now(),
            }
        }
    }

    impl Publisher for SilentBroker {
        async fn publish_batch(&mut self, _: Target, messages: &[Message<'_>]) -> BatchOutcome {
            self.publishes += 1;
            let timeout = Duration::from_secs(5);
            BatchOutcome {
                deliveries: vec![Delivery::Unknown(Unconfirmed::Timeout); messages.len()],
                broken: Some(BrokerFailure::ConfirmTimeout(timeout)),
                publish_time: Duration::ZERO,
            }
        }

        fn is_connected(&self) -> bool {
            true
        }

        fn opened_at(&self) -> Instant {
            self.opened_at
        }
    }

    /// Issue 53, the broker cut: the workers queued for the publish slot behind a publish that
    /// got no confirm give their rows back and reconnect, instead of each waiting out a
    /// deadline of its own with the rows locked.
    #[tokio::test]
    async fn the_slot_after_a_timed_out_publish_reconnects_without_publishing() {
        let metrics = Metrics::new();
        let settings = BatchSettings {
            publish_slots: Some(Arc::new(Semaphore::new(1))),
            publish_notices: Arc::default(),
            ..settings()
        };
        let rows = [row()];
        let messages: Vec<Message<'_>> = rows
            .iter()
            .map(|r| to_message(r, &settings.routing_key).unwrap())
            .collect();
        let mut queued = SilentBroker::opened();
        let mut first = SilentBroker::opened();
        let outcome = publish_in_slot(&mut first, &messages, &settings, &metrics).await;
        assert!(matches!(
            outcome.broken,
            Some(BrokerFailure::ConfirmTimeout(_))
        ));
        let outcome = publish_in_slot(&mut queued, &messages, &settings, &metrics).await;
        assert_eq!(queued.publishes, 0, "published into the silence");
        assert!(matches!(outcome.broken, Some(BrokerFailure::PeerTimedOut)));
        assert_eq!(
            outcome.deliveries,
            vec![Delivery::Unknown(Unconfirmed::BrokerUnavailable)]
        );
        // A connection opened after the timeout (the timed-out worker's new one, or the queued
        // worker's after its reconnect) has proven the path: it publishes.
        let mut reconnected = SilentBroker::opened();
        publish_in_slot(&mut reconnected, &messages, &settings, &metrics).await;
        assert_eq!(reconnected.publishes, 1);
    }

    /// Issue 44: a nack is the broker's state. Even at the last attempt it neither retries
    /// (which would spend an attempt) nor dead-letters: the row is left as it was.
    #[test]
    fn a_nack_leaves_the_row_untouched_even_at_its_last_attempt() {
        let metrics = Metrics::new();
        let last = ClaimedRow {
            attempts: 4,
            ..row()
        };
        for row in [row(), last] {
            let outcome = row_outcome(
                &row,
                Some(Delivery::Unknown(Unconfirmed::Nacked)),
                &settings(),
                &metrics,
            );
            assert_eq!(outcome, RowOutcome::Untouched);
        }
        assert!(
            metrics
                .render()
                .contains("outbox_relay_publish_failures_total{reason=\"nack\"} 2")
        );
        // A refusal of the message itself still spends its attempt.
        let refused = row_outcome(
            &row(),
            Some(Delivery::Rejected(Rejection::Refused {
                error: "amqp:not-allowed".into(),
            })),
            &settings(),
            &metrics,
        );
        assert!(
            matches!(refused, RowOutcome::DeadLettered(_)),
            "{refused:?}"
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
            publish_notices: Arc::default(),
            commit_timeout: crate::defaults::COMMIT_TIMEOUT,
            spans: None,
        };
        let unroutable = || Rejection::Unroutable {
            reply: "312 NO_ROUTE".into(),
        };
        let first = after_rejection(&row(), unroutable(), &settings);
        assert!(
            matches!(first, RowOutcome::Retry(ref e) if e.to_string().starts_with("attempt 1/3"))
        );
        let last = after_rejection(
            &ClaimedRow {
                attempts: 2,
                ..row()
            },
            unroutable(),
            &settings,
        );
        assert!(matches!(last, RowOutcome::DeadLettered(_)));
        let no_column = BatchSettings {
            has_attempts_column: false,
            ..settings
        };
        assert!(matches!(
            after_rejection(&row(), unroutable(), &no_column),
            RowOutcome::DeadLettered(_)
        ));
    }
}
