//! The operator's database steps on the local PostgreSQL: what `PostgresDatabase` answers is
//! what the request-level tests script (see `src/test_support/database.rs`). Each test makes
//! its own table (and, where reports are involved, its own schema).

use std::time::Duration;

use outbox_operator::reconcile::database::postgres::PostgresDatabase;
use outbox_operator::reconcile::database::{LagQuery, MigrationRun, RelayDatabase};
use outbox_operator::reconcile::input::validate::{RelayPlan, validate};
use outbox_operator::{Error, OutboxRelaySpec};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::DatabaseTarget;
use outbox_relay::table::migrate::{IndexAction, MigrationReport};
use sqlx::{Connection, PgConnection};

mod common;

use common::{CANARY, OwnDatabase, OwnSchema, connect, database_url, execute};

/// The local server with [`CANARY`] as the password (trust authentication ignores it).
/// The operator's connection to `url`, without a password file or TLS material of its own.
fn target(url: SecretUrl) -> DatabaseTarget {
    DatabaseTarget::from_url(url)
}

fn url_with_canary() -> SecretUrl {
    let mut url = url::Url::parse(&database_url()).expect("DATABASE_URL is a URL");
    url.set_password(Some(CANARY)).expect("a URL with a host");
    SecretUrl::parse(url.as_str(), UrlKind::Postgres).unwrap()
}

/// `DATABASE_URL` with `database` in place of its database, whatever that is named; its user,
/// host and parameters kept.
fn url_of_database(database: &str) -> String {
    let mut url = url::Url::parse(&database_url()).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

async fn execute_on(conn: &mut PgConnection, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(conn)
        .await
        .unwrap();
}

/// A fresh outbox table with the reference columns, in its own schema, so its report table
/// is its own too. Derefs to the schema-qualified name; dropping it drops the schema, so the
/// database `DATABASE_URL` names is left as it was found, even when the test fails.
async fn create_outbox_table() -> OwnTable {
    let schema = OwnSchema::create().await;
    let name = format!("{}.outbox", schema.name());
    execute(format!(
        "CREATE TABLE {name} (id uuid PRIMARY KEY, \
         type varchar(255) NOT NULL, content jsonb NOT NULL, occurred_on_utc timestamptz NOT NULL, \
         processed_on_utc timestamptz NULL, error text NULL)"
    ))
    .await;
    OwnTable { name, schema }
}

struct OwnTable {
    name: String,
    schema: OwnSchema,
}

impl std::ops::Deref for OwnTable {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for OwnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn plan_for(table: &str) -> RelayPlan {
    let spec: OutboxRelaySpec = serde_json::from_value(serde_json::json!({
        "database": {"urlSecretRef": {"name": "db"}, "table": table},
        "broker": {"urlSecretRef": {"name": "amqp"}},
    }))
    .unwrap();
    validate(&spec).unwrap()
}

async fn migrate(table: &str) -> Result<MigrationRun, Error> {
    PostgresDatabase::default()
        .migrate(&target(url_with_canary()), &plan_for(table), "shop/orders")
        .await
}

fn migrated(run: Result<MigrationRun, Error>) -> MigrationReport {
    match run {
        Ok(MigrationRun::Migrated(report)) => report,
        other => panic!("expected a migration, got {other:?}"),
    }
}

async fn index_is_valid(table: &str) -> bool {
    sqlx::query_scalar("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)")
        .bind(format!("{table}_pending_idx"))
        .fetch_one(&mut connect().await)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_fresh_table_gets_a_valid_index_once_and_the_server_setting_reported() {
    let table = create_outbox_table().await;
    let first = migrated(migrate(&table).await);
    assert_eq!(first.index, IndexAction::Created);
    assert!(index_is_valid(&table).await);
    // The autovacuum warning follows the server's own setting.
    let off: bool = sqlx::query_scalar(
        "SELECT bool_or(setting = 'off') FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')",
    )
    .fetch_one(&mut connect().await)
    .await
    .unwrap();
    assert_eq!(first.server_autovacuum_off, off);
    let again = migrated(migrate(&table).await);
    assert_eq!(again.index, IndexAction::AlreadyValid);
}

#[tokio::test]
async fn an_invalid_index_is_rebuilt_valid() {
    let table = create_outbox_table().await;
    // Two rows with the same occurred_on_utc make a UNIQUE build fail half-way, which leaves
    // an INVALID index under the very name the migration uses.
    execute(format!(
        "INSERT INTO {table} (id, type, content, occurred_on_utc) VALUES \
         (gen_random_uuid(), 't', '{{}}', '2024-01-01T00:00:00Z'), \
         (gen_random_uuid(), 't', '{{}}', '2024-01-01T00:00:00Z')"
    ))
    .await;
    let index = table.replace(".outbox", ".outbox_pending_idx");
    let failed = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE UNIQUE INDEX CONCURRENTLY {} ON {table} (occurred_on_utc)",
        index.split('.').nth(1).unwrap()
    )))
    .execute(&mut connect().await)
    .await;
    assert!(
        failed.is_err(),
        "the unique build should fail on duplicates"
    );
    assert!(
        !index_is_valid(&table).await,
        "precondition: the index is INVALID"
    );

    let report = migrated(migrate(&table).await);
    assert_eq!(report.index, IndexAction::RebuiltInvalid);
    assert!(report.lines().join("; ").contains("INVALID"), "{report:?}");
    assert!(index_is_valid(&table).await, "the index was rebuilt valid");
}

