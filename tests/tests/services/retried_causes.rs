//! A broker the relay cannot use, for a minute (issue 59): whatever the cause, the process says
//! it once (not once per worker per retry), a library's own ERROR lines for it stay out of the
//! log, the cause is in the metric and on `/readyz`, and once it is fixed (the password file or
//! the CA file rewritten, both read at every connect) one line says so and the rows go out.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::ports::RABBITMQ_TLS_PORT;
use outbox_tests::{broker, db, http, metrics, process, tls, unique};

const ROWS: u64 = 50;
/// The window the counts are taken over: the "per minute".
const WINDOW: Duration = Duration::from_secs(60);
/// At most this many lines at WARN or above in the window, for the whole process.
const MOST_LINES: usize = 3;

/// One cause: the broker URL, extra flags, the file to rewrite with `fix` (if it can be fixed
/// mid-run), and the metric reason and `/readyz` code it must show.
struct Cause<'a> {
    name: &'a str,
    url: String,
    extra: Vec<String>,
    fix: Option<(std::path::PathBuf, Vec<u8>)>,
    reason: &'a str,
    /// The problem code `/readyz` names, an outage's too.
    ready_code: &'a str,
}

async fn said_once_a_minute(cause: Cause<'_>) {
    let table_name = unique(cause.name);
    let table = db::table(&table_name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    let exchange = unique(&format!("{}_x", cause.name));
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let mut args = process::run_args(&table_name, &exchange, &["--workers", "4"]);
    let extra: Vec<&str> = cause.extra.iter().map(String::as_str).collect();
    args.extend_from_slice(&extra);
    let mut relay =
        process::spawn_relay_with_env(&table_name, &args, &[("AMQP_URL", cause.url.as_str())]);
    let addr = relay.metrics_addr().await;
    let series = format!(
        "outbox_relay_broker_connect_failures_total{{reason=\"{}\"}}",
        cause.reason
    );
    let body = a_quiet_minute(&relay, &addr, &series, cause.ready_code).await;
    assert!(body.contains("broker: not connected"), "{body}");
    assert_eq!(db::pending(&mut conn, &table).await, ROWS as i64);

    if let Some((path, right)) = cause.fix {
        std::fs::write(&path, right).expect("fix the file");
        assert!(
            db::wait_until_drained(&table, Duration::from_secs(40)).await,
            "{}: not drained after the fix:\n{}",
            cause.name,
            relay.log_text()
        );
        assert_eq!(consumer.wait_for(ROWS, Duration::from_secs(20)).await, ROWS);
        let log = relay.log_text();
        let cleared = log
            .lines()
            .filter(|line| line.contains("the broker accepts the relay again"))
            .count();
        assert_eq!(cleared, 1, "{}: the end said once:\n{log}", cause.name);
    }
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
}

/// Waits a minute of the relay meeting its cause, then checks what a person and a program see:
/// at most [`MOST_LINES`] lines at WARN or above and none of a library's, at least 8 attempts
/// counted in the metric `series`, and `/readyz` 503 naming `ready_code`. Returns `/readyz`'s
/// body.
async fn a_quiet_minute(
    relay: &process::RelayProcess,
    addr: &str,
    series: &str,
    ready_code: &str,
) -> String {
    tokio::time::sleep(WINDOW).await;
    let log = relay.log_text();
    let (loud, libraries) = process::loud_lines(&log);
    assert!(
        libraries.is_empty(),
        "{ready_code}: a library's own lines:\n{log}"
    );
    assert!(
        loud.len() <= MOST_LINES,
        "{ready_code}: {} lines at WARN or above in a minute:\n{log}",
        loud.len()
    );
    let (_, text) = http::get(addr, "/metrics").await;
    let attempts = metrics::value(&text, series).unwrap_or(0.0);
    assert!(attempts >= 8.0, "{attempts} attempts counted in {series}");
    let (code, body) = http::get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(&format!("not ready ({ready_code}):")),
        "{body}"
    );
    body
}

