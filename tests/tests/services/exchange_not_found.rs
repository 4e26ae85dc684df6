//! An exchange that does not exist (issue 18, defect 2): the relay names it, backs off, settles
//! nothing, says so on /readyz and in its report, and recovers by itself once it is declared.

use std::time::Duration;

use chrono::Utc;
use lapin::ExchangeKind;
use outbox_relay::broker::ConnectError;
use outbox_relay::broker::amqp::{AmqpPublisher, AmqpSettings};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::table::OutboxTable;
use outbox_relay::table::health::TableHealth;
use outbox_relay::table::ident::{Ident, TableName};
use outbox_relay::table::reports::{
    Problem, ProblemKind, Report, Stored, read_reports, upsert_report,
};
use outbox_tests::{broker, db, http, process, unique, wait};
use sqlx::PgConnection;

const ROWS: u64 = 40;

fn missing_exchange_message(exchange: &str, vhost: &str) -> String {
    format!(
        "exchange {exchange} does not exist on vhost {vhost}: declare it, or pass --declare-exchange TYPE"
    )
}

/// One relay's report, read the way the operator reads it.
async fn report_of(table: &OutboxTable, relay: &str) -> Option<Report> {
    read_reports(
        &mut db::connect().await,
        &table.reports_table(),
        relay,
        30.0,
    )
    .await
    .expect("read the reports")
    .into_iter()
    .next()
}

/// The relay's log lines naming the missing exchange.
fn lines_naming(log: &str, message: &str) -> usize {
    log.lines().filter(|line| line.contains(message)).count()
}

