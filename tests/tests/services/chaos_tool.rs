//! `outbox-chaos` as a user runs it: on the database `DATABASE_URL` names (not a fixed one),
//! and ending at once, with the relay's own words, when a relay exits with an error it will
//! not recover from.

use std::process::Stdio;
use std::time::{Duration, Instant};

use outbox_tests::{db, process, unique};
use tokio::process::Command;

/// Runs `outbox-chaos args…` with `database_url`; (exit code, stdout + stderr, time taken).
/// Killed after `limit`, so a hang fails the test instead of stalling it.
async fn chaos(
    database_url: &str,
    args: &[&str],
    limit: Duration,
) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let child = Command::new(process::binary("outbox-chaos"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("AMQP_URL", outbox_tests::amqp_url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run outbox-chaos");
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("outbox-chaos {args:?} still running after {limit:?}"))
        .expect("outbox-chaos ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text, started.elapsed())
}

#[tokio::test]
async fn the_run_uses_the_database_of_database_url() {
    let database = unique("chaos_db");
    let mut admin = db::connect().await;
    db::exec(&mut admin, &format!("CREATE DATABASE {database}")).await;
    let mut url = url::Url::parse(&outbox_tests::database_url()).unwrap();
    url.set_path(&format!("/{database}"));
    let args = [
        "--rows",
        "3000",
        "--relays",
        "1",
        "--workers",
        "1",
        "--batch-size",
        "200",
        "--faults",
        "kill-9",
        "--per-kind",
        "1",
    ];
    let (code, text, took) = chaos(url.as_str(), &args, Duration::from_secs(240)).await;
    db::exec(
        &mut admin,
        &format!("DROP DATABASE {database} WITH (FORCE)"),
    )
    .await;
    assert_eq!(code, Some(0), "outbox-chaos failed after {took:?}:\n{text}");
    assert!(text.contains("chaos: 1 passed, 0 failed"), "{text}");
}

#[tokio::test]
async fn a_relay_that_exits_with_an_error_ends_the_run_at_once() {
    // A batch size the relay refuses: every relay exits with code 2 at start.
    let args = [
        "--rows",
        "2000",
        "--relays",
        "1",
        "--workers",
        "1",
        "--batch-size",
        "100000",
        "--faults",
        "kill-9",
        "--per-kind",
        "1",
    ];
    let (code, text, took) = chaos(
        &outbox_tests::database_url(),
        &args,
        Duration::from_secs(120),
    )
    .await;
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("relay 0 exited with code 2"), "{text}");
    assert!(
        text.contains("batch"),
        "the relay's own words are missing:\n{text}"
    );
    assert!(took < Duration::from_secs(60), "took {took:?} to give up");
}
