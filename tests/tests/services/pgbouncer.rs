//! Through PgBouncer (Debian's 1.18, set up by `scripts/services.sh`), as production often
//! connects: clients log in to PgBouncer with SCRAM, PgBouncer to PostgreSQL over verify-full
//! TLS.
//!
//! Session pooling gives each client its own server session, so the relay must work exactly as
//! on a direct connection: migration, unordered and per-key relaying, lag reports.
//!
//! Transaction pooling (declared with `--database-pool-mode transaction`) lends a server session
//! per transaction, and 1.18 keeps no prepared statement across transactions: the unordered
//! relay sends unnamed statements inside transactions and loses nothing, even with a relay
//! killed; what needs a session (per-key lanes, LISTEN, migrate) goes through
//! `--session-database-url`, here PgBouncer's session pool, or is refused at start. Left
//! undeclared, transaction pooling is named with the fix (docs/connecting-securely.md, "Behind a
//! connection pooler").

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::Ident;
use outbox_tests::ordering::{check, expected_order};
use outbox_tests::ports::PGBOUNCER_PORT;
use outbox_tests::tls::{SCRAM_PASSWORD, url_on};
use outbox_tests::{broker, db, http, process, unique, wait};
use sqlx::PgConnection;

const KEY: &str = "aggregate_id";

/// A schema of the test's own owned by outbox_scram (the role PgBouncer knows), dropped by
/// [`Schema::drop_now`].
struct Schema(String);

impl Schema {
    async fn create() -> Self {
        let name = unique("pgb");
        db::exec(
            &mut db::connect().await,
            &format!("CREATE SCHEMA {name} AUTHORIZATION outbox_scram"),
        )
        .await;
        Self(name)
    }

    /// Makes the role the owner of a table the administrator seeded.
    async fn adopt(&self, admin: &mut PgConnection, table: &OutboxTable) {
        let sql = format!("ALTER TABLE {} OWNER TO outbox_scram", table.name.quoted());
        db::exec(admin, &sql).await;
    }

    async fn drop_now(self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0);
        db::exec(&mut db::connect().await, &sql).await;
    }
}

/// PgBouncer's pool `database` (`session` or `transaction`), as outbox_scram.
fn pool_url(database: &str) -> String {
    url_on(
        "127.0.0.1",
        PGBOUNCER_PORT,
        database,
        "outbox_scram",
        Some(SCRAM_PASSWORD),
        &[],
    )
}

fn session_url() -> String {
    pool_url("session")
}

fn transaction_url() -> String {
    pool_url("transaction")
}

/// A relay's environment for transaction pooling, declared, with the session pool as the
/// session URL.
fn transaction_env<'a>(transaction: &'a str, session: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("DATABASE_URL", transaction),
        ("DATABASE_POOL_MODE", "transaction"),
        ("SESSION_DATABASE_URL", session),
    ]
}

async fn migrate_through_pgbouncer(table: &str) {
    let (code, stdout, stderr) = process::run_relay_command_with_env(
        &["migrate", "--table", table],
        &[("DATABASE_URL", &session_url())],
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
}

async fn reports_written(table: &OutboxTable) -> bool {
    let reports = table.reports_table();
    let sql = format!("SELECT count(*) FROM {}", reports.quoted());
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut db::connect().await)
        .await
        .is_ok_and(|n| n > 0)
}