/// Failed connects the relay counted with `reason`.
async fn connect_failures(addr: &str, reason: &str) -> f64 {
    let (_, text) = http::get(addr, "/metrics").await;
    outbox_tests::metrics::value(
        &text,
        &format!("outbox_relay_broker_connect_failures_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Rows that are processed, carry an error or spent an attempt.
async fn touched_rows(conn: &mut PgConnection, table: &OutboxTable) -> i64 {
    let c = &table.columns;
    db::scalar_i64(
        conn,
        &format!(
            "SELECT count(*) FROM {} WHERE {} IS NOT NULL OR {} IS NOT NULL OR {} <> 0",
            table.name.quoted(),
            c.processed_at.quoted(),
            c.error.quoted(),
            c.attempts.as_ref().expect("attempts mapped").quoted()
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_is_named_backed_off_and_reported_until_it_is_declared() {
    let name = unique("noexchange");
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    let mut conn = db::seeded_table(&table, ROWS).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let exchange = unique("noexchange_x");
    let args = process::run_args(
        &name,
        &exchange,
        &[
            "--relay-name",
            &name,
            // Several workers meet the same cause: the process says it once.
            "--workers",
            "3",
            "--attempts-column",
            "attempts",
        ],
    );
    let spawned = std::time::Instant::now();
    let mut relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    let message = missing_exchange_message(&exchange, "/");

    wait::until(
        "/readyz answers 503 naming the missing exchange",
        Duration::from_secs(20),
        || async {
            let (code, body) = http::get(&addr, "/readyz").await;
            code == 503 && body.contains(&format!("not ready (ExchangeNotFound): {message}\n"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));
    let expected = Problem {
        kind: ProblemKind::ExchangeNotFound,
        message: message.clone(),
    };
    wait::until(
        "the pod's report carries the problem",
        Duration::from_secs(20),
        || async {
            report_of(&table, &name).await.and_then(|r| r.problem) == Some(expected.clone())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));
    assert_eq!(expected.kind.code(), "ExchangeNotFound");

    // Backed off, so a missing exchange is no tight loop: each worker waits 100 ms × 2^n (at
    // least half of that after jitter), so three workers make at most about 7 attempts each in
    // their first 5 s, where a loop would make hundreds. The metric counts every attempt; the
    // log says the cause once.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(spawned.elapsed())).await;
    let attempts = connect_failures(&addr, "ExchangeNotFound").await;
    assert!(
        (6.0..=25.0).contains(&attempts),
        "{attempts} attempts in the first 5 s:\n{}",
        relay.log_text()
    );
    let log = relay.log_text();
    assert_eq!(lines_naming(&log, &message), 1, "said once:\n{log}");
    let (loud, libraries) = process::loud_lines(&log);
    assert!(libraries.is_empty(), "a library's own lines:\n{log}");
    assert!(
        loud.len() <= 3,
        "{} lines at WARN or above:\n{log}",
        loud.len()
    );
    assert!(!log.contains("cannot reach the broker"), "{log}");

    // Nothing was claimed for good, marked or charged an attempt.
    assert_eq!(db::pending(&mut conn, &table).await, ROWS as i64);
    assert_eq!(touched_rows(&mut conn, &table).await, 0);

    // Declaring the exchange is all it takes: the worker's next retry connects. (A retry between
    // the exchange's declaration and its queue's binding would publish to no queue: the
    // consumer's alternate exchange catches that; a fresh machine's run once lost all 40 so.)
    let consumer = broker::consume_new_exchange(&exchange, ExchangeKind::Fanout, "").await;
    wait::until(
        "/readyz answers 200 once the exchange exists",
        Duration::from_secs(40),
        || async { http::get(&addr, "/readyz").await.0 == 200 },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(consumer.wait_for(ROWS, Duration::from_secs(30)).await, ROWS);
    wait::until(
        "the pod's report no longer carries a problem",
        Duration::from_secs(20),
        || async {
            report_of(&table, &name)
                .await
                .is_some_and(|r| r.problem.is_none())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));
    let (_, body) = http::get(&addr, "/readyz").await;
    assert!(!body.contains("not ready"), "{body}");

    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    let log = relay.log_text();
    let url = SecretUrl::parse(&outbox_tests::amqp_url(), UrlKind::Amqp).unwrap();
    if let Some(password) = url.password() {
        assert!(!log.contains(&format!(":{password}@")), "{log}");
    }
    consumer.close().await;
}

fn settings(exchange: &str, dead_letter_exchange: Option<String>) -> AmqpSettings {
    AmqpSettings {
        exchange: exchange.to_string(),
        dead_letter_exchange,
        confirms: true,
        mandatory: false,
        timeout: Duration::from_secs(10),
        heartbeat: outbox_relay::defaults::BROKER_HEARTBEAT,
        content_type: "application/json".into(),
        connection_name: "exchange-not-found test".into(),
        declare_exchange: None,
        tls: Default::default(),
        password_file: None,
        cloudevents: None,
    }
}

async fn connect(url: &str, settings: AmqpSettings) -> Result<AmqpPublisher, ConnectError> {
    let url = SecretUrl::parse(url, UrlKind::Amqp).unwrap();
    AmqpPublisher::connect(&url, settings).await
}

/// `rabbitmqctl -q ARGS` on the broker the tests meet (3.10's, or 4.0's under the broker matrix).
fn rabbitmqctl(args: &[&str]) {
    let status = outbox_tests::test_broker::TestBroker::current()
        .rabbitmqctl()
        .arg("-q")
        .args(args)
        .status()
        .expect("rabbitmqctl must be installed");
    assert!(status.success(), "rabbitmqctl {args:?}");
}

#[tokio::test]
async fn connecting_names_the_missing_exchange_and_the_vhost_of_the_url() {
    let missing = unique("missing_x");
    let refused = connect(&outbox_tests::amqp_url(), settings(&missing, None))
        .await
        .err()
        .expect("a missing exchange fails the connect");
    assert_eq!(refused.to_string(), missing_exchange_message(&missing, "/"));

    // The default exchange always exists; a missing dead-letter exchange is the one named.
    let refused = connect(
        &outbox_tests::amqp_url(),
        settings("", Some(missing.clone())),
    )
    .await
    .err()
    .expect("a missing dead-letter exchange fails the connect");
    assert!(
        matches!(&refused, ConnectError::ExchangeNotFound { exchange, vhost } if *exchange == missing && vhost == "/"),
        "{refused:?}"
    );
    let publisher = connect(&outbox_tests::amqp_url(), settings("", None))
        .await
        .expect("the default exchange needs no declaring");
    outbox_relay::broker::Publisher::close(publisher).await;

    let vhost = unique("vhost");
    let vhost_for_setup = vhost.clone();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&["add_vhost", &vhost_for_setup]);
        rabbitmqctl(&[
            "set_permissions",
            "-p",
            &vhost_for_setup,
            "guest",
            ".*",
            ".*",
            ".*",
        ]);
    })
    .await
    .unwrap();
    let base = outbox_tests::amqp_url();
    let on_vhost = format!("{}/{vhost}", base.rsplit_once('/').unwrap().0);
    let refused = connect(&on_vhost, settings(&missing, None)).await;
    let vhost_for_cleanup = vhost.clone();
    tokio::task::spawn_blocking(move || rabbitmqctl(&["delete_vhost", &vhost_for_cleanup]))
        .await
        .unwrap();
    let refused = refused.err().expect("a missing exchange fails the connect");
    assert_eq!(
        refused.to_string(),
        missing_exchange_message(&missing, &vhost)
    );
}

#[tokio::test]
async fn a_report_table_from_before_the_problem_columns_keeps_working_and_migrate_adds_them() {
    // Its own schema, so its report table is its own: the tests' other tables share one.
    let schema = unique("legacy");
    let mut conn = db::connect().await;
    db::exec(&mut conn, &format!("CREATE SCHEMA {schema}")).await;
    let table = OutboxTable::new(TableName::parse(&format!("{schema}.outbox")).unwrap());
    outbox_relay::tools::seed::create_table(&mut conn, &table)
        .await
        .unwrap();
    let reports = table.reports_table();
    // The report table as earlier versions created it.
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {} (relay text NOT NULL, pod text NOT NULL, \
             reported_at timestamptz NOT NULL DEFAULT now(), backlog bigint, \
             backlog_capped boolean NOT NULL DEFAULT false, oldest_age_seconds double precision, \
             published_total bigint NOT NULL DEFAULT 0, publish_rate double precision NOT NULL DEFAULT 0, \
             PRIMARY KEY (relay, pod))",
            reports.quoted()
        ),
    )
    .await;
    let problem = Problem {
        kind: ProblemKind::ExchangeNotFound,
        message: missing_exchange_message("orders", "/"),
    };
    let mut report = Report {
        relay: "legacy".into(),
        pod: "pod-a".into(),
        reported_at: Utc::now(),
        backlog: None,
        published_total: 7,
        publish_rate: 1.5,
        problem: Some(problem.clone()),
        table_health: Some(TableHealth {
            horizon: None,
            dead_tuples: Some(12),
            live_tuples: Some(34),
            last_vacuum_age_seconds: None,
            pending_index_bytes: Some(8192),
            server_autovacuum: true,
            table_autovacuum: false,
            server_version_num: Some(150_018),
        }),
        max_rate: Some(250.0),
        rate_limited_seconds: Some(1.5),
    };
    let stored = upsert_report(&mut conn, &reports, &report).await.unwrap();
    assert_eq!(stored, Stored::LagOnly);
    let read = read_reports(&mut conn, &reports, "legacy", 30.0)
        .await
        .unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(
        (
            read[0].published_total,
            read[0].problem.clone(),
            read[0].table_health.clone()
        ),
        (7, None, None)
    );

    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let stored = upsert_report(&mut conn, &reports, &report).await.unwrap();
    assert_eq!(stored, Stored::Everything);
    let read = read_reports(&mut conn, &reports, "legacy", 30.0)
        .await
        .unwrap();
    assert_eq!(read[0].problem, Some(problem));
    assert_eq!(read[0].table_health, report.table_health);
    assert_eq!(
        (read[0].max_rate, read[0].rate_limited_seconds),
        (Some(250.0), Some(1.5))
    );

    report.problem = None;
    upsert_report(&mut conn, &reports, &report).await.unwrap();
    let read = read_reports(&mut conn, &reports, "legacy", 30.0)
        .await
        .unwrap();
    assert_eq!(read[0].problem, None, "a healthy report clears the problem");
    db::exec(&mut conn, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
