//! Table health on the real PostgreSQL: a session that opens a REPEATABLE READ transaction,
//! reads once and stays idle holds back the cleanup horizon. The measuring relay reports it —
//! growing age, the holder's pid and application name — on `/metrics` and in the report table
//! the operator reads, and stops once the transaction ends. Then the same as an ordinary login
//! role without `pg_read_all_stats`: it still sees the holder, not its state or start time, and
//! says once which privilege would show them.
//!
//! Each test has a database of its own: the horizon is per database, and every other test's
//! transactions would move the shared one.

use std::time::Duration;

use outbox_relay::table::OutboxTable;
use outbox_relay::table::health::TableHealth;
use outbox_relay::table::ident::TableName;
use outbox_relay::table::reports::read_reports;
use outbox_tests::db::{self, PrivateDatabase};
use outbox_tests::{http, metrics, process, unique, wait};
use sqlx::PgConnection;

const HINT: &str = "grant pg_read_all_stats";

/// The test's database, an outbox table in it, migrated.
async fn outbox_in(database: &PrivateDatabase) -> OutboxTable {
    let table = OutboxTable::new(TableName::parse("outbox").unwrap());
    let mut conn = database.connect().await;
    outbox_relay::tools::seed::create_table(&mut conn, &table)
        .await
        .unwrap();
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    table
}

/// A session of the test's own role that holds a snapshot: returns it with its pid.
async fn hold_snapshot(database: &PrivateDatabase, application: &str) -> (PgConnection, i32) {
    let mut conn = database.connect().await;
    db::exec(
        &mut conn,
        &format!("SET application_name = '{application}'"),
    )
    .await;
    db::exec(&mut conn, "BEGIN ISOLATION LEVEL REPEATABLE READ").await;
    db::exec(&mut conn, "SELECT count(*) FROM outbox").await;
    let pid = db::scalar_i64(&mut conn, "SELECT pg_backend_pid()::bigint").await;
    (conn, pid as i32)
}

struct Relay {
    process: process::RelayProcess,
    addr: String,
    name: String,
}

