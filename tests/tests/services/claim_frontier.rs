//! The claim frontier the relays of one table share (a sequence the migration makes): a seek
//! starts past the rows another relay's session has just claimed instead of stepping over them,
//! the frontier never moves back and never past the database's now(), and a relay whose role
//! may not advance it (or whose table has none) seeks as before.

use chrono::{DateTime, Utc};
use outbox_relay::table::OutboxTable;
use outbox_relay::table::inspect::{PayloadKind, inspect};
use outbox_relay::table::migrate::{MigrationOptions, migrate};
use outbox_relay::table::sql::Statements;
use outbox_tests::{db, unique};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use uuid::Uuid;

const ROWS: u64 = 40;
const BATCH: i64 = 10;

/// A migrated table of ROWS pending rows; returns the ids and claim positions in claim order.
async fn migrated_table() -> (PgConnection, OutboxTable, Vec<(Uuid, DateTime<Utc>)>) {
    let table = db::table(&unique("frontier"));
    let mut conn = db::seeded_table(&table, ROWS).await;
    migrate(&mut conn, &table, &MigrationOptions::default())
        .await
        .expect("migrate");
    // Forty rows: the planner would read the heap; what is measured here is the index scan.
    db::exec(&mut conn, "SET enable_seqscan = off").await;
    db::exec(&mut conn, "SET enable_bitmapscan = off").await;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT id, occurred_on_utc FROM {} ORDER BY occurred_on_utc",
        table.name.quoted()
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect();
    (conn, table, rows)
}

async fn frontier_micros(conn: &mut PgConnection, table: &OutboxTable) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT last_value FROM {}",
        table.frontier_sequence().quoted()
    )))
    .fetch_one(conn)
    .await
    .unwrap()
}

async fn advance(conn: &mut PgConnection, statements: &Statements, to: DateTime<Utc>) {
    let sql = statements
        .advance_frontier
        .clone()
        .expect("a shared frontier");
    sqlx::query(AssertSqlSafe(sql))
        .bind(to.timestamp_micros())
        .execute(conn)
        .await
        .expect("advance the frontier");
}

/// The seek's plan as it ran (EXPLAIN ANALYZE): the rows the index scan under the lock node
/// handed up, claimed or stepped over, and the ids claimed.
async fn seek_stepping(
    conn: &mut PgConnection,
    claim_from: &str,
    bound: DateTime<Utc>,
) -> (f64, Vec<Uuid>) {
    let mut tx = conn.begin().await.unwrap();
    let ids: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM ({claim_from}) AS claimed"
    )))
    .bind(BATCH)
    .bind(bound)
    .fetch_all(&mut *tx)
    .await
    .expect("seek");
    tx.rollback().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let plan: Value = sqlx::query_scalar(AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {claim_from}"
    )))
    .bind(BATCH)
    .bind(bound)
    .fetch_one(&mut *tx)
    .await
    .expect("explain the seek");
    tx.rollback().await.unwrap();
    (
        index_scan_rows(&plan[0]["Plan"]).expect("an index scan"),
        ids,
    )
}

fn index_scan_rows(node: &Value) -> Option<f64> {
    if node["Node Type"] == "Index Scan" {
        return node["Actual Rows"].as_f64();
    }
    node["Plans"].as_array()?.iter().find_map(index_scan_rows)
}