#[tokio::test]
async fn a_held_migration_lock_is_lock_busy() {
    let table = create_outbox_table().await;
    // Hold the lock the migration takes, as a concurrent `outbox-relay migrate` would.
    let quoted = plan_for(&table).table.name.quoted();
    let mut holder = connect().await;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-relay:migrate:{quoted}"))
        .fetch_one(&mut holder)
        .await
        .unwrap();
    assert!(locked);
    assert_eq!(migrate(&table).await.unwrap(), MigrationRun::LockBusy);
    assert!(!index_is_valid_or_missing(&table).await);
}

async fn index_is_valid_or_missing(table: &str) -> bool {
    let found: Option<bool> = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
    )
    .bind(format!("{table}_pending_idx"))
    .fetch_optional(&mut connect().await)
    .await
    .unwrap();
    found.unwrap_or(false)
}

#[tokio::test]
async fn an_unreachable_server_is_database_unreachable_without_the_password() {
    let url = SecretUrl::parse(
        &format!("postgres://postgres:{CANARY}@127.0.0.1:1/test"),
        UrlKind::Postgres,
    )
    .unwrap();
    let error = PostgresDatabase::default()
        .migrate(&target(url), &plan_for("outbox_messages"), "shop/orders")
        .await
        .unwrap_err();
    assert!(matches!(error, Error::DatabaseUnreachable(_)), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains(CANARY), "{text}");
}

fn assert_names_the_missing_table(error: &Error) {
    let text = error.to_string();
    assert!(
        text.contains("spec.database.table") && text.contains("does not exist"),
        "{text}"
    );
}

/// The claims table `table`'s claim would be in, if there is one, and the claims in it naming
/// `table`.
async fn claims_of(table: &str) -> Option<i64> {
    let claims = match table.rsplit_once('.') {
        Some((schema, _)) => format!("{schema}.outbox_relay_claims"),
        None => "outbox_relay_claims".to_string(),
    };
    let mut conn = connect().await;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&claims)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    if !exists {
        return None;
    }
    let sql = format!("SELECT count(*) FROM {claims} WHERE outbox_table = $1");
    let rows = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(plan_for(table).table.name.to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    Some(rows)
}

/// A missing table is the first thing said, by the migration and by every lag observation, and
/// nothing is claimed for it: no claim row, and no claims table where there was none (an
/// unqualified name would put one in `public` of whatever database the URL names).
#[tokio::test]
async fn a_missing_table_names_the_spec_field_and_is_not_claimed() {
    let schema = OwnSchema::create().await;
    let unqualified = format!("obr_missing_{}", uuid::Uuid::new_v4().simple());
    let qualified = format!("{}.{unqualified}", schema.name());
    for missing in [&unqualified, &qualified] {
        let error = migrate(missing).await.unwrap_err();
        assert!(matches!(error, Error::MigrationFailed(_)), "{error:?}");
        assert_names_the_missing_table(&error);
        for running in [0, 2] {
            let error = PostgresDatabase::default()
                .observe_lag(
                    &target(url_with_canary()),
                    &plan_for(missing),
                    query(running),
                )
                .await
                .unwrap_err();
            assert!(matches!(error, Error::ObserveLag(_)), "{error:?}");
            assert_names_the_missing_table(&error);
        }
        // On a fresh database there is no claims table at all; where an earlier run left one
        // on the search path, no row of it names this table.
        let claims = claims_of(missing).await;
        assert!(matches!(claims, None | Some(0)), "{missing}: {claims:?}");
    }
    assert_eq!(claims_of(&qualified).await, None, "a claims table was made");
}