/// Every relay's log, one after the other.
fn logs(relays: &[process::RelayProcess]) -> String {
    relays.iter().map(|r| r.log_text()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_relays_every_row_once_with_lag_reports() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 20_000).await;
    schema.adopt(&mut admin, &table).await;
    migrate_through_pgbouncer(&name).await;
    let exchange = unique("pgbx");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let url = session_url();
    let args = process::run_args(&name, &exchange, &["--workers", "2", "--batch-size", "200"]);
    let mut relays: Vec<_> = ["a", "b"]
        .iter()
        .map(|suffix| {
            process::spawn_relay_with_env(
                &format!("{}-{suffix}", schema.0),
                &args,
                &[("DATABASE_URL", &url)],
            )
        })
        .collect();
    let reported = wait::until("the relays' lag reports", Duration::from_secs(60), || {
        reports_written(&table)
    })
    .await;
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(
        reported.is_ok() && drained,
        "relay logs:\n{}",
        logs(&relays)
    );
    assert_eq!(
        consumer.wait_for(20_000, Duration::from_secs(60)).await,
        20_000
    );
    for relay in &mut relays {
        assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    }
    assert!(
        consumer.duplicates().is_empty(),
        "an id was published twice"
    );
    let log = logs(&relays);
    for sign_of_trouble in ["prepared statement", "rolled back", "the lag report failed"] {
        assert!(!log.contains(sign_of_trouble), "{sign_of_trouble}:\n{log}");
    }
    assert!(!log.contains(SCRAM_PASSWORD), "the password in a log");
    consumer.close().await;
    schema.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_keeps_per_key_order() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    table.columns.partition_key = Some(Ident::new(KEY).unwrap());
    let mut admin = db::seeded_table(&table, 0).await;
    db::exec(
        &mut admin,
        &format!(
            "INSERT INTO {name} (id, type, content, occurred_on_utc, {KEY})
             SELECT gen_random_uuid(), 'good', jsonb_build_object('n', g),
                    now() - interval '1 hour' + (g / 3) * interval '1 ms', 'order-' || (g % 50)
               FROM generate_series(1, 6000) g"
        ),
    )
    .await;
    schema.adopt(&mut admin, &table).await;
    migrate_through_pgbouncer(&name).await;
    let exchange = unique("pgbk");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let ordered = [
        "--ordering",
        "per-key",
        "--partition-key-column",
        KEY,
        "--attempts-column",
        "attempts",
        "--workers",
        "2",
        "--batch-size",
        "200",
    ];
    let url = session_url();
    let mut relay = process::spawn_relay_with_env(
        &schema.0,
        &process::run_args(&name, &exchange, &ordered),
        &[("DATABASE_URL", &url)],
    );
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "relay log:\n{}", relay.log_text());
    assert_eq!(
        consumer.wait_for(6_000, Duration::from_secs(60)).await,
        6_000
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    let expected = expected_order(&mut admin, &table, KEY).await;
    let report = check(&consumer.arrivals(), &expected);
    assert!(report.keys_out_of_order.is_empty(), "{report:?}");
    assert_eq!(report.first_deliveries, 6_000, "{report:?}");
    consumer.close().await;
    schema.drop_now().await;
}

/// Transaction pooling left undeclared (the default says "a session"): the relay's named
/// statements collide, and it says so, naming the pool mode and the settings that fix it; it
/// marks nothing it did not publish while it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_transaction_pooling_is_named_with_the_fix_and_nothing_is_marked() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 2_000).await;
    schema.adopt(&mut admin, &table).await;
    migrate_through_pgbouncer(&name).await;
    let exchange = unique("pgbt");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay_with_env(
        &schema.0,
        &process::run_args(&name, &exchange, &["--workers", "4"]),
        &[("DATABASE_URL", &transaction_url())],
    );
    let named = wait::until(
        "the relay names transaction pooling",
        Duration::from_secs(30),
        || async { relay.log_text().contains("pool_mode = transaction") },
    )
    .await;
    assert!(named.is_ok(), "relay log:\n{}", relay.log_text());
    let log = relay.log_text();
    for fix in ["--database-pool-mode transaction", "--session-database-url"] {
        assert!(log.contains(fix), "{fix} not named:\n{log}");
    }
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    // Whatever it managed to publish was confirmed before it was marked; nothing else is. A
    // confirmed message may still be on its way from the queue to the consumer: wait for it.
    let marked = (2_000 - db::pending(&mut admin, &table).await) as u64;
    let arrived = consumer.wait_for(marked, Duration::from_secs(30)).await;
    assert!(marked <= arrived, "{marked} marked, {arrived} arrived");
    assert!(
        !relay.log_text().contains(SCRAM_PASSWORD),
        "the password in a log"
    );
    consumer.close().await;
    schema.drop_now().await;
}

async fn reports_with_backlog(table: &OutboxTable) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE backlog IS NOT NULL",
        table.reports_table().quoted()
    );
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut db::connect().await)
        .await
        .unwrap_or(0)
}

const ROWS: u64 = 100_000;
const WORKERS: &str = "2";
const BATCH: &str = "200";

