//! `outbox-relay dead-letters list|requeue|discard` on the real PostgreSQL and RabbitMQ (issue
//! 47): dead letters the relay itself gave up on, of two causes, are listed as two groups; one
//! group is requeued after its cause is fixed and arrives at the broker, the other is discarded
//! and stays settled; bad input and --dry-run write nothing.

use std::time::Duration;

use lapin::options::QueueBindOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::table::OutboxTable;
use outbox_tests::broker::Consumer;
use outbox_tests::{broker, db, process, unique};
use sqlx::PgConnection;
use uuid::Uuid;

const UNROUTABLE: i64 = 20;
const MALFORMED: i64 = 5;
const GOOD: i64 = 10;

/// A table with headers and attempts columns: `GOOD` rows of type `good` (routed),
/// `UNROUTABLE` of type `missing` (no queue bound: returned with --mandatory), `MALFORMED` of
/// type `good` whose headers are an array (malformed), in that claim order.
async fn table_with_two_causes(name: &str) -> (OutboxTable, PgConnection) {
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {name} (id uuid PRIMARY KEY, type text, content jsonb,
                 occurred_on_utc timestamptz, processed_on_utc timestamptz, error text,
                 headers jsonb, attempts int NOT NULL DEFAULT 0);
             INSERT INTO {name} (id, type, content, occurred_on_utc, headers)
             SELECT gen_random_uuid(),
                    CASE WHEN n <= {GOOD} OR n > {GOOD} + {UNROUTABLE} THEN 'good' ELSE 'missing' END,
                    '{{}}', now() - interval '1 hour' + n * interval '1 second',
                    CASE WHEN n > {GOOD} + {UNROUTABLE} THEN '[1, 2]'::jsonb END
               FROM generate_series(1, {total}) AS n;",
            total = GOOD + UNROUTABLE + MALFORMED
        ),
    )
    .await;
    (db::table(name), conn)
}

fn relay_args(name: &str) -> Vec<&str> {
    process::run_args(
        name,
        name,
        &[
            "--headers-column",
            "headers",
            "--attempts-column",
            "attempts",
            "--max-attempts",
            "2",
            "--mandatory",
            "true",
        ],
    )
}

/// Runs a relay until nothing is pending, then stops it.
async fn relay_until_drained(name: &str, table: &OutboxTable) {
    let mut relay = process::spawn_relay(name, &relay_args(name));
    assert!(
        db::wait_until_drained(table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
}

/// Everything the commands could write, as one text.
async fn snapshot(conn: &mut PgConnection, name: &str) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT string_agg(concat_ws('|', id, processed_on_utc, error, attempts), ',' ORDER BY id)
           FROM {name}"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Runs `outbox-relay <args>` against the tests' database; (exit code, stdout, stderr).
async fn command(args: &[&str]) -> (i32, String, String) {
    let url = outbox_tests::database_url();
    process::run_relay_command_with_env(args, &[("DATABASE_URL", &url)]).await
}

fn dead_letters<'a>(sub: &'a str, name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "dead-letters",
        sub,
        "--table",
        name,
        "--headers-column",
        "headers",
        "--attempts-column",
        "attempts",
    ];
    args.extend_from_slice(extra);
    args
}

