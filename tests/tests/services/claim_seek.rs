//! The seek claim against the real PostgreSQL: after a batch, the next claim starts at the
//! last claimed row's claim position, even when that row is gone (delete mode), for both
//! timestamptz and timestamp claim-order columns, and the bound is an index condition. The
//! recent claim starts at the earlier of its horizon and now() minus the window, and running
//! relays still relay rows committed late.

use chrono::{DateTime, Utc};
use outbox_relay::protocol::claim::RECENT_WINDOW;
use outbox_relay::table::inspect::inspect;
use outbox_relay::table::migrate::{MigrationOptions, migrate};
use outbox_relay::table::sql::Statements;
use outbox_relay::table::{DeliveryMode, OutboxTable};
use outbox_tests::{db, unique};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use uuid::Uuid;

const ROWS: usize = 10;

/// A delete-mode table whose claim-order column has `column_type`, with ROWS pending rows
/// whose claim positions are distinct and carry microseconds; returns the ids in claim order.
async fn table_with_rows(column_type: &str) -> (PgConnection, OutboxTable, Vec<Uuid>) {
    let mut table = db::table(&unique("seek"));
    table.mode = DeliveryMode::Delete;
    let mut conn = db::seeded_table(&table, 0).await;
    let (t, occurred) = (table.name.quoted(), table.columns.occurred_at.quoted());
    db::exec(
        &mut conn,
        &format!("ALTER TABLE {t} ALTER COLUMN {occurred} TYPE {column_type}"),
    )
    .await;
    migrate(&mut conn, &table, &MigrationOptions::default())
        .await
        .expect("migrate");
    // A session zone with DST and an offset, so a timestamp column's round trip through
    // timestamptz is really exercised.
    db::exec(&mut conn, "SET TimeZone = 'America/New_York'").await;
    let mut ids = Vec::new();
    for i in 0..ROWS {
        let id = Uuid::new_v4();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (id, type, content, {occurred}) \
             VALUES ($1, 'seek', '{{}}', '2026-03-01 10:00:00'::{column_type} + make_interval(secs => $2))"
        )))
        .bind(id)
        .bind(i as f64 * 1.000_123)
        .execute(&mut conn)
        .await
        .expect("insert");
        ids.push(id);
    }
    (conn, table, ids)
}

/// Claims (seeking from `bound` when given), returning the ids and the last claim position.
async fn claim(
    conn: &mut PgConnection,
    statements: &Statements,
    limit: i64,
    bound: Option<DateTime<Utc>>,
) -> (Vec<Uuid>, Option<DateTime<Utc>>) {
    let query = match bound {
        None => sqlx::query(AssertSqlSafe(statements.claim.clone())).bind(limit),
        Some(at) => sqlx::query(AssertSqlSafe(statements.claim_from.clone()))
            .bind(limit)
            .bind(at),
    };
    let rows = query.fetch_all(&mut *conn).await.expect("claim");
    let ids = rows.iter().map(|r| r.get::<Uuid, _>(0)).collect();
    let last = rows.last().map(|r| r.get::<DateTime<Utc>, _>(3));
    (ids, last)
}

async fn seek_starts_at_the_last_claimed_position(column_type: &str) {
    let (mut conn, table, ids) = table_with_rows(column_type).await;
    let shape = inspect(&mut conn, &table).await.expect("inspect");
    let statements = Statements::for_shape(&table, &shape);

    // One batch of four, settled the delete-mode way: the bound row no longer exists.
    let mut tx = conn.begin().await.unwrap();
    let (first, last) = claim(&mut tx, &statements, 4, None).await;
    assert_eq!(first, ids[..4]);
    sqlx::query(AssertSqlSafe(statements.settle_all_published.clone()))
        .bind(&first)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // A row committed late with an older claim position: the seek passes it by (the regular
    // full claim is what picks it up), which shows the bound holds though its row is gone.
    let late = insert_row_at(&mut conn, &table, "'2026-03-01 09:00:00'").await;

    // Only rows at or after the bound, and the round trip of the bound is exact (the first row
    // after it is not skipped).
    let (rest, _) = claim(&mut conn, &statements, 100, last).await;
    assert_eq!(rest, ids[4..], "seek from the deleted row's claim position");
    let (full, _) = claim(&mut conn, &statements, 1, None).await;
    assert_eq!(full, [late], "the full claim starts at the head");
    sqlx::query(AssertSqlSafe(statements.settle_all_published.clone()))
        .bind(&full)
        .execute(&mut conn)
        .await
        .unwrap();

    // The bound is inclusive: seeking from row 7's own position claims row 7 first.
    let (upto7, at7) = claim(&mut conn, &statements, 4, None).await;
    assert_eq!(upto7, ids[4..8]);
    let (from7, _) = claim(&mut conn, &statements, 100, at7).await;
    assert_eq!(from7, ids[7..]);

    let seek = statements
        .claim_from
        .replace("$1", "10")
        .replace("$2", "'2026-03-01 15:00:03+00'");
    assert_index_condition(&mut conn, &seek, "Index Cond: (occurred_on_utc >=").await;
}