/// Next to a claimed table the claims table exists; a missing one still gets no row in it.
#[tokio::test]
async fn a_missing_table_beside_a_claimed_one_adds_no_claim_row() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    assert_eq!(claims_of(&table).await, Some(1));
    let missing = format!("{}.obr_missing", table.schema.name());
    assert_names_the_missing_table(&migrate(&missing).await.unwrap_err());
    assert_eq!(claims_of(&missing).await, Some(0));
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.outbox_relay_claims",
        table.schema.name()
    )))
    .fetch_one(&mut connect().await)
    .await
    .unwrap();
    assert_eq!(rows, 1);
}

/// What a test makes is gone when its guards drop: its schema with the migration's index,
/// report and claims tables in it, and its database, even with a session still in it (the run
/// against database `postgres` checks that the whole suite leaves nothing behind).
#[tokio::test]
async fn a_tests_schema_and_database_take_everything_with_them() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    PostgresDatabase::default()
        .observe_lag(&target(url_with_canary()), &plan_for(&table), query(0))
        .await
        .unwrap();
    let schema = table.schema.name().to_string();
    let database = OwnDatabase::create().await;
    let database_name = database.name().to_string();
    let count = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut connect().await)
            .await
            .unwrap()
    };
    let objects_in_schema = format!(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = '{schema}'"
    );
    let databases = format!("SELECT count(*) FROM pg_database WHERE datname = '{database_name}'");
    // Table, its key and index, the report and claims tables (with their keys), and the
    // toast tables: whatever the number, more than the table alone.
    assert!(count(objects_in_schema.clone()).await > 2);
    assert_eq!(count(databases.clone()).await, 1);
    // A session still open there (a failed test's) does not keep the database.
    let session = PgConnection::connect(&url_of_database(&database_name))
        .await
        .unwrap();

    drop(table);
    drop(database);
    drop(session);
    assert_eq!(count(objects_in_schema).await, 0);
    assert_eq!(
        count(format!(
            "SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"
        ))
        .await,
        0
    );
    assert_eq!(count(databases).await, 0);
}

#[tokio::test]
async fn an_id_without_a_unique_index_is_id_not_unique_naming_the_field_and_fix() {
    let table = create_outbox_table().await;
    // The fixture's table has a primary key; take it away, as a user's table might lack one.
    execute(format!("ALTER TABLE {table} DROP CONSTRAINT outbox_pkey")).await;
    let error = migrate(&table).await.unwrap_err();
    assert!(matches!(error, Error::IdNotUnique(_)), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("spec.database.columns.id")
            && text.contains("has no primary key or unique index")
            && text.contains("add PRIMARY KEY (id)"),
        "{text}"
    );
}

