//! `outbox-relay replay` on the real PostgreSQL and RabbitMQ (issue 47): a table relayed by the
//! real relay, then the consumer loses its queue; a replayed time range and a replayed type
//! arrive again with their message ids and the `x-outbox-replay` header, and nothing outside
//! them; per-key order holds across a replay and a dead-letters requeue; bad input and
//! --dry-run write nothing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lapin::options::QueueBindOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::table::OutboxTable;
use outbox_tests::broker::Consumer;
use outbox_tests::ordering::check;
use outbox_tests::{broker, db, process, unique, wait};
use sqlx::PgConnection;
use uuid::Uuid;

/// Rows of the first tests: claim positions BASE + 1 s … BASE + ROWS s, types alternating.
const ROWS: i64 = 60;
const BASE: &str = "2026-01-01T00:00:00Z";

/// A table with headers and attempts columns: row n (1..=ROWS) at BASE + n seconds, of type
/// `invoice` when n is even and `order` when odd; the rows with n % 3 = 0 carry a header of
/// their own (`tenant`), which a replay must keep.
async fn relayable_table(name: &str) -> (OutboxTable, PgConnection) {
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {name} (id uuid PRIMARY KEY, type text, content jsonb,
                 occurred_on_utc timestamptz, processed_on_utc timestamptz, error text,
                 headers jsonb, attempts int NOT NULL DEFAULT 0);
             INSERT INTO {name} (id, type, content, occurred_on_utc, headers)
             SELECT gen_random_uuid(), CASE WHEN n % 2 = 0 THEN 'invoice' ELSE 'order' END,
                    jsonb_build_object('n', n), '{BASE}'::timestamptz + n * interval '1 second',
                    CASE WHEN n % 3 = 0 THEN '{{\"tenant\": \"a\"}}'::jsonb END
               FROM generate_series(1, {ROWS}) AS n;"
        ),
    )
    .await;
    (db::table(name), conn)
}

fn relay_args<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--headers-column",
        "headers",
        "--attempts-column",
        "attempts",
    ];
    args.extend_from_slice(extra);
    process::run_args(name, name, &args)
}

/// Runs `outbox-relay <args>` against the tests' database; (exit code, stdout, stderr).
async fn command(args: &[&str]) -> (i32, String, String) {
    let url = outbox_tests::database_url();
    command_at(&url, args).await
}

async fn command_at(url: &str, args: &[&str]) -> (i32, String, String) {
    process::run_relay_command_with_env(args, &[("DATABASE_URL", url)]).await
}

fn replay<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "replay",
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

/// Everything a replay could write, as one text.
async fn snapshot(conn: &mut PgConnection, name: &str) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT string_agg(concat_ws('|', id, processed_on_utc, error, attempts, headers), ','
                           ORDER BY id)
           FROM {name}"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

async fn ids_where(conn: &mut PgConnection, name: &str, condition: &str) -> Vec<Uuid> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {name} WHERE {condition} ORDER BY occurred_on_utc, id"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// The value a replay printed after "marked x-outbox-replay: ".
fn marked(out: &str) -> String {
    let (_, rest) = out
        .split_once("marked x-outbox-replay: ")
        .unwrap_or_else(|| panic!("no replay mark in {out:?}"));
    rest.split(';').next().unwrap().trim().to_string()
}

