//! The plans PostgreSQL picks for the claim and the backlog report on tables shaped like big
//! ones (issue 54): every claim, the settling claims of mark mode, the per-key claims, the capped
//! backlog count and the oldest pending row's age read the outbox table through the pending
//! index, with no sort and no sequential scan (but for delete mode's backlog count, see
//! [`backlog_case`]). A planner regression (a predicate that no longer matches the partial index,
//! an ORDER BY the index cannot serve) costs nothing on a test's small table and a full scan of
//! ten million rows in production; this makes it fail `make test`.
//!
//! The big tables are ten million processed and a million pending rows in mark mode, a million
//! pending in delete mode. Delete mode is built at that size; mark mode in proportion at a
//! thirty-third of it, which the planner still serves from the index everywhere (and
//! `CLAIM_PLAN_FULL_SCALE=1` builds it whole). Nothing steers the planner (no
//! `enable_seqscan = off`): the plans are the ones the statistics choose. Each statement is
//! prepared and explained both as a custom plan (its values known) and as the generic plan
//! PostgreSQL may switch a statement sqlx keeps prepared to after five runs.

use outbox_relay::defaults::{BACKLOG_CAP, BATCH_SIZE};
use outbox_relay::protocol::claim::RECENT_WINDOW;
use outbox_relay::table::ident::Ident;
use outbox_relay::table::inspect::PayloadKind;
use outbox_relay::table::migrate::{MigrationOptions, migrate};
use outbox_relay::table::outbox::DeliveryOrder;
use outbox_relay::table::sql::{LANES, Statements};
use outbox_relay::table::{DeliveryMode, OutboxTable};
use outbox_relay::tools::seed::{ARTICLE_TYPE, DEFAULT_KEYS};
use outbox_tests::{db, unique};
use serde_json::Value;
use sqlx::{AssertSqlSafe, PgConnection};

/// Pending rows of the big tables.
const FULL_SCALE_PENDING: i64 = 1_000_000;

/// Pending rows of the mark-mode table unless `CLAIM_PLAN_FULL_SCALE` is set: the big table's
/// divided by 33, so its ten processed rows per pending one load in a second or two.
const MARK_MODE_PENDING: i64 = 30_000;

/// Processed rows per pending row in mark mode, as in the big table.
const PROCESSED_PER_PENDING: i64 = 10;

/// Custom plans, and the generic plan a prepared statement may settle on.
const PLAN_CACHE_MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// Workers of a busy per-key relay: each holds a fair share of the lanes, LANES / 64 of them.
const BUSY_RELAY_WORKERS: i32 = 64;

fn mark_mode_pending() -> i64 {
    match std::env::var_os("CLAIM_PLAN_FULL_SCALE") {
        Some(_) => FULL_SCALE_PENDING,
        None => MARK_MODE_PENDING,
    }
}

/// A statement as the relay runs it, with SQL literals for the values the relay binds.
struct Case {
    name: String,
    sql: String,
    args: Vec<String>,
    /// The statement may read the whole table rather than the pending index.
    whole_table_allowed: bool,
}

impl Case {
    fn new(name: impl Into<String>, sql: &str, args: &[&str]) -> Self {
        Self {
            name: name.into(),
            sql: sql.to_string(),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            whole_table_allowed: false,
        }
    }
}

/// An outbox table with a partition-key column (so one table serves the unordered and the
/// per-key claims), filled with `processed` processed rows, then `pending` pending ones, in
/// claim order, migrated and analysed. Returns the table and the pending index.
async fn shaped_table(
    mode: DeliveryMode,
    processed: i64,
    pending: i64,
) -> (PgConnection, OutboxTable, String) {
    let mut table = db::table(&unique("plan"));
    table.mode = mode;
    table.columns.partition_key = Some(Ident::new("partition_key").expect("a column name"));
    let mut conn = db::seeded_table(&table, 0).await;
    fill(&mut conn, &table, processed, pending).await;
    let report = migrate(&mut conn, &table, &MigrationOptions::default())
        .await
        .expect("migrate");
    // Analysed, not vacuumed: with no page all-visible an index-only scan looks its dearest to
    // the planner, so the plans hold before autovacuum has reached a freshly loaded backlog too.
    db::exec(&mut conn, &format!("ANALYZE {}", table.name.quoted())).await;
    (conn, table, report.index_name)
}