#[tokio::test]
async fn a_seek_starts_past_the_rows_another_relay_just_claimed() {
    let (mut conn, table, rows) = migrated_table().await;
    let shared = Statements::with_shared_frontier(&table, PayloadKind::Json);
    let alone = Statements::new(&table, PayloadKind::Json);
    assert!(inspect(&mut conn, &table).await.unwrap().shared_frontier);

    // Relay A claims the first 20 rows and holds them, as a batch being published does.
    let mut relay_a = db::connect().await;
    let mut held = relay_a.begin().await.unwrap();
    let taken: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM ({}) AS claimed",
        alone.claim
    )))
    .bind(20i64)
    .fetch_all(&mut *held)
    .await
    .unwrap();
    assert_eq!(taken.len(), 20);
    advance(&mut held, &shared, rows[19].1).await;

    // Relay B seeks from its own last row, the first one. Without the frontier its scan steps
    // over the 20 rows A holds; with it, it starts at A's last row (held: one step).
    let (stepped_alone, claimed_alone) =
        seek_stepping(&mut conn, &alone.claim_from, rows[0].1).await;
    let (stepped_shared, claimed_shared) =
        seek_stepping(&mut conn, &shared.claim_from, rows[0].1).await;
    let expected: Vec<Uuid> = rows[20..30].iter().map(|(id, _)| *id).collect();
    assert_eq!(claimed_alone, expected);
    assert_eq!(claimed_shared, expected, "the same rows either way");
    assert_eq!(stepped_alone, (20 + BATCH) as f64, "steps over all A holds");
    assert_eq!(stepped_shared, (1 + BATCH) as f64, "starts at A's last row");

    // A's batch fails: its rows are pending again behind the frontier. A seek does not see
    // them (the bound is inclusive: it sees the frontier's own row), the wide claims do (see
    // claim_seek.rs), as the plain claim from the head does.
    held.rollback().await.unwrap();
    let (_, behind) = seek_stepping(&mut conn, &shared.claim_from, rows[0].1).await;
    let from_frontier: Vec<Uuid> = rows[19..29].iter().map(|(id, _)| *id).collect();
    assert_eq!(behind, from_frontier);
    let head: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM ({}) AS claimed",
        shared.claim
    )))
    .bind(BATCH)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(head, taken[..BATCH as usize]);

    // The settling seek starts at the frontier too.
    let settling = shared
        .settling
        .as_ref()
        .expect("mark mode settles in claim");
    let mut tx = conn.begin().await.unwrap();
    let settled: Vec<Uuid> = sqlx::query(AssertSqlSafe(settling.claim_from.to_string()))
        .bind(BATCH)
        .bind(rows[0].1)
        .fetch_all(&mut *tx)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get("id"))
        .collect();
    tx.rollback().await.unwrap();
    let mut settled = settled;
    settled.sort_by_key(|id| from_frontier.iter().position(|e| e == id));
    assert_eq!(settled, from_frontier);
}

#[tokio::test]
async fn the_frontier_never_moves_back_nor_past_now() {
    let (mut conn, table, rows) = migrated_table().await;
    let shared = Statements::with_shared_frontier(&table, PayloadKind::Json);
    assert_eq!(frontier_micros(&mut conn, &table).await, 0, "a fresh one");
    advance(&mut conn, &shared, rows[9].1).await;
    assert_eq!(
        frontier_micros(&mut conn, &table).await,
        rows[9].1.timestamp_micros()
    );
    advance(&mut conn, &shared, rows[3].1).await;
    assert_eq!(
        frontier_micros(&mut conn, &table).await,
        rows[9].1.timestamp_micros(),
        "a claim of older rows leaves it"
    );
    let before: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    advance(&mut conn, &shared, before + chrono::Duration::days(365)).await;
    let after: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let frontier = frontier_micros(&mut conn, &table).await;
    assert!(
        frontier >= before.timestamp_micros() && frontier <= after.timestamp_micros(),
        "a row dated a year ahead moves the frontier to now() only"
    );
}

#[tokio::test]
async fn without_the_sequence_or_the_right_to_advance_it_claims_go_on_alone() {
    let (mut conn, table, _) = migrated_table().await;
    let sequence = table.frontier_sequence().quoted();
    let role = unique("no_frontier");
    db::exec(&mut conn, &format!("CREATE ROLE {role} NOLOGIN")).await;
    db::exec(&mut conn, &format!("SET ROLE {role}")).await;
    let shape = inspect(&mut conn, &table).await.unwrap();
    db::exec(&mut conn, "RESET ROLE").await;
    db::exec(&mut conn, &format!("DROP ROLE {role}")).await;
    assert!(!shape.shared_frontier, "a role that may not advance it");
    let statements = Statements::for_shape(&table, &shape);
    assert!(statements.advance_frontier.is_none());
    assert!(!statements.claim_from.contains(&sequence));

    db::exec(&mut conn, &format!("DROP SEQUENCE {sequence}")).await;
    assert!(!inspect(&mut conn, &table).await.unwrap().shared_frontier);
    // The migration makes it again; it belongs to the table and goes with it.
    let report = migrate(&mut conn, &table, &MigrationOptions::default())
        .await
        .unwrap();
    assert!(report.frontier_created);
    assert!(inspect(&mut conn, &table).await.unwrap().shared_frontier);
    db::exec(&mut conn, &format!("DROP TABLE {}", table.name.quoted())).await;
    let left: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&sequence)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!left, "dropped with its table");
}