/// Declared transaction pooling, 3 relays of 2 workers each on 100,000 rows, one killed with
/// SIGKILL and one stopped with SIGTERM while they relay: every id reaches the broker (again,
/// at most one claim's worth per worker of the killed relay: at-least-once), nothing stays
/// pending, no batch rolls back, no statement collides, and the lag reports are written,
/// backlog included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_relays_every_row_through_a_kill_and_a_stop() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, ROWS).await;
    schema.adopt(&mut admin, &table).await;
    let (transaction, session) = (transaction_url(), session_url());
    let env = transaction_env(&transaction, &session);
    // migrate takes its advisory lock on the session URL.
    let (code, stdout, stderr) =
        process::run_relay_command_with_env(&["migrate", "--table", &name], &env).await;
    assert_eq!(code, 0, "{stdout}{stderr}");

    let exchange = unique("pgbtx");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &exchange,
        &["--workers", WORKERS, "--batch-size", BATCH],
    );
    let mut relays: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|suffix| process::spawn_relay_with_env(&format!("{}-{suffix}", schema.0), &args, &env))
        .collect();

    let measured = wait::until("a measured lag report", Duration::from_secs(60), || {
        let table = table.clone();
        async move { reports_with_backlog(&table).await > 0 }
    })
    .await;
    assert!(measured.is_ok(), "relay logs:\n{}", logs(&relays));

    // SIGKILL in the middle of the run: its batches in flight roll back with the connection
    // and are claimed again by the others, so their rows may arrive twice.
    let killed_at = consumer.wait_for(ROWS / 5, Duration::from_secs(120)).await;
    assert!(killed_at >= ROWS / 5, "relay logs:\n{}", logs(&relays));
    relays[0].kill9().await;
    let before_kill = killed_at;

    // SIGTERM: it finishes its batches and exits 0, leaving nothing half done.
    let stopped_at = consumer.wait_for(ROWS / 2, Duration::from_secs(120)).await;
    assert!(stopped_at >= ROWS / 2, "relay logs:\n{}", logs(&relays));
    assert_eq!(
        relays[1].terminate(Duration::from_secs(30)).await,
        Some(0),
        "relay log:\n{}",
        relays[1].log_text()
    );

    let drained = db::wait_until_drained(&table, Duration::from_secs(300)).await;
    assert!(drained, "relay logs:\n{}", logs(&relays));
    assert_eq!(db::pending(&mut admin, &table).await, 0);
    let ids = db::all_ids(&mut admin, &table).await;
    assert_eq!(ids.len() as u64, ROWS);
    let complete = wait::until(
        "every id at the broker",
        Duration::from_secs(60),
        || async { consumer.distinct() as u64 >= ROWS },
    )
    .await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    assert!(
        complete.is_ok() && missing == 0,
        "{missing} ids never arrived; relay logs:\n{}",
        logs(&relays)
    );
    // Duplicates come only from the killed relay's batches in flight: at most one batch per
    // worker.
    let duplicates = consumer.duplicates();
    let allowed: usize = WORKERS.parse::<usize>().unwrap() * BATCH.parse::<usize>().unwrap();
    assert!(
        duplicates.len() <= allowed,
        "{} ids arrived twice (at most {allowed} may, after the kill at {before_kill})",
        duplicates.len()
    );
    eprintln!(
        "transaction pooling: {} messages, {} distinct, {} duplicated after the kill at {before_kill}",
        consumer.total(),
        consumer.distinct(),
        duplicates.len()
    );

    assert_eq!(relays[2].terminate(Duration::from_secs(30)).await, Some(0));
    let log = logs(&relays);
    for sign_of_trouble in [
        "prepared statement",
        "pool_mode = transaction",
        "rolled back",
        "the lag report failed",
        "cannot inspect",
    ] {
        assert!(!log.contains(sign_of_trouble), "{sign_of_trouble}:\n{log}");
    }
    assert!(
        log.contains("pool_mode=\"transaction\"") || log.contains("pool_mode=transaction"),
        "{log}"
    );
    assert!(!log.contains(SCRAM_PASSWORD), "the password in a log");
    consumer.close().await;
    schema.drop_now().await;
}

/// Per-key ordering under declared transaction pooling claims through the session URL (its
/// lanes are session advisory locks), with LISTEN there too: every key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_keeps_per_key_order_through_the_session_url() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    table.columns.partition_key = Some(Ident::new(KEY).unwrap());
    let mut admin = db::seeded_table(&table, 0).await;
    db::exec(
        &mut admin,
        &format!(
            "INSERT INTO {name} (id, type, content, occurred_on_utc, {KEY})
             SELECT gen_random_uuid(), 'good', jsonb_build_object('n', g),
                    now() - interval '1 hour' + (g / 3) * interval '1 ms', 'order-' || (g % 50)
               FROM generate_series(1, 6000) g"
        ),
    )
    .await;
    schema.adopt(&mut admin, &table).await;
    let (transaction, session) = (transaction_url(), session_url());
    let env = transaction_env(&transaction, &session);
    let (code, stdout, stderr) =
        process::run_relay_command_with_env(&["migrate", "--table", &name, "--notify"], &env).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let exchange = unique("pgbtk");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let ordered = [
        "--ordering",
        "per-key",
        "--partition-key-column",
        KEY,
        "--attempts-column",
        "attempts",
        "--workers",
        "2",
        "--batch-size",
        "200",
        "--listen",
        "true",
    ];
    let mut relay = process::spawn_relay_with_env(
        &schema.0,
        &process::run_args(&name, &exchange, &ordered),
        &env,
    );
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "relay log:\n{}", relay.log_text());
    assert_eq!(
        consumer.wait_for(6_000, Duration::from_secs(60)).await,
        6_000
    );
    let reported = wait::until("the relay's lag report", Duration::from_secs(30), || {
        reports_written(&table)
    })
    .await;
    assert!(reported.is_ok(), "relay log:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    let expected = expected_order(&mut admin, &table, KEY).await;
    let report = check(&consumer.arrivals(), &expected);
    assert!(report.keys_out_of_order.is_empty(), "{report:?}");
    assert_eq!(report.first_deliveries, 6_000, "{report:?}");
    let log = relay.log_text();
    for sign_of_trouble in ["prepared statement", "rolled back", "the lag report failed"] {
        assert!(!log.contains(sign_of_trouble), "{sign_of_trouble}:\n{log}");
    }
    consumer.close().await;
    schema.drop_now().await;
}