/// Inserts the rows in one statement: the article's rows, keys taking turns as the seeder
/// gives them, processed rows first with the oldest claim positions, as a drained table's. The
/// ids are time-ordered, as the seeder's UUIDv7: they append to the primary key, where random
/// ones take twice as long to load.
async fn fill(conn: &mut PgConnection, table: &OutboxTable, processed: i64, pending: i64) {
    let c = &table.columns;
    let key = c.partition_key.as_ref().expect("a partition-key column");
    let rows = processed + pending;
    let id = "lpad(to_hex(n), 32, '0')::uuid";
    let occurred = format!("now() - ({rows} - n) * interval '1 millisecond'");
    db::exec(
        conn,
        &format!(
            "INSERT INTO {t} ({id_col}, {kind}, {payload}, {occurred_col}, {processed_col}, {key}) \
             SELECT {id}, '{ARTICLE_TYPE}', jsonb_build_object('OrderId', {id}), {occurred}, \
                    CASE WHEN n <= {processed} THEN {occurred} + interval '1 second' END, \
                    'order-' || n % {DEFAULT_KEYS} \
               FROM generate_series(1, {rows}) AS n",
            t = table.name.quoted(),
            id_col = c.id.quoted(),
            kind = c.kind.quoted(),
            payload = c.payload.quoted(),
            occurred_col = c.occurred_at.quoted(),
            processed_col = c.processed_at.quoted(),
            key = key.quoted(),
        ),
    )
    .await;
}

/// The claim position of the first pending row, as an SQL literal: where a worker seeks from,
/// and the horizon its recent claim starts at.
async fn pending_head(conn: &mut PgConnection, table: &OutboxTable) -> String {
    let sql = format!(
        "SELECT min({})::text FROM {} WHERE {} IS NULL",
        table.columns.occurred_at.quoted(),
        table.name.quoted(),
        table.columns.processed_at.quoted()
    );
    let head: String = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    format!("'{head}'::timestamptz")
}

/// The unordered statements: the three claims, their settling forms where the mode has them,
/// the capped backlog count and the oldest pending row's age.
fn unordered_cases(table: &OutboxTable, head: &str) -> Vec<Case> {
    let s = Statements::new(table, PayloadKind::Json);
    let (batch, window) = (BATCH_SIZE.to_string(), RECENT_WINDOW.as_secs().to_string());
    let mut cases = vec![
        Case::new("claim", &s.claim, &[&batch]),
        Case::new("claim_from", &s.claim_from, &[&batch, head]),
        Case::new("claim_recent", &s.claim_recent, &[&batch, head, &window]),
        backlog_case(table, &s),
        Case::new("oldest_age", &s.oldest_age, &[]),
    ];
    // The relay's own seeks, where the migration made the frontier sequence: the frontier is
    // read once (an InitPlan) and the bound stays an index condition.
    let shared = Statements::with_shared_frontier(table, PayloadKind::Json);
    cases.push(Case::new(
        "claim_from, shared frontier",
        &shared.claim_from,
        &[&batch, head],
    ));
    if let Some(settling) = &shared.settling {
        cases.push(Case::new(
            "settling claim_from, shared frontier",
            &settling.claim_from,
            &[&batch, head],
        ));
    }
    if let Some(settling) = &s.settling {
        cases.extend([
            Case::new("settling claim", &settling.claim, &[&batch]),
            Case::new("settling claim_from", &settling.claim_from, &[&batch, head]),
            Case::new(
                "settling claim_recent",
                &settling.claim_recent,
                &[&batch, head, &window],
            ),
        ]);
    }
    cases
}