/// The groups `list --json` prints: (name, rows, cause).
async fn groups(name: &str) -> Vec<(String, i64, String)> {
    let (code, out, err) = command(&dead_letters("list", name, &["--json"])).await;
    assert_eq!(code, 0, "{err}");
    let value: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    value["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_string(),
                g["rows"].as_i64().unwrap(),
                g["cause"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn ids_of_type(conn: &mut PgConnection, name: &str, kind: &str, extra: &str) -> Vec<Uuid> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {name} WHERE type = '{kind}' {extra} ORDER BY occurred_on_utc"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// Binds the consumer's queue to `missing` too: the cause of the unroutable rows, fixed.
async fn bind_missing(exchange: &str) {
    let connection =
        Connection::connect(&outbox_tests::amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("{exchange}_q");
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.into(),
            "missing".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "bound".into()).await;
}

/// The relay dead-letters rows of two causes; then the commands work on them.
async fn dead_lettered(name: &str) -> (OutboxTable, PgConnection, Consumer) {
    let (table, mut conn) = table_with_two_causes(name).await;
    let consumer = broker::consume(name, ExchangeKind::Direct, "good").await;
    relay_until_drained(name, &table).await;
    assert_eq!(
        consumer
            .wait_for(GOOD as u64, Duration::from_secs(30))
            .await,
        GOOD as u64
    );
    let dead = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE error IS NOT NULL AND processed_on_utc IS NOT NULL"
        ),
    )
    .await;
    assert_eq!(dead, UNROUTABLE + MALFORMED);
    (table, conn, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_causes_are_two_groups_one_requeued_arrives_one_discarded_stays_settled() {
    let name = unique("dead_letters");
    let (table, mut conn, consumer) = dead_lettered(&name).await;

    let listed = groups(&name).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let unroutable = listed
        .iter()
        .find(|g| g.2.contains("unroutable"))
        .expect("unroutable group");
    let malformed = listed
        .iter()
        .find(|g| g.2.contains("headers"))
        .expect("malformed group");
    assert_eq!(unroutable.1, UNROUTABLE, "{listed:?}");
    assert_eq!(malformed.1, MALFORMED, "{listed:?}");
    // The text form names the same groups.
    let (code, text, err) = command(&dead_letters("list", &name, &[])).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&unroutable.0) && text.contains(&malformed.0),
        "{text}"
    );

    // --dry-run counts and writes nothing.
    let before = snapshot(&mut conn, &name).await;
    let (code, out, err) = command(&dead_letters(
        "requeue",
        &name,
        &["--group", &unroutable.0, "--dry-run"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("would requeue {UNROUTABLE} dead letter(s)")),
        "{out}"
    );
    let (code, out, err) = command(&dead_letters(
        "discard",
        &name,
        &["--group", &malformed.0, "--dry-run"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("would discard {MALFORMED} dead letter(s)")),
        "{out}"
    );
    assert_eq!(snapshot(&mut conn, &name).await, before, "--dry-run wrote");

    // The cause fixed, the group requeued in small batches: pending again, attempts reset.
    bind_missing(&name).await;
    let (code, out, err) = command(&dead_letters(
        "requeue",
        &name,
        &["--group", &unroutable.0, "--batch-size", "7"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("requeued {UNROUTABLE} dead letter(s)")),
        "{out}"
    );
    assert!(
        err.contains("requeue: 7/20") && err.contains("requeue: 20/20"),
        "{err}"
    );
    let reset = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE type = 'missing' AND processed_on_utc IS NULL \
             AND error IS NULL AND attempts = 0"
        ),
    )
    .await;
    assert_eq!(reset, UNROUTABLE);

    // Discarded: still settled, its error kept behind the prefix, no longer listed.
    let (code, out, err) =
        command(&dead_letters("discard", &name, &["--group", &malformed.0])).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("discarded {MALFORMED} dead letter(s)")),
        "{out}"
    );
    let discarded = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE processed_on_utc IS NOT NULL AND error LIKE \
             'discarded (outbox-relay dead-letters discard): %headers must be a JSON object%'"
        ),
    )
    .await;
    assert_eq!(discarded, MALFORMED);

    // The relay sends the requeued rows, and only them.
    relay_until_drained(&name, &table).await;
    let requeued = ids_of_type(&mut conn, &name, "missing", "").await;
    let total = (GOOD + UNROUTABLE) as u64;
    assert_eq!(
        consumer.wait_for(total, Duration::from_secs(30)).await,
        total
    );
    assert!(requeued.iter().all(|id| consumer.has(id)));
    let malformed_ids = ids_of_type(&mut conn, &name, "good", "AND headers IS NOT NULL").await;
    assert_eq!(malformed_ids.len() as i64, MALFORMED);
    // Give a wrongly sent row the time to arrive before saying none did.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(malformed_ids.iter().all(|id| !consumer.has(id)));
    assert_eq!(consumer.total(), total);
    let still_settled = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE headers IS NOT NULL AND processed_on_utc IS NOT NULL"
        ),
    )
    .await;
    assert_eq!(still_settled, MALFORMED);
    assert!(groups(&name).await.is_empty());
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_and_writes_nothing() {
    let name = unique("dead_letters_bad");
    let (_table, mut conn, consumer) = dead_lettered(&name).await;
    let before = snapshot(&mut conn, &name).await;
    let unknown_id = Uuid::new_v4().to_string();
    let cases: [(&str, Vec<&str>, &str); 6] = [
        (
            "requeue",
            vec!["--group", "g00000000"],
            "invalid --group: g00000000 is not a group",
        ),
        (
            "discard",
            vec!["--group", "g00000000"],
            "invalid --group: g00000000 is not a group",
        ),
        ("requeue", vec![], "invalid --group: nothing selected"),
        (
            "discard",
            vec![
                "--from",
                "2020-01-01T00:00:00Z",
                "--to",
                "2020-01-02T00:00:00Z",
            ],
            "invalid --from: the selection matches no dead letter",
        ),
        (
            "requeue",
            vec![
                "--from",
                "2026-12-05T05:00:00Z",
                "--to",
                "2026-12-05T04:00:00Z",
            ],
            "invalid --from: 2026-12-05T05:00:00.000Z is not before --to",
        ),
        (
            "requeue",
            vec!["--id", &unknown_id],
            "invalid --id: the selection matches no dead letter",
        ),
    ];
    for (sub, extra, expected) in cases {
        let (code, out, err) = command(&dead_letters(sub, &name, &extra)).await;
        assert_eq!(code, 2, "{sub} {extra:?}: {out}{err}");
        assert!(err.contains(expected), "{sub} {extra:?}: {err}");
    }
    let (code, _, err) = command(&dead_letters("requeue", &name, &["--from", "yesterday"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("invalid --from: \"yesterday\" is not an RFC 3339 time"),
        "{err}"
    );
    assert_eq!(
        snapshot(&mut conn, &name).await,
        before,
        "a refused command wrote"
    );
    consumer.close().await;
}