/// Waits until the consumer holds `n` messages, then a second more so a message that should
/// not come has had the time to.
async fn settle_at(consumer: &Consumer, n: u64) {
    assert_eq!(consumer.wait_for(n, Duration::from_secs(90)).await, n);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(consumer.total(), n, "more messages than replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_range_and_a_type_arrive_again_marked_after_the_consumer_lost_its_queue() {
    let name = unique("replay");
    let (table, mut conn) = relayable_table(&name).await;
    let first = broker::consume(&name, ExchangeKind::Topic, "#").await;
    let mut relay = process::spawn_relay(&name, &relay_args(&name, &["--batch-size", "10"]));
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(
        first.wait_for(ROWS as u64, Duration::from_secs(30)).await,
        ROWS as u64
    );
    assert!(
        ids_where(&mut conn, &name, "true")
            .await
            .iter()
            .all(|id| first.replay_of(id).is_none())
    );
    // The consumer lost its queue: deleted, and declared again empty.
    first.close().await;
    let consumer = broker::consume(&name, ExchangeKind::Topic, "#").await;

    // Rows 20..=39: the range is from inclusive, until exclusive.
    let since = "2026-01-01T00:00:20Z";
    let until = "2026-01-01T00:00:40Z";
    let in_range = ids_where(
        &mut conn,
        &name,
        &format!("occurred_on_utc >= '{since}' AND occurred_on_utc < '{until}'"),
    )
    .await;
    assert_eq!(in_range.len(), 20);

    // --dry-run: the count, the span and the types, and nothing written.
    let before = snapshot(&mut conn, &name).await;
    let (code, out, err) = command(&replay(
        &name,
        &["--since", since, "--until", until, "--dry-run"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "would replay 20 row(s) from 2026-01-01T00:00:20.000Z to 2026-01-01T00:00:39.000Z; \
             nothing written (--dry-run)"
        ),
        "{out}"
    );
    assert!(
        out.contains("10  invoice") && out.contains("10  order"),
        "{out}"
    );
    assert_eq!(snapshot(&mut conn, &name).await, before, "--dry-run wrote");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(consumer.total(), 0, "a dry run sent something");

    // The real run, in batches of 7, while the relay runs.
    let (code, out, err) = command(&replay(
        &name,
        &["--since", since, "--until", until, "--batch-size", "7"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("replayed 20 row(s)"), "{out}");
    assert!(
        err.contains("replay: 7/20 row(s), claim order reached 2026-01-01T00:00:26.000Z")
            && err.contains("replay: 20/20 row(s), claim order reached 2026-01-01T00:00:39.000Z"),
        "{err}"
    );
    let mark = marked(&out);
    settle_at(&consumer, 20).await;
    for id in &in_range {
        assert_eq!(
            consumer.replay_of(id).as_deref(),
            Some(mark.as_str()),
            "{id}"
        );
    }
    // The row's own headers are kept, the mark merged in.
    let kept = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE headers->>'tenant' = 'a' \
             AND headers->>'x-outbox-replay' = '{mark}'"
        ),
    )
    .await;
    assert_eq!(kept, 7, "rows 21, 24, …, 39 keep their tenant header");
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );

    // By type: every invoice, the ten already replayed among them, again.
    let invoices = ids_where(&mut conn, &name, "type = 'invoice'").await;
    let (code, out, err) = command(&replay(&name, &["--type", "invoice"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("replayed 30 row(s)"), "{out}");
    let second = marked(&out);
    assert_ne!(second, mark);
    settle_at(&consumer, 50).await;
    for id in &invoices {
        assert_eq!(
            consumer.replay_of(id).as_deref(),
            Some(second.as_str()),
            "{id}"
        );
    }
    // Nothing outside the two selections came.
    let outside = ids_where(
        &mut conn,
        &name,
        &format!(
            "type = 'order' AND NOT (occurred_on_utc >= '{since}' AND occurred_on_utc < '{until}')"
        ),
    )
    .await;
    assert_eq!(outside.len(), 20);
    assert!(outside.iter().all(|id| !consumer.has(id)));
    assert!(
        consumer
            .duplicates()
            .iter()
            .all(|(id, _)| invoices.contains(id))
    );
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_exit_2_with_their_sentence_and_write_nothing() {
    let name = unique("replay_bad");
    let (_table, mut conn) = relayable_table(&name).await;
    // Settled as the relay would have, but for the last ten rows: still pending, and a dead
    // letter among the settled ones.
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {name} SET processed_on_utc = now()
              WHERE occurred_on_utc <= '{BASE}'::timestamptz + interval '50 seconds';
             UPDATE {name} SET error = 'dead-lettered after 5 attempt(s): x'
              WHERE occurred_on_utc = '{BASE}'::timestamptz + interval '1 second';
             CREATE TABLE {name}_other (a int);
             CREATE TABLE {name}_deleting (LIKE {name});
             INSERT INTO {name}_deleting SELECT * FROM {name} WHERE processed_on_utc IS NULL;"
        ),
    )
    .await;
    let dir = std::env::temp_dir().join(unique("replay_ids"));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_ids = dir.join("bad");
    std::fs::write(&bad_ids, format!("{}\n\nnope\n", Uuid::new_v4())).unwrap();
    let unknown_ids = dir.join("unknown");
    std::fs::write(&unknown_ids, format!("{}\n", Uuid::new_v4())).unwrap();
    let pending = ids_where(&mut conn, &name, "processed_on_utc IS NULL").await;
    let pending_ids = dir.join("pending");
    std::fs::write(
        &pending_ids,
        pending
            .iter()
            .map(|id| format!("{id}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let dead_ids = dir.join("dead");
    let dead = ids_where(&mut conn, &name, "error IS NOT NULL").await;
    std::fs::write(&dead_ids, format!("{}\n", dead[0])).unwrap();
    let (bad_ids, unknown_ids, pending_ids, dead_ids) = (
        bad_ids.to_str().unwrap(),
        unknown_ids.to_str().unwrap(),
        pending_ids.to_str().unwrap(),
        dead_ids.to_str().unwrap(),
    );
    let other = format!("{name}_other");
    let deleting = format!("{name}_deleting");
    let missing = format!("{name}_missing");
    let before = snapshot(&mut conn, &name).await;
    let no_match = "the selection matches no delivered row in";
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            replay(&name, &[]),
            vec!["invalid --since: nothing selected"],
        ),
        (
            replay(
                &name,
                &[
                    "--since",
                    "2026-01-01T00:00:40Z",
                    "--until",
                    "2026-01-01T00:00:20Z",
                ],
            ),
            vec!["invalid --since: 2026-01-01T00:00:40.000Z is not before --until"],
        ),
        (
            replay(&name, &["--until", "yesterday"]),
            vec!["invalid --until: \"yesterday\" is not an RFC 3339 time"],
        ),
        (
            replay(&name, &["--ids-file", bad_ids]),
            vec!["invalid --ids-file: ", "line 3: \"nope\" is not a uuid"],
        ),
        (
            replay(&name, &["--ids-file", unknown_ids]),
            vec!["invalid --ids-file: ", no_match, "--processed-retention"],
        ),
        // Pending rows are the relay's: never replayed.
        (
            replay(&name, &["--ids-file", pending_ids]),
            vec!["invalid --ids-file: ", no_match],
        ),
        // A dead letter is not a delivered row: dead-letters requeue is its command.
        (
            replay(&name, &["--ids-file", dead_ids, "--dry-run"]),
            vec!["invalid --ids-file: ", no_match],
        ),
        (
            replay(&name, &["--type", "nothing-of-this-type"]),
            vec!["invalid --type: ", no_match],
        ),
        (
            replay(&name, &["--key", "order-1"]),
            vec!["invalid --key: ", "--partition-key-column"],
        ),
        (
            vec!["replay", "--table", &name, "--type", "order"],
            vec!["invalid --headers-column: not set", "--unmarked"],
        ),
        (
            replay(&other, &["--type", "order"]),
            vec![
                "invalid column mapping: table",
                "has no column id (--id-column)",
            ],
        ),
        (
            replay(&missing, &["--type", "order"]),
            vec!["invalid --table: table", "does not exist"],
        ),
        (
            replay(&deleting, &["--type", "order"]),
            vec![
                "invalid --type: ",
                no_match,
                "the relay probably runs in delete mode",
                "--mode mark",
                "--processed-retention",
            ],
        ),
        (
            replay(&name, &["--type", "order", "--batch-size", "0"]),
            vec!["invalid --batch-size: must be at least 1"],
        ),
    ];
    for (args, says) in &cases {
        let (code, out, err) = command(args).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        for part in says {
            assert!(err.contains(part), "{args:?}: {part:?} missing in {err}");
        }
    }
    // A connection that chooses read-only sessions is refused before connecting.
    let mut url = url::Url::parse(&outbox_tests::database_url()).unwrap();
    url.query_pairs_mut()
        .append_pair("target_session_attrs", "read-only");
    let (code, _, err) = command_at(url.as_str(), &replay(&name, &["--type", "order"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--database-url") && err.contains("target_session_attrs=read-only"),
        "{err}"
    );
    assert_eq!(
        snapshot(&mut conn, &name).await,
        before,
        "a refused command wrote"
    );
    // --unmarked replays without the header: the refusal above was only about the mark.
    let (code, out, err) = command(&[
        "replay",
        "--table",
        &name,
        "--type",
        "order",
        "--unmarked",
        "--dry-run",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would replay 24 row(s)"), "{out}");
    assert_eq!(snapshot(&mut conn, &name).await, before, "--dry-run wrote");
    let _ = std::fs::remove_dir_all(&dir);
}

const KEY: &str = "aggregate_id";
const KEYS: i64 = 8;
const PER_KEY: i64 = 12;

/// A keyed table: PER_KEY rows for each of KEYS keys (`k0` … `k7`), interleaved in claim
/// order; the 4th and 9th row of every key are of type `missing`, which no queue is bound to
/// at first (dead-lettered), the rest `good`.
async fn keyed_table(name: &str) -> (OutboxTable, PgConnection) {
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {name} (id uuid PRIMARY KEY, type text, content jsonb,
                 occurred_on_utc timestamptz, processed_on_utc timestamptz, error text,
                 headers jsonb, attempts int NOT NULL DEFAULT 0, {KEY} text);
             INSERT INTO {name} (id, type, content, occurred_on_utc, {KEY})
             SELECT gen_random_uuid(),
                    CASE WHEN n / {KEYS} IN (3, 8) THEN 'missing' ELSE 'good' END,
                    jsonb_build_object('n', n), '{BASE}'::timestamptz + n * interval '1 ms',
                    'k' || (n % {KEYS})
               FROM generate_series(0, {total} - 1) AS n;",
            total = KEYS * PER_KEY
        ),
    )
    .await;
    let mut table = db::table(name);
    table.columns.partition_key = Some(outbox_relay::table::ident::Ident::new(KEY).unwrap());
    (table, conn)
}

/// Binds the consumer's queue to `missing` too: the cause of the dead letters, fixed.
async fn bind_missing(exchange: &str, queue: &str) {
    let connection =
        Connection::connect(&outbox_tests::amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "missing".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "bound".into()).await;
}

/// Each id's key and its place among the given ids of its key, in claim order: what the
/// consumer must see for that stream.
async fn order_of(
    conn: &mut PgConnection,
    name: &str,
    ids: &[Uuid],
) -> HashMap<Uuid, (String, i64)> {
    let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, {KEY}, row_number() OVER (PARTITION BY {KEY} ORDER BY occurred_on_utc, id)
           FROM {name} WHERE id = ANY($1)"
    )))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, key, n)| (id, (key, n)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_across_a_replay_and_a_dead_letters_requeue() {
    let name = unique("replay_keys");
    let (table, mut conn) = keyed_table(&name).await;
    let first = broker::consume(&name, ExchangeKind::Direct, "good").await;
    let ordered = [
        "--ordering",
        "per-key",
        "--partition-key-column",
        KEY,
        "--mandatory",
        "true",
        "--max-attempts",
        "2",
        "--workers",
        "2",
        "--batch-size",
        "5",
    ];
    let args = relay_args(&name, &ordered);
    let mut relay = process::spawn_relay(&name, &args);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    let dead = ids_where(&mut conn, &name, "error IS NOT NULL").await;
    assert_eq!(dead.len() as i64, 2 * KEYS);
    let good = (KEYS * PER_KEY) as u64 - dead.len() as u64;
    assert_eq!(first.wait_for(good, Duration::from_secs(30)).await, good);
    first.close().await;
    // The consumer's queue, lost and declared again, now bound for both types.
    let consumer = broker::consume(&name, ExchangeKind::Direct, "good").await;
    bind_missing(&name, &consumer.queue).await;

    // While the relay runs: replay keys k0..k5 in batches of 4, and requeue the dead letters
    // (of every key, k0..k5 among them) in batches of 3.
    let replayed = ids_where(
        &mut conn,
        &name,
        &format!("{KEY} IN ('k0','k1','k2','k3','k4','k5') AND error IS NULL"),
    )
    .await;
    let mut keys = Vec::new();
    for k in 0..6 {
        keys.push("--key".to_string());
        keys.push(format!("k{k}"));
    }
    let mut extra: Vec<&str> = keys.iter().map(String::as_str).collect();
    extra.extend_from_slice(&[
        "--ordering",
        "per-key",
        "--partition-key-column",
        KEY,
        "--batch-size",
        "4",
    ]);
    let (code, out, err) = command(&replay(&name, &extra)).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("replayed {} row(s)", replayed.len())),
        "{out}"
    );
    let (code, out, err) = command(&[
        "dead-letters",
        "requeue",
        "--table",
        &name,
        "--attempts-column",
        "attempts",
        "--from",
        "2000-01-01T00:00:00Z",
        "--batch-size",
        "3",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("requeued {} dead letter(s)", dead.len())),
        "{out}"
    );

    let total = (replayed.len() + dead.len()) as u64;
    let arrived = wait::holds(
        "replayed and requeued rows arrived",
        Duration::from_secs(90),
        || async { consumer.distinct() as u64 >= total },
    )
    .await;
    assert!(
        arrived,
        "{} of {total} arrived; {}",
        consumer.distinct(),
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    let arrivals = consumer.arrivals();
    let seen: HashSet<Uuid> = arrivals.iter().copied().collect();
    assert!(replayed.iter().chain(&dead).all(|id| seen.contains(id)));
    // Nothing else: the keys k6 and k7 were not replayed.
    assert_eq!(seen.len() as u64, total);
    for (stream, ids) in [("replayed", &replayed), ("requeued", &dead)] {
        let expected = order_of(&mut conn, &name, ids).await;
        let report = check(&arrivals, &expected);
        assert!(
            report.keys_out_of_order.is_empty(),
            "{stream}: keys out of claim order: {:?}",
            report.keys_out_of_order
        );
        assert_eq!(report.first_deliveries, ids.len(), "{stream}");
    }
    // The replayed rows say so; the requeued dead letters are no replay.
    assert!(replayed.iter().all(|id| consumer.replay_of(id).is_some()));
    assert!(dead.iter().all(|id| consumer.replay_of(id).is_none()));
    consumer.close().await;
}