/// Asserts that the plan PostgreSQL picks for `sql` (when it may not scan the table
/// sequentially) has `condition`: the claim's bound is an index condition, not a filter
/// applied after walking the index from its head, where the dead entries are.
async fn assert_index_condition(conn: &mut PgConnection, sql: &str, condition: &str) {
    db::exec(conn, "SET enable_seqscan = off").await;
    let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!("EXPLAIN {sql}")))
        .fetch_all(&mut *conn)
        .await
        .expect("explain");
    let plan = plan.join("\n");
    assert!(
        plan.contains(condition),
        "{condition} missing from:\n{plan}"
    );
}

#[tokio::test]
async fn seek_claim_on_a_timestamptz_column() {
    seek_starts_at_the_last_claimed_position("timestamptz").await;
}

#[tokio::test]
async fn seek_claim_on_a_timestamp_column_in_a_zone_with_an_offset() {
    seek_starts_at_the_last_claimed_position("timestamp").await;
}

/// Claims with the recent claim from `horizon`, returning the ids.
async fn claim_recent(
    conn: &mut PgConnection,
    statements: &Statements,
    horizon: Option<&str>,
) -> Vec<Uuid> {
    let horizon: Option<DateTime<Utc>> = match horizon {
        None => None,
        Some(sql) => Some(
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT ({sql})::timestamptz")))
                .fetch_one(&mut *conn)
                .await
                .expect("horizon"),
        ),
    };
    sqlx::query_scalar(AssertSqlSafe(statements.claim_recent.clone()))
        .bind(100i64)
        .bind(horizon)
        .bind(RECENT_WINDOW.as_secs_f64())
        .fetch_all(&mut *conn)
        .await
        .expect("recent claim")
}

/// The recent claim starts at the earlier of its horizon and now() minus the window: it sees
/// a row committed a moment late whatever the horizon, and rows older than the window only
/// from the horizon on; its bound is an index condition too.
#[tokio::test]
async fn recent_claim_starts_at_the_earlier_of_its_horizon_and_the_window() {
    let (mut conn, table, ids) = table_with_rows("timestamptz").await;
    let shape = inspect(&mut conn, &table).await.expect("inspect");
    let statements = Statements::for_shape(&table, &shape);
    // Claim order: the ten rows of March, then an hour ago, then two seconds ago.
    let hour_ago = insert_row_at(&mut conn, &table, "now() - interval '1 hour'").await;
    let moment_ago = insert_row_at(&mut conn, &table, "now() - interval '2 seconds'").await;

    let row6 = format!(
        "(SELECT {} FROM {} WHERE id = '{}')",
        table.columns.occurred_at.quoted(),
        table.name.quoted(),
        ids[6]
    );
    let from_row6 = claim_recent(&mut conn, &statements, Some(&row6)).await;
    let mut expected = ids[6..].to_vec();
    expected.extend([hour_ago, moment_ago]);
    assert_eq!(from_row6, expected, "an older horizon wins");
    for horizon in [None, Some("now() + interval '1 day'")] {
        assert_eq!(
            claim_recent(&mut conn, &statements, horizon).await,
            [moment_ago],
            "with horizon {horizon:?} the window wins"
        );
    }

    let recent = statements
        .claim_recent
        .replace("$1", "10")
        .replace("$2", "NULL")
        .replace("$3", "10");
    assert_index_condition(&mut conn, &recent, "Index Cond: (occurred_on_utc >= LEAST(").await;
}

