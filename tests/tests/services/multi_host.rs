//! libpq's multi-host URLs and `target_session_attrs` on the real server: a host list tried in
//! order, a server whose sessions cannot write refused before use and waited out with its state
//! named once (in the log, `/readyz` and the metrics), and settings that cannot serve a relay
//! refused at start. The standby pair's failovers are in `pg_failover`.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::db::{self, PrivateDatabase};
use outbox_tests::{broker, http, metrics, process, unique, wait};

/// A port nothing listens on: the first host of a list that must be skipped.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `url` (one host) as a two-host URL whose first host refuses connections.
fn behind_a_dead_host(url: &str, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (userinfo, rest) = rest.split_once('@').unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let path = path.split('?').next().unwrap();
    format!(
        "{scheme}://{userinfo}@127.0.0.1:{},{host}/{path}{query}",
        closed_port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_list_skips_a_dead_host_and_relays_everything() {
    let name = unique("multihost");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 2_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let url = behind_a_dead_host(&outbox_tests::database_url(), "");
    let args = process::run_args(&name, &name, &[]);
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("DATABASE_URL", &url)]);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    consumer.assert_each_id_once(&mut conn, &table, 2_000).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    let log = relay.log_text();
    assert!(
        !log.contains("WARN"),
        "a skipped host is no warning:\n{log}"
    );
    consumer.close().await;
}

/// A server whose new sessions are read-only (here `default_transaction_read_only` on the
/// database; a standby answers the same way) is refused before any batch, said in words once,
/// shown on /readyz and the metrics, and relayed from as soon as it accepts writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_waited_out_with_its_state_named_once() {
    let database = PrivateDatabase::create("readonly").await;
    let table = db::table("outbox");
    db::seeded_table_in(&database.url, &table, 500).await;
    let mut admin = db::connect().await;
    db::exec(
        &mut admin,
        &format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            database.name
        ),
    )
    .await;
    let name = unique("readonly");
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let args = process::run_args("outbox", &name, &["--workers", "4"]);
    let relay = process::spawn_relay_with_env(&name, &args, &[("DATABASE_URL", &database.url)]);
    let addr = relay.metrics_addr().await;

    let named = wait::until(
        "/readyz names the read-only server",
        Duration::from_secs(20),
        || async {
            let (code, body) = http::get(&addr, "/readyz").await;
            code == 503 && body.contains("DatabaseReadOnly")
        },
    )
    .await;
    assert!(named.is_ok(), "{}", relay.log_text());
    // Long enough for four workers, the reporter and the listener to retry many times.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (_, text) = http::get(&addr, "/metrics").await;
    assert_eq!(
        metrics::value(&text, "outbox_relay_database_waiting_for_primary"),
        Some(1.0),
        "{text}"
    );
    let refusals = metrics::value(&text, "outbox_relay_database_standby_refusals_total");
    assert!(refusals.is_some_and(|n| n >= 2.0), "{refusals:?}");
    // Every failed attempt is counted by its cause, while the log says it once.
    let failures = metrics::value(
        &text,
        "outbox_relay_database_connect_failures_total{reason=\"DatabaseReadOnly\"}",
    );
    assert!(failures.is_some_and(|n| n >= 2.0), "{failures:?}\n{text}");
    let log = relay.log_text();
    let said: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    assert!(
        (1..=3).contains(&said.len()),
        "the state is said once, not per retry:\n{log}"
    );
    assert!(
        said[0].contains("read-only (default_transaction_read_only = on)")
            && said[0].contains("waiting for a primary"),
        "{log}"
    );
    assert_eq!(consumer.total(), 0);

    db::exec(
        &mut admin,
        &format!(
            "ALTER DATABASE {} RESET default_transaction_read_only",
            database.name
        ),
    )
    .await;
    assert!(
        db::wait_until_drained_in(&database.url, &table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    consumer.wait_for(500, Duration::from_secs(10)).await;
    assert_eq!(consumer.distinct(), 500);
    let (_, text) = http::get(&addr, "/metrics").await;
    assert_eq!(
        metrics::value(&text, "outbox_relay_database_waiting_for_primary"),
        Some(0.0)
    );
    let (code, _) = http::get(&addr, "/readyz").await;
    assert_eq!(code, 200);
    drop(relay);
    consumer.close().await;
    database.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_write_or_parse_are_refused_naming_them() {
    let base = outbox_tests::database_url();
    for (query, names) in [
        (
            "?target_session_attrs=standby",
            "target_session_attrs=standby",
        ),
        (
            "?target_session_attrs=read-only",
            "target_session_attrs=read-only",
        ),
        (
            "?target_session_attrs=prefer-standby",
            "target_session_attrs=prefer-standby",
        ),
        (
            "?target_session_attrs=master",
            "target_session_attrs \"master\"",
        ),
        ("?connect_timeout=soon", "connect_timeout"),
    ] {
        let url = behind_a_dead_host(&base, query);
        for command in [
            &["run", "--table", "nonexistent_outbox"][..],
            &["migrate", "--table", "nonexistent_outbox"],
        ] {
            let (code, _, stderr) =
                process::run_relay_command_with_env(command, &[("DATABASE_URL", &url)]).await;
            assert_eq!(code, 2, "{command:?} {query}: {stderr}");
            assert!(
                stderr.contains("--database-url") && stderr.contains(names),
                "{command:?} {query}: {stderr}"
            );
        }
    }
    // A port list that does not match the hosts, named without the URL's password.
    let (code, _, stderr) = process::run_relay_command_with_env(
        &["migrate", "--table", "nonexistent_outbox"],
        &[(
            "DATABASE_URL",
            "postgres://postgres:Hunter2pw@/test?host=127.0.0.1,127.0.0.2,127.0.0.3&port=5432,5433",
        )],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("3 hosts and 2 ports"), "{stderr}");
    assert!(!stderr.contains("Hunter2pw"), "{stderr}");
    // `lag` only reads: a standby may answer it; here no host is one, so it says so, naming
    // every host it tried.
    let url = behind_a_dead_host(&base, "?target_session_attrs=standby");
    let (code, _, stderr) = process::run_relay_command_with_env(
        &["lag", "--table", "nonexistent_outbox"],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "a primary accepting writes, and target_session_attrs=standby needs a standby"
        ),
        "{stderr}"
    );
}
