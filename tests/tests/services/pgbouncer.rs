//! Through PgBouncer (Debian's 1.18, set up by `scripts/services.sh`) in session pooling, as
//! production often connects: clients log in to PgBouncer with SCRAM, PgBouncer to PostgreSQL
//! over verify-full TLS. Session pooling gives each client its own server session, so the relay
//! must work exactly as on a direct connection: migration, unordered and per-key relaying, lag
//! reports. (Transaction pooling is not supported yet: see docs/connecting-securely.md.)

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::Ident;
use outbox_tests::ordering::{check, expected_order};
use outbox_tests::tls::{SCRAM_PASSWORD, url_on};
use outbox_tests::{broker, db, process, unique, wait};
use sqlx::PgConnection;

const PGBOUNCER_PORT: u16 = 6432;
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

fn session_url() -> String {
    url_on(
        "127.0.0.1",
        PGBOUNCER_PORT,
        "session",
        "outbox_scram",
        Some(SCRAM_PASSWORD),
        &[],
    )
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
    for sign_of_trouble in [
        "prepared statement",
        "rolled back",
        "writing the lag report failed",
    ] {
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

/// Transaction pooling is not supported: the relay says so, naming the pool mode and the fix,
/// and marks nothing while it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_is_named_and_nothing_is_marked() {
    let schema = Schema::create().await;
    let name = format!("{}.outbox", schema.0);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 2_000).await;
    schema.adopt(&mut admin, &table).await;
    migrate_through_pgbouncer(&name).await;
    let transaction_url = url_on(
        "127.0.0.1",
        PGBOUNCER_PORT,
        "transaction",
        "outbox_scram",
        Some(SCRAM_PASSWORD),
        &[],
    );
    let exchange = unique("pgbt");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay_with_env(
        &schema.0,
        &process::run_args(&name, &exchange, &["--workers", "4"]),
        &[("DATABASE_URL", &transaction_url)],
    );
    let named = wait::until(
        "the relay names transaction pooling",
        Duration::from_secs(30),
        || async { relay.log_text().contains("pool_mode = transaction") },
    )
    .await;
    assert!(named.is_ok(), "relay log:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    // Whatever it managed to publish was confirmed before it was marked; nothing else is.
    let marked = 2_000 - db::pending(&mut admin, &table).await;
    assert!(
        marked as u64 <= consumer.total(),
        "{marked} marked, {} arrived",
        consumer.total()
    );
    consumer.close().await;
    schema.drop_now().await;
}