fn query(running: i32) -> LagQuery {
    LagQuery {
        relay_name: "shop/orders".into(),
        running,
        stale_after: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn at_zero_pods_the_backlog_is_counted() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    let plan = plan_for(&table);
    outbox_relay::tools::seed::copy_rows(&mut connect().await, &plan.table, 30, 50, |_| {})
        .await
        .unwrap();
    let lag = PostgresDatabase::default()
        .observe_lag(&target(url_with_canary()), &plan, query(0))
        .await
        .unwrap();
    assert_eq!(lag.backlog, Some(30));
    assert!(lag.measured_by_operator);
    assert_eq!(lag.reporting_pods, 0);
    let health = lag
        .table_health
        .expect("the operator measures the table's health too");
    assert!(
        health.pending_index_bytes.is_some_and(|b| b > 0),
        "{health:?}"
    );
    assert!(
        health.dead_tuples.is_some() && health.live_tuples.is_some(),
        "{health:?}"
    );
}

/// With no pod running, the operator dates the horizon itself: a snapshot held open by a
/// session it may see is reported with its pid, application name and age. In a database of its
/// own: other tests' transactions (a concurrent index build waits for this very snapshot, and
/// would be older) hold only their own database's horizon.
#[tokio::test]
async fn at_zero_pods_an_open_snapshot_is_the_horizon_with_its_holder() {
    let own_database = OwnDatabase::create().await;
    let database = own_database.name();
    let url = url_of_database(database);
    let mut holder = PgConnection::connect(&url).await.unwrap();
    let table = "public.outbox";
    execute_on(
        &mut holder,
        format!(
            "CREATE TABLE {table} (id uuid PRIMARY KEY, type varchar(255) NOT NULL, \
             content jsonb NOT NULL, occurred_on_utc timestamptz NOT NULL, \
             processed_on_utc timestamptz NULL, error text NULL)"
        ),
    )
    .await;
    let secret = SecretUrl::parse(&url, UrlKind::Postgres).unwrap();
    migrated(
        PostgresDatabase::default()
            .migrate(&target(secret.clone()), &plan_for(table), "shop/orders")
            .await,
    );
    let application = format!("holder-{database}");
    execute_on(
        &mut holder,
        format!("SET application_name = '{application}'"),
    )
    .await;
    execute_on(&mut holder, "BEGIN ISOLATION LEVEL REPEATABLE READ".into()).await;
    execute_on(&mut holder, format!("SELECT count(*) FROM {table}")).await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let lag = PostgresDatabase::default()
        .observe_lag(&target(secret), &plan_for(table), query(0))
        .await
        .unwrap();
    execute_on(&mut holder, "ROLLBACK".into()).await;
    drop(holder);

    let horizon = lag.table_health.and_then(|h| h.horizon).expect("a holder");
    assert_eq!(horizon.pid, Some(pid), "{horizon:?}");
    assert_eq!(horizon.name.as_deref(), Some(application.as_str()));
    assert_eq!(horizon.state.as_deref(), Some("idle in transaction"));
    assert!(horizon.visible && horizon.age_seconds >= 1.4, "{horizon:?}");
}

async fn report(table: &str, pod: &str, backlog: Option<i64>, rate: f64, age_seconds: i64) {
    let reports = plan_for(table).table.reports_table();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (relay, pod, backlog, publish_rate, reported_at) \
         VALUES ('shop/orders', $1, $2, $3, now() - make_interval(secs => $4))",
        reports.quoted()
    )))
    .bind(pod)
    .bind(backlog)
    .bind(rate)
    .bind(age_seconds as f64)
    .execute(&mut connect().await)
    .await
    .unwrap();
}

#[tokio::test]
async fn fresh_reports_are_summed_and_stale_ones_ignored() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    report(&table, "orders-a", Some(9_000), 120.0, 1).await;
    report(&table, "orders-b", None, 80.0, 2).await;
    // A pod that stopped reporting ten minutes ago no longer speaks for the relay.
    report(&table, "orders-gone", Some(1), 500.0, 600).await;
    let lag = PostgresDatabase::default()
        .observe_lag(&target(url_with_canary()), &plan_for(&table), query(2))
        .await
        .unwrap();
    assert_eq!(lag.backlog, Some(9_000));
    assert_eq!(lag.publish_rate, 200.0);
    assert_eq!(lag.reporting_pods, 2);
    assert!(!lag.measured_by_operator);
    assert!(
        lag.backlog_age.unwrap() < Duration::from_secs(30),
        "{lag:?}"
    );
}

#[tokio::test]
async fn with_no_fresh_report_the_backlog_is_unknown() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    report(&table, "orders-gone", Some(5), 10.0, 600).await;
    let lag = PostgresDatabase::default()
        .observe_lag(&target(url_with_canary()), &plan_for(&table), query(3))
        .await
        .unwrap();
    assert_eq!(lag.backlog, None);
    assert_eq!(lag.reporting_pods, 0);
}

#[tokio::test]
async fn a_problem_the_pods_report_reaches_the_lag_with_the_pods_that_have_it() {
    use outbox_relay::table::reports::{Problem, ProblemKind, Report, upsert_report};
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    let reports = plan_for(&table).table.reports_table();
    let message =
        "exchange orders does not exist on vhost /: declare it, or pass --declare-exchange TYPE";
    for (pod, problem) in [("orders-b", true), ("orders-a", true), ("orders-c", false)] {
        let report = Report {
            relay: "shop/orders".into(),
            pod: pod.into(),
            reported_at: chrono::Utc::now(),
            backlog: None,
            published_total: 0,
            publish_rate: 0.0,
            problem: problem.then(|| Problem {
                kind: ProblemKind::ExchangeNotFound,
                message: message.into(),
            }),
            table_health: None,
            max_rate: None,
            rate_limited_seconds: None,
        };
        upsert_report(&mut connect().await, &reports, &report)
            .await
            .unwrap();
    }
    let lag = PostgresDatabase::default()
        .observe_lag(&target(url_with_canary()), &plan_for(&table), query(3))
        .await
        .unwrap();
    let problem = lag.problem.expect("the pods' problem");
    assert_eq!(problem.reason, "ExchangeNotFound");
    assert_eq!(problem.message, message);
    assert_eq!(problem.pods, vec!["orders-a", "orders-b"]);
}