/// A file of the test's own, holding `bytes`.
fn file_with(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(unique(name));
    std::fs::write(&path, bytes).expect("write the file");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_said_once_a_minute_and_its_end_once() {
    let password = file_with("broker-password", b"Wr0ng-S3cret\n");
    said_once_a_minute(Cause {
        name: "wrongpw",
        url: outbox_tests::amqp_url(),
        extra: vec![
            "--broker-password-file".into(),
            password.display().to_string(),
        ],
        fix: Some((password.clone(), b"guest\n".to_vec())),
        reason: "BrokerAuth",
        ready_code: "BrokerAuth",
    })
    .await;
    std::fs::remove_file(password).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_broker_certificate_is_said_once_a_minute_and_its_end_once() {
    let read = |name: &str| std::fs::read(tls::file(name)).expect("the test CA files");
    let ca = file_with("broker-ca", &read("other-ca.pem"));
    said_once_a_minute(Cause {
        name: "otherca",
        url: format!("amqps://guest:guest@127.0.0.1:{RABBITMQ_TLS_PORT}/%2f"),
        extra: vec!["--broker-ca-file".into(), ca.display().to_string()],
        fix: Some((ca.clone(), read("ca.pem"))),
        reason: "BrokerTLS",
        ready_code: "BrokerTLS",
    })
    .await;
    std::fs::remove_file(ca).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_broker_port_is_said_once_a_minute() {
    // A port nothing listens on: bound, then released.
    let port = outbox_tests::control_plane::free_port().expect("a free port");
    said_once_a_minute(Cause {
        name: "closedport",
        url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        extra: Vec::new(),
        fix: None,
        reason: "BrokerUnreachable",
        ready_code: "BrokerUnreachable",
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_vhost_is_said_once_a_minute_as_a_setting() {
    let mut url = url::Url::parse(&outbox_tests::amqp_url()).expect("AMQP_URL is a URL");
    url.set_path(&format!("/{}", unique("no_vhost")));
    said_once_a_minute(Cause {
        name: "novhost",
        url: url.to_string(),
        extra: Vec::new(),
        fix: None,
        reason: "BrokerSettings",
        ready_code: "BrokerSettings",
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_host_name_that_does_not_resolve_is_said_once_a_minute() {
    // `.invalid` never resolves (RFC 6761).
    let mut url = url::Url::parse(&outbox_tests::amqp_url()).expect("AMQP_URL is a URL");
    url.set_host(Some("no-such-broker.invalid"))
        .expect("a host name");
    said_once_a_minute(Cause {
        name: "nodns",
        url: url.to_string(),
        extra: Vec::new(),
        fix: None,
        reason: "BrokerUnreachable",
        ready_code: "BrokerUnreachable",
    })
    .await;
}

/// The database's side: a password file that holds a password the server refuses (a rotation
/// that reached the database before the relay's Secret), for a minute, then the right one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_database_login_is_said_once_a_minute_and_its_end_once() {
    const PASSWORD: &str = "r0tated-pw";
    let role = tls::TlsRole::create("rotated", PASSWORD).await;
    let name = format!("{}.outbox", role.name);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, ROWS).await;
    role.own(&mut admin, &name).await;
    let url = tls::url(&role.name, None, &[("sslmode", "require")]);
    let password = file_with("database-password", format!("{PASSWORD}\n").as_bytes());
    let password_flag = password.display().to_string();
    // The role makes its own report tables, as the operator's migration would for it.
    let (code, _, stderr) = process::run_relay_command_with_env(
        &[
            "migrate",
            "--table",
            &name,
            "--database-password-file",
            &password_flag,
        ],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    std::fs::write(&password, b"Wr0ng-S3cret\n").expect("write the wrong password");
    let exchange = unique("dbauth_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &exchange,
        &["--workers", "4", "--database-password-file", &password_flag],
    );
    let mut relay = process::spawn_relay_with_env(&role.name, &args, &[("DATABASE_URL", &url)]);
    let addr = relay.metrics_addr().await;
    let series = "outbox_relay_database_connect_failures_total{reason=\"DatabaseAuth\"}";
    a_quiet_minute(&relay, &addr, series, "DatabaseAuth").await;
    assert!(!relay.log_text().contains("Wr0ng-S3cret"));
    assert_eq!(db::pending(&mut admin, &table).await, ROWS as i64);

    std::fs::write(&password, format!("{PASSWORD}\n")).expect("fix the password file");
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(40)).await,
        "not drained after the fix:\n{}",
        relay.log_text()
    );
    assert_eq!(consumer.wait_for(ROWS, Duration::from_secs(20)).await, ROWS);
    let log = relay.log_text();
    let cleared = log
        .lines()
        .filter(|line| line.contains("PostgreSQL accepts the relay's sessions again"))
        .count();
    assert_eq!(cleared, 1, "the end said once:\n{log}");
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
    std::fs::remove_file(password).ok();
}

/// The database's side when nothing answers: a port nothing listens on, for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_said_once_a_minute() {
    let port = outbox_tests::control_plane::free_port().expect("a free port");
    let mut url = url::Url::parse(&outbox_tests::database_url()).expect("DATABASE_URL is a URL");
    url.set_port(Some(port)).expect("a port");
    let name = unique("nodb");
    let args = process::run_args(&name, &name, &["--workers", "4"]);
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("DATABASE_URL", url.as_str())]);
    let addr = relay.metrics_addr().await;
    let series = "outbox_relay_database_connect_failures_total{reason=\"DatabaseUnreachable\"}";
    let body = a_quiet_minute(&relay, &addr, series, "DatabaseUnreachable").await;
    assert!(body.contains("database: not connected"), "{body}");
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
}