/// Inserts one pending row at the claim position the SQL expression `occurred` gives.
async fn insert_row_at(conn: &mut PgConnection, table: &OutboxTable, occurred: &str) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id, type, content, {}) VALUES ($1, 'late', '{{}}', {occurred})",
        table.name.quoted(),
        table.columns.occurred_at.quoted()
    )))
    .bind(id)
    .execute(&mut *conn)
    .await
    .expect("insert a row");
    id
}

/// Waits until `relay` has brought the table's pending rows down to `rows` (it is draining);
/// panics with its log when it has not within a minute.
async fn wait_until_pending_at_most(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rows: i64,
    relay: &outbox_tests::process::RelayProcess,
) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while db::pending(conn, table).await > rows {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay did not start; log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A claim position older than every seeded row's.
const A_DAY_AGO: &str = "now() - interval '1 day'";

/// A running relay whose worker seeks from its last batch still relays rows committed late
/// with an older claim position: one while it drains a backlog in full batches, one after it
/// went idle at the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeking_relay_still_relays_rows_committed_late() {
    use lapin::ExchangeKind;
    use outbox_tests::{broker, process};
    use std::time::Duration;

    let name = unique("late");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 20_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay(
        &name,
        &process::run_args(&name, &name, &["--workers", "1", "--batch-size", "20"]),
    );

    // Mid-drain: wait until the worker is seeking through the backlog.
    wait_until_pending_at_most(&mut conn, &table, 19_000, &relay).await;
    let late_while_busy = insert_row_at(&mut conn, &table, A_DAY_AGO).await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending; relay log:\n{}",
        relay.log_text()
    );

    // Idle at the head: a late row arrives after the last batch.
    let late_while_idle = insert_row_at(&mut conn, &table, A_DAY_AGO).await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "the late row stayed pending; relay log:\n{}",
        relay.log_text()
    );
    assert_eq!(
        consumer.wait_for(20_002, Duration::from_secs(30)).await,
        20_002
    );
    assert!(consumer.has(&late_while_busy) && consumer.has(&late_while_idle));
    assert!(consumer.duplicates().is_empty());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
}

/// While a worker drains a backlog in full batches it runs the full claim only once a minute;
/// a row committed a moment late, behind its seek, is picked up by the recent claim within
/// about a second, long before the backlog ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_relay_relays_a_row_committed_a_moment_late_before_the_backlog_ends() {
    use lapin::ExchangeKind;
    use outbox_tests::{broker, process};
    use std::time::Duration;

    // Batches of 10 relay a few hundred rows a second here: the drain takes many seconds.
    const BACKLOG: i64 = 8_000;
    let name = unique("recent");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, BACKLOG as u64).await;
    let (t, occurred, processed) = (
        table.name.quoted(),
        table.columns.occurred_at.quoted(),
        table.columns.processed_at.quoted(),
    );
    // The backlog's claim positions an hour ahead: a row inserted now is behind the worker's
    // seek bound all through the drain, yet inside the recent window.
    db::exec(
        &mut conn,
        &format!("UPDATE {t} SET {occurred} = {occurred} + interval '1 hour'"),
    )
    .await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay(
        &name,
        &process::run_args(&name, &name, &["--workers", "1", "--batch-size", "10"]),
    );
    wait_until_pending_at_most(&mut conn, &table, BACKLOG - 200, &relay).await;
    let late = insert_row_at(&mut conn, &table, "now() - interval '1 second'").await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending; relay log:\n{}",
        relay.log_text()
    );
    let relayed_after_it = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {t} WHERE {processed} > \
             (SELECT {processed} FROM {t} WHERE id = '{late}')"
        ),
    )
    .await;
    let left_when_inserted = BACKLOG - 200;
    assert!(
        relayed_after_it >= 1_000,
        "the late row was relayed with only {relayed_after_it} of the ~{left_when_inserted} \
         backlog rows after it: the recent claim did not pick it up"
    );
    assert_eq!(
        consumer
            .wait_for(BACKLOG as u64 + 1, Duration::from_secs(30))
            .await,
        BACKLOG as u64 + 1
    );
    assert!(consumer.has(&late) && consumer.duplicates().is_empty());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
}