fn query_of(relay: &str) -> LagQuery {
    LagQuery {
        relay_name: relay.into(),
        ..query(0)
    }
}

#[tokio::test]
async fn the_first_relay_to_claim_a_table_keeps_it_until_its_claim_expires() {
    let table = create_outbox_table().await;
    let plan = plan_for(&table);
    let observe = |relay: &'static str| {
        let plan = plan.clone();
        async move {
            PostgresDatabase::default()
                .observe_lag(&target(url_with_canary()), &plan, query_of(relay))
                .await
        }
    };
    observe("shop/orders")
        .await
        .expect("a free table is claimed");
    // The holder renews its claim every round; another relay is refused, told who has it.
    observe("shop/orders").await.expect("the holder keeps it");
    match observe("billing/orders-copy").await {
        Err(Error::TableClaimed {
            table: named,
            relay,
            ..
        }) => {
            assert_eq!(relay, "shop/orders");
            assert_eq!(named, table.to_string());
        }
        other => panic!("expected TableClaimed, got {other:?}"),
    }
    // A claim nobody renewed for longer than the expiry (its relay deleted) is taken over.
    execute(format!(
        "UPDATE {}.outbox_relay_claims SET renewed_at = now() - interval '16 minutes'",
        table.schema.name()
    ))
    .await;
    observe("billing/orders-copy")
        .await
        .expect("an expired claim is taken");
    assert!(matches!(
        observe("shop/orders").await,
        Err(Error::TableClaimed { relay, .. }) if relay == "billing/orders-copy"
    ));
}

#[tokio::test]
async fn a_table_another_relay_holds_is_not_migrated_with_this_relays_settings() {
    let table = create_outbox_table().await;
    let target = target(url_with_canary());
    let holder_plan = plan_for(&table);
    migrated(
        PostgresDatabase::default()
            .migrate(&target, &holder_plan, "shop/orders")
            .await,
    );
    // A second OutboxRelay on the same table, asking for a NOTIFY trigger the holder does not
    // have: it is refused before its migration could add one.
    let mut copy_plan = holder_plan.clone();
    copy_plan.migration.notify = true;
    match PostgresDatabase::default()
        .migrate(&target, &copy_plan, "billing/orders-copy")
        .await
    {
        Err(Error::TableClaimed { relay, .. }) => assert_eq!(relay, "shop/orders"),
        other => panic!("expected TableClaimed, got {other:?}"),
    }
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal",
    )
    .bind(table.to_string())
    .fetch_one(&mut connect().await)
    .await
    .unwrap();
    assert_eq!(triggers, 0, "the refused relay's migration ran");
}

/// A burst of reconciles on one database (a restart, a rotated Secret touching every
/// OutboxRelay) opens at most the operator's sessions per database there at any moment; the
/// rest wait their turn and then finish.
#[tokio::test]
async fn a_burst_of_database_steps_opens_at_most_two_sessions_on_one_database() {
    let table = create_outbox_table().await;
    migrated(migrate(&table).await);
    let plan = plan_for(&table);
    let database = std::sync::Arc::new(PostgresDatabase::default());
    // The table locked: every step that reaches its count waits there, holding its session.
    let mut locker = connect().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *lock)
    .await
    .unwrap();
    let steps: Vec<_> = (0..6)
        .map(|_| {
            let (database, plan) = (database.clone(), plan.clone());
            tokio::spawn(async move {
                database
                    .observe_lag(&target(url_with_canary()), &plan, query(0))
                    .await
            })
        })
        .collect();
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() \
         AND strpos(query, '{}') > 0",
        table.schema.name()
    );
    let mut observer = connect().await;
    let mut most = 0i64;
    for _ in 0..20 {
        let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(waiting.clone()))
            .fetch_one(&mut observer)
            .await
            .unwrap();
        most = most.max(now);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        most, 2,
        "two sessions wait on the table, the other steps wait for them"
    );
    lock.rollback().await.unwrap();
    for step in steps {
        let lag = step.await.unwrap();
        assert!(lag.is_ok(), "{lag:?}");
    }
}