async fn spawn_relay(database_url: &str) -> Relay {
    let name = unique("health");
    let exchange = unique("health_x");
    let args = process::run_args(
        "outbox",
        &exchange,
        &[
            "--relay-name",
            &name,
            "--database-url",
            database_url,
            "--declare-exchange",
            "topic",
            "--workers",
            "1",
        ],
    );
    let process = process::spawn_relay(&name, &args);
    let addr = wait::for_value(
        "the relay logs its metrics address",
        Duration::from_secs(20),
        || async { http::metrics_addr(&process.log_text()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", process.log_text()));
    Relay {
        process,
        addr,
        name,
    }
}

impl Relay {
    async fn metrics(&self) -> String {
        http::get(&self.addr, "/metrics").await.1
    }

    /// The horizon age once the holder series names `pid` and `application`.
    async fn horizon_age_held_by(&self, pid: i32, application: &str) -> Option<f64> {
        let text = self.metrics().await;
        let holders = metrics::label_sets(&text, "outbox_relay_cleanup_horizon_holder");
        let ours = holders.iter().any(|labels| {
            labels.contains(&format!("pid=\"{pid}\""))
                && labels.contains(&format!("application_name=\"{application}\""))
        });
        ours.then(|| metrics::value(&text, "outbox_relay_cleanup_horizon_age_seconds"))
            .flatten()
    }

    /// Waits until the horizon held by `pid` is older than `seconds`, and returns its age.
    async fn wait_for_age(&self, pid: i32, application: &str, seconds: f64) -> f64 {
        let waited = wait::for_value(
            &format!("the relay reports pid {pid} holding the horizon for {seconds} s"),
            Duration::from_secs(30),
            || async {
                self.horizon_age_held_by(pid, application)
                    .await
                    .filter(|age| *age >= seconds)
            },
        )
        .await;
        match waited {
            Ok(age) => age,
            Err(e) => panic!("{e}:\n{}\n{}", self.metrics().await, self.log()),
        }
    }

    /// What the operator reads: this relay's freshest table-health figures.
    async fn reported(&self, database: &PrivateDatabase, table: &OutboxTable) -> TableHealth {
        let reports = read_reports(
            &mut database.connect().await,
            &table.reports_table(),
            &self.name,
            30.0,
        )
        .await
        .unwrap();
        reports
            .into_iter()
            .find_map(|r| r.table_health)
            .expect("the measuring pod's report carries table health")
    }

    fn log(&self) -> String {
        self.process.log_text()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_held_open_is_reported_with_its_holder_until_it_ends() {
    let database = PrivateDatabase::create("health").await;
    let table = outbox_in(&database).await;
    let mut relay = spawn_relay(&database.url).await;
    let application = unique("report-job");
    let (mut holder, pid) = hold_snapshot(&database, &application).await;

    let first = relay.wait_for_age(pid, &application, 1.0).await;
    let later = relay.wait_for_age(pid, &application, first + 2.0).await;
    assert!(later > first, "the horizon age grows: {first} then {later}");

    let health = relay.reported(&database, &table).await;
    let horizon = health.horizon.clone().expect("a holder in the report");
    assert_eq!(horizon.pid, Some(pid), "{health:?}");
    assert_eq!(horizon.name.as_deref(), Some(application.as_str()));
    assert_eq!(horizon.state.as_deref(), Some("idle in transaction"));
    assert!(horizon.visible, "the test's own role may see its session");
    assert!(
        health.pending_index_bytes.is_some_and(|b| b > 0),
        "{health:?}"
    );
    assert!(health.live_tuples.is_some() && health.dead_tuples.is_some());
    let text = relay.metrics().await;
    assert!(metrics::value(&text, "outbox_relay_pending_index_bytes").is_some_and(|b| b > 0.0));
    for scope in ["server", "table"] {
        let series = format!("outbox_relay_autovacuum_enabled{{scope=\"{scope}\"}}");
        assert_eq!(metrics::value(&text, &series), Some(1.0), "{text}");
    }
    assert!(!relay.log().contains(HINT), "{}", relay.log());

    db::exec(&mut holder, "ROLLBACK").await;
    let released = wait::until(
        "the horizon is no longer held by the finished transaction",
        Duration::from_secs(30),
        || async { relay.horizon_age_held_by(pid, &application).await.is_none() },
    )
    .await;
    if let Err(e) = released {
        panic!("{e}:\n{}", relay.metrics().await);
    }
    let age = metrics::value(
        &relay.metrics().await,
        "outbox_relay_cleanup_horizon_age_seconds",
    )
    .unwrap();
    assert!(age < first + 2.0, "the age fell back after the end: {age}");

    relay.process.terminate(Duration::from_secs(20)).await;
    drop(holder);
    database.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_role_sees_the_holder_and_is_told_once_what_would_show_more() {
    let database = PrivateDatabase::create("health_role").await;
    let table = outbox_in(&database).await;
    let role = unique("relay_role");
    let mut admin = database.connect().await;
    db::exec(
        &mut admin,
        &format!(
            "CREATE ROLE {role} LOGIN NOSUPERUSER; \
             GRANT SELECT, UPDATE, DELETE ON {} TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {role}",
            table.name.quoted(),
            table.reports_table().quoted()
        ),
    )
    .await;
    let can_read_all_stats = db::scalar_i64(
        &mut admin,
        &format!("SELECT pg_has_role('{role}', 'pg_read_all_stats', 'USAGE')::int::bigint"),
    )
    .await;
    assert_eq!(can_read_all_stats, 0, "the role must be an ordinary one");

    let mut relay = spawn_relay(&database.url_as(&role)).await;
    let application = unique("report-job");
    let (mut holder, pid) = hold_snapshot(&database, &application).await;

    // Not dated by PostgreSQL for this role: the age counts from when the relay first saw the
    // holder, and still grows report by report.
    let first = relay.wait_for_age(pid, &application, 1.0).await;
    let later = relay.wait_for_age(pid, &application, first + 2.0).await;
    assert!(later > first, "{first} then {later}");
    let health = relay.reported(&database, &table).await;
    let horizon = health.horizon.clone().expect("a holder");
    assert_eq!(horizon.pid, Some(pid), "{health:?}");
    assert_eq!(horizon.name.as_deref(), Some(application.as_str()));
    assert!(!horizon.visible, "{horizon:?}");
    assert_eq!(horizon.state, None, "another role's state is hidden");
    // What an ordinary role still sees of its own table.
    assert!(
        health.pending_index_bytes.is_some_and(|b| b > 0),
        "{health:?}"
    );
    assert!(health.live_tuples.is_some() && health.dead_tuples.is_some());

    // Several reports later, the privilege was named once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = relay.log();
    assert_eq!(log.matches(HINT).count(), 1, "{log}");
    assert!(log.contains(&format!("pid {pid}")), "{log}");

    db::exec(&mut holder, "ROLLBACK").await;
    relay.process.terminate(Duration::from_secs(20)).await;
    drop((holder, admin));
    database.drop_now().await;
    db::exec(&mut db::connect().await, &format!("DROP ROLE {role}")).await;
}