/// Under declared transaction pooling without a session URL, what needs a session is refused
/// before anything is written, with exit code 2 and a message naming the pool mode and the
/// setting that fixes it; the unordered relay needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_without_a_session_url_refuses_what_needs_a_session() {
    let transaction = transaction_url();
    let amqp = outbox_tests::amqp_url();
    let env = [
        ("DATABASE_URL", transaction.as_str()),
        ("DATABASE_POOL_MODE", "transaction"),
        ("AMQP_URL", amqp.as_str()),
    ];
    let table = unique("pgbr");
    let refused: [(&[&str], &str); 5] = [
        (
            &[
                "run",
                "--table",
                &table,
                "--ordering",
                "per-key",
                "--partition-key-column",
                KEY,
            ],
            "per-key ordering",
        ),
        (&["run", "--table", &table, "--listen", "true"], "--listen"),
        (&["migrate", "--table", &table], "outbox-relay migrate"),
        (&["lag", "--table", &table], "outbox-relay lag"),
        (
            &["seed", "--table", &table, "--rows", "1"],
            "outbox-relay seed",
        ),
    ];
    for (args, need) in refused {
        let (code, stdout, stderr) = process::run_relay_command_with_env(args, &env).await;
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        for named in [
            need,
            "--database-pool-mode transaction",
            "--session-database-url",
        ] {
            assert!(
                stderr.contains(named),
                "{args:?}: {named} not named: {stderr}"
            );
        }
        assert!(!stderr.contains(SCRAM_PASSWORD), "the password in {stderr}");
    }
}

/// A lag report that fails says which step failed and why; it sends the user to `migrate` only
/// when the report table is really missing (42P01), and never blames the pooler that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lag_report_says_what_failed() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let table = db::table(&name);
    // Not migrated: no report table.
    let mut admin = db::seeded_table(&table, 100).await;
    schema.adopt(&mut admin, &table).await;
    let (transaction, session) = (transaction_url(), session_url());
    let exchange = unique("pgbrep");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay_with_env(
        &schema.0,
        &process::run_args(&name, &exchange, &[]),
        &transaction_env(&transaction, &session),
    );
    let told = wait::until(
        "the relay says why the report failed",
        Duration::from_secs(30),
        || async {
            relay
                .log_text()
                .contains("writing this pod's report row failed")
        },
    )
    .await;
    assert!(told.is_ok(), "relay log:\n{}", relay.log_text());
    // Four more report intervals (5 s each): the cause is the same every time, so it is said
    // once a minute, not each time, and the relay does not reconnect for it.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let log = relay.log_text();
    let reports = table.reports_table().to_string();
    let naming = |text: &str| log.lines().filter(|line| line.contains(text)).count();
    assert_eq!(
        naming(&format!("the report table {reports} does not exist")),
        1,
        "{log}"
    );
    assert_eq!(
        naming(&format!("run `outbox-relay migrate --table {name}`")),
        1,
        "{log}"
    );
    assert_eq!(naming("reconnecting for the next one"), 0, "{log}");
    let addr = relay.metrics_addr().await;
    let (_, ready) = http::get(&addr, "/readyz").await;
    assert!(
        ready.contains("lag report: not written (ReportTableMissing:"),
        "{ready}"
    );
    let (_, metrics) = http::get(&addr, "/metrics").await;
    let failed = outbox_tests::metrics::value(
        &metrics,
        "outbox_relay_report_failures_total{reason=\"ReportTableMissing\"}",
    )
    .unwrap_or(0.0);
    assert!(failed >= 4.0, "{failed} failed reports counted:\n{metrics}");
    assert!(!log.contains("pool_mode = transaction"), "{log}");
    // The rows themselves go out: the report is not the relay.
    assert_eq!(consumer.wait_for(100, Duration::from_secs(30)).await, 100);
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
    schema.drop_now().await;
}