/// The capped backlog count. In delete mode every row of the table is pending, so the count may
/// read the heap: it reads no processed row either way, and at a million pending rows the
/// sequential scan the planner picks took 210 ms where an index-only scan of the vacuumed table
/// took 240 (PostgreSQL 15, two cores).
fn backlog_case(table: &OutboxTable, s: &Statements) -> Case {
    Case {
        whole_table_allowed: table.mode == DeliveryMode::Delete,
        ..Case::new("backlog", &s.backlog, &[&BACKLOG_CAP.to_string()])
    }
}

/// The per-key claims, for a worker of a busy relay (a few lanes) and a lone worker (all).
fn per_key_cases(table: &OutboxTable, head: &str) -> Vec<Case> {
    let mut per_key = table.clone();
    per_key.ordering = DeliveryOrder::PerKey;
    let s = Statements::new(&per_key, PayloadKind::Json);
    let (batch, window) = (BATCH_SIZE.to_string(), RECENT_WINDOW.as_secs().to_string());
    let mut cases = Vec::new();
    for held in [LANES / BUSY_RELAY_WORKERS, LANES] {
        let lanes = lanes_literal(held);
        cases.extend([
            Case::new(
                format!("per-key claim, {held} lanes"),
                &s.claim,
                &[&batch, &lanes],
            ),
            Case::new(
                format!("per-key claim_from, {held} lanes"),
                &s.claim_from,
                &[&batch, head, &lanes],
            ),
            Case::new(
                format!("per-key claim_recent, {held} lanes"),
                &s.claim_recent,
                &[&batch, head, &window, &lanes],
            ),
        ]);
    }
    cases
}

/// Lanes `0..held` as an int4[] literal.
fn lanes_literal(held: i32) -> String {
    let lanes: Vec<String> = (0..held).map(|lane| lane.to_string()).collect();
    format!("'{{{}}}'::int4[]", lanes.join(","))
}

/// Prepares `case` as the statement `planned` under `plan_cache_mode`, as sqlx prepares the
/// relay's statements; returns the EXECUTE that runs it.
async fn prepare(conn: &mut PgConnection, case: &Case, plan_cache_mode: &str) -> String {
    db::exec(conn, &format!("SET plan_cache_mode = {plan_cache_mode}")).await;
    db::exec(conn, &format!("PREPARE planned AS {}", case.sql)).await;
    if case.args.is_empty() {
        "EXECUTE planned".into()
    } else {
        format!("EXECUTE planned({})", case.args.join(", "))
    }
}

/// The plan PostgreSQL picks for `case` under `plan_cache_mode`, as EXPLAIN's JSON.
async fn json_plan(conn: &mut PgConnection, case: &Case, plan_cache_mode: &str) -> Value {
    let sql = format!(
        "EXPLAIN (FORMAT JSON) {}",
        prepare(conn, case, plan_cache_mode).await
    );
    let plan = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    db::exec(conn, "DEALLOCATE planned").await;
    plan
}

/// The same plan as EXPLAIN's text, for people.
async fn text_plan(conn: &mut PgConnection, case: &Case, plan_cache_mode: &str) -> String {
    let sql = format!("EXPLAIN {}", prepare(conn, case, plan_cache_mode).await);
    let lines: Vec<String> = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
        .persistent(false)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    db::exec(conn, "DEALLOCATE planned").await;
    lines.join("\n")
}

/// Every node of a plan tree, the subplans' included.
fn nodes(node: &Value) -> Vec<&Value> {
    let mut all = vec![node];
    for child in node["Plans"].as_array().into_iter().flatten() {
        all.extend(nodes(child));
    }
    all
}

/// What is wrong with `plan` (EXPLAIN's JSON of `case`): any read of `table` other than through
/// `index` (or by ctid, as the settling claims' UPDATE reads the rows their claim locked, or
/// sequentially where the case allows it), any sort but one that only breaks ties within the
/// index's claim order, and no read through `index` where the case needs one.
fn plan_problems(plan: &Value, case: &Case, table: &OutboxTable, index: &str) -> Vec<String> {
    let relation = table.name.table.as_str();
    let occurred = table.columns.occurred_at.as_str();
    let mut problems = Vec::new();
    let mut through_index = false;
    for node in nodes(&plan[0]["Plan"]) {
        let node_type = node["Node Type"].as_str().unwrap_or_default();
        let scans_table = node_type.ends_with("Scan") && node["Relation Name"] == relation;
        match node_type {
            "Index Scan" | "Index Only Scan" if scans_table => {
                if node["Index Name"] == index {
                    through_index = true;
                } else {
                    problems.push(format!(
                        "{node_type} of {relation} using {}",
                        node["Index Name"]
                    ));
                }
            }
            "Tid Scan" => {}
            "Seq Scan" if case.whole_table_allowed => {}
            _ if scans_table => problems.push(format!("{node_type} of {relation}")),
            "Sort" => problems.push("a Sort: the claim order is not the index's".into()),
            "Incremental Sort" if !presorted_by(node, occurred) => {
                problems.push(format!("an Incremental Sort not presorted by {occurred}"));
            }
            _ => {}
        }
    }
    if !through_index && !case.whole_table_allowed {
        problems.push(format!("no scan of {relation} using {index}"));
    }
    problems
}

/// True when an Incremental Sort's input already comes in `column` order.
fn presorted_by(node: &Value, column: &str) -> bool {
    node["Presorted Key"][0]
        .as_str()
        .is_some_and(|key| key == column || key.ends_with(&format!(".{column}")))
}

/// Checks every case under every plan cache mode; panics with each bad plan, in text.
async fn assert_plans(conn: &mut PgConnection, table: &OutboxTable, index: &str, cases: &[Case]) {
    let mut failures = Vec::new();
    for case in cases {
        for mode in PLAN_CACHE_MODES {
            let plan = json_plan(conn, case, mode).await;
            let problems = plan_problems(&plan, case, table, index);
            if !problems.is_empty() {
                failures.push(format!(
                    "{} ({mode}): {}\n{}\n{}",
                    case.name,
                    problems.join("; "),
                    case.sql,
                    text_plan(conn, case, mode).await
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "plans that do not read {} through {index} alone (the table is kept):\n\n{}",
        table.name,
        failures.join("\n\n")
    );
}

async fn drop_table(conn: &mut PgConnection, table: &OutboxTable) {
    db::exec(conn, &format!("DROP TABLE {}", table.name.quoted())).await;
}

async fn claims_and_backlog_read_the_pending_index(
    mode: DeliveryMode,
    processed: i64,
    pending: i64,
) {
    let (mut conn, table, index) = shaped_table(mode, processed, pending).await;
    let head = pending_head(&mut conn, &table).await;
    let mut cases = unordered_cases(&table, &head);
    cases.extend(per_key_cases(&table, &head));
    assert_plans(&mut conn, &table, &index, &cases).await;
    drop_table(&mut conn, &table).await;
}

/// Mark mode: ten processed rows per pending one, the pending index a tenth of the table's.
#[tokio::test]
async fn mark_mode_claims_and_backlog_read_the_pending_index() {
    let pending = mark_mode_pending();
    claims_and_backlog_read_the_pending_index(
        DeliveryMode::Mark,
        pending * PROCESSED_PER_PENDING,
        pending,
    )
    .await;
}

/// Delete mode: every row pending, the pending index the whole table's. Built at full size:
/// the per-key claim's lane filter has a fixed estimate (half a percent of the rows per lane),
/// so how many rows a claim expects to step over is not in proportion to the table; at a
/// thirty-third of the backlog the planner sorts a sequential scan for a worker of few lanes.
#[tokio::test]
async fn delete_mode_claims_and_backlog_read_the_pending_index() {
    claims_and_backlog_read_the_pending_index(DeliveryMode::Delete, 0, FULL_SCALE_PENDING).await;
}
