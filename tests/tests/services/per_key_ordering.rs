//! `--ordering per-key`: the rows of one partition key reach the broker in claim order, one at
//! a time, while different keys flow in parallel, across workers and processes that come, go
//! and are killed; a message the broker refuses holds back only its own key; a row that commits
//! late is delivered when it becomes visible, behind the rows of its key already relayed.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::Ident;
use outbox_tests::ordering::{check, expected_order};
use outbox_tests::{broker, db, http, metrics, process, unique, wait};

pub(crate) const KEY: &str = "aggregate_id";

/// A table with an attempts and a partition-key column, and `rows` rows over `keys` keys. The
/// claim positions tie in threes, so the id decides between them.
pub(crate) async fn keyed_table(
    name: &str,
    rows: u64,
    keys: u64,
) -> (OutboxTable, sqlx::PgConnection) {
    let mut table = db::table(name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    table.columns.partition_key = Some(Ident::new(KEY).unwrap());
    let mut conn = db::seeded_table(&table, 0).await;
    let t = table.name.quoted();
    db::exec(
        &mut conn,
        &format!(
            "INSERT INTO {t} (id, type, content, occurred_on_utc, {KEY})
             SELECT gen_random_uuid(), 'good', jsonb_build_object('n', g),
                    now() - interval '1 hour' + (g / 3) * interval '1 ms', 'order-' || (g % {keys})
               FROM generate_series(1, {rows}) g"
        ),
    )
    .await;
    (table, conn)
}

pub(crate) fn ordered_args<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
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
        "--shutdown-grace",
        "10s",
    ];
    args.extend_from_slice(extra);
    process::run_args(name, name, &args)
}

/// Inserts `rows` rows over `keys` keys in chunks of `chunk`, one transaction each, pausing
/// between chunks, as a service writing steadily would: the relay's processes come and go
/// while rows still arrive. Claim positions come from clock_timestamp(), so they rise.
fn write_steadily(
    table: &OutboxTable,
    rows: u64,
    keys: u64,
    chunk: u64,
) -> tokio::task::JoinHandle<()> {
    let t = table.name.quoted();
    tokio::spawn(async move {
        let mut conn = db::connect().await;
        for start in (0..rows).step_by(chunk as usize) {
            db::exec(
                &mut conn,
                &format!(
                    "INSERT INTO {t} (id, type, content, occurred_on_utc, {KEY})
                     SELECT gen_random_uuid(), 'good', jsonb_build_object('n', g),
                            clock_timestamp(), 'order-' || (g % {keys})
                       FROM generate_series({start}, {end}) g",
                    end = (start + chunk).min(rows) - 1
                ),
            )
            .await;
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    })
}

/// 200,000 rows over 1,000 keys, written steadily, while the relay scales from one process to
/// three (two workers each), one is killed with SIGKILL and replaced, every process is
/// replaced by a rolling SIGTERM, and it scales back to one: no key out of order in first
/// deliveries, nothing lost or pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_stay_in_order_while_processes_scale_die_and_roll() {
    const ROWS: u64 = 200_000;
    let name = unique("per_key");
    let (table, mut conn) = keyed_table(&name, 0, 1).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let args = ordered_args(&name, &[]);
    let writer = write_steadily(&table, ROWS, 1_000, 2_000);
    let arrived = |n: u64| {
        let consumer = &consumer;
        async move {
            let reached = wait::holds(
                &format!("{n} messages arrived"),
                Duration::from_secs(120),
                || async { consumer.total() >= n },
            )
            .await;
            assert!(reached, "{} arrived", consumer.total());
        }
    };
    let mut relays = vec![process::spawn_relay(&name, &args)];
    arrived(20_000).await;
    // 1 → 3 processes.
    relays.push(process::spawn_relay(&name, &args));
    relays.push(process::spawn_relay(&name, &args));
    arrived(60_000).await;
    // One dies without a word and is replaced.
    relays[1].kill9().await;
    relays[1] = process::spawn_relay(&name, &args);
    arrived(90_000).await;
    // A rolling restart: each process replaced by a new one, then stopped with SIGTERM.
    for relay in relays.iter_mut() {
        let fresh = process::spawn_relay(&name, &args);
        let mut old = std::mem::replace(relay, fresh);
        assert_eq!(
            old.terminate(Duration::from_secs(20)).await,
            Some(0),
            "{}",
            old.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    arrived(140_000).await;
    // 3 → 1.
    for mut relay in relays.drain(1..) {
        assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    }
    let written = consumer.total();
    writer.await.unwrap();
    assert!(
        written < ROWS,
        "the writer finished before the last scale-down: the faults did not happen mid-run"
    );
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(180)).await,
        "{} pending:\n{}",
        db::pending(&mut conn, &table).await,
        relays[0].log_text()
    );
    let log = relays[0].log_text();
    assert_eq!(relays[0].terminate(Duration::from_secs(20)).await, Some(0));
    assert!(log.contains("lanes rebalanced"), "{log}");

    let expected = expected_order(&mut conn, &table, KEY).await;
    let all = wait::holds("every row arrived", Duration::from_secs(30), || async {
        consumer.distinct() as u64 >= ROWS
    })
    .await;
    assert!(all, "{} of {ROWS} arrived", consumer.distinct());
    let report = check(&consumer.arrivals(), &expected);
    report.assert_in_order(ROWS);
    // The SIGKILL may repeat what its workers had confirmed but not committed.
    assert!(report.repeats <= 2 * 200, "{} repeats", report.repeats);
    consumer.close().await;
}

/// A message the broker refuses (unroutable with --mandatory) on one key: that key's later
/// rows wait until it is dead-lettered, while every other key drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_holds_back_only_its_key_until_it_is_dead_lettered() {
    let name = unique("per_key_poison");
    let (table, mut conn) = keyed_table(&name, 2_000, 50).await;
    let t = table.name.quoted();
    // The 5th row of key order-7 cannot be routed.
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {t} SET type = 'nowhere' WHERE id = (SELECT id FROM {t} WHERE {KEY} = 'order-7' \
             ORDER BY occurred_on_utc, id OFFSET 4 LIMIT 1)"
        ),
    )
    .await;
    let consumer = broker::consume(&name, ExchangeKind::Direct, "good").await;
    let args = ordered_args(&name, &["--mandatory", "true", "--max-attempts", "4"]);
    let mut relay = process::spawn_relay(&name, &args);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));

    // The refused row was tried max-attempts times and given up on.
    let dead: (i32, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT attempts, error FROM {t} WHERE type = 'nowhere'"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(dead.0, 4, "{dead:?}");
    assert!(
        dead.1.as_deref().is_some_and(|e| e.contains("unroutable")),
        "{dead:?}"
    );
    // Of its key, every earlier row was settled before it and every later one after it: the
    // later rows were not even sent while it was pending. (A row's processed-at is its
    // batch's start; a later batch starts after an earlier one committed.)
    let (before_ok, after_ok): (bool, bool) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH k AS (SELECT id, type, processed_on_utc AS at,
                           row_number() OVER (ORDER BY occurred_on_utc, id) AS n
                      FROM {t} WHERE {KEY} = 'order-7'),
              poison AS (SELECT n, at FROM k WHERE type = 'nowhere')
         SELECT bool_and(k.at < poison.at) FILTER (WHERE k.n < poison.n),
                bool_and(k.at > poison.at) FILTER (WHERE k.n > poison.n)
           FROM k, poison"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(before_ok && after_ok, "order-7 settled out of order");
    // Every other row arrived, each key in order, order-7 without its refused row.
    let expected = expected_order(&mut conn, &table, KEY).await;
    let arrived = wait::holds("1,999 rows arrived", Duration::from_secs(30), || async {
        consumer.distinct() >= 1_999
    })
    .await;
    assert!(arrived, "{} arrived", consumer.distinct());
    let mut without_poison = expected.clone();
    let poison_id: uuid::Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {t} WHERE type = 'nowhere'"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let (_, poison_place) = without_poison.remove(&poison_id).unwrap();
    for (key, place) in without_poison.values_mut() {
        if key == "order-7" && *place > poison_place {
            *place -= 1;
        }
    }
    let report = check(&consumer.arrivals(), &without_poison);
    assert!(
        report.keys_out_of_order.is_empty(),
        "{:?}",
        report.keys_out_of_order
    );
    assert_eq!(report.first_deliveries, 1_999);
    consumer.close().await;
}

/// While a key waits behind a refused message the relay counts it as blocked, with how long;
/// every other key drains meanwhile. Once the message can go (here its routing is fixed) the
/// key resumes in order and the gauges fall back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_is_counted_until_its_message_goes_through() {
    let name = unique("per_key_blocked");
    let (table, mut conn) = keyed_table(&name, 1_000, 20).await;
    let t = table.name.quoted();
    // The 3rd row of key order-7 cannot be routed; 1000 attempts outlast the test.
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {t} SET type = 'nowhere' WHERE id = (SELECT id FROM {t} WHERE {KEY} = 'order-7' \
             ORDER BY occurred_on_utc, id OFFSET 2 LIMIT 1)"
        ),
    )
    .await;
    let expected = expected_order(&mut conn, &table, KEY).await;
    let consumer = broker::consume(&name, ExchangeKind::Direct, "good").await;
    let args = ordered_args(&name, &["--mandatory", "true", "--max-attempts", "1000"]);
    let started = std::time::Instant::now();
    let mut relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    let gauges = || async {
        let (_, text) = http::get(&addr, "/metrics").await;
        (
            metrics::value(&text, "outbox_relay_blocked_keys"),
            metrics::value(&text, "outbox_relay_blocked_key_oldest_age_seconds"),
        )
    };

    // Only order-7 from its refused row on stays pending (50 rows a key, 2 settled before it).
    let held_back = wait::until(
        "every other key drained",
        Duration::from_secs(60),
        || async { db::pending(&mut db::connect().await, &table).await == 48 },
    )
    .await;
    assert!(held_back.is_ok(), "{}", relay.log_text());
    let counted = wait::until(
        "one key blocked for over a second",
        Duration::from_secs(20),
        || async {
            matches!(gauges().await, (Some(count), Some(age)) if count == 1.0 && age > 1.0)
        },
    )
    .await;
    assert!(counted.is_ok(), "{:?}", gauges().await);
    let attempts = db::scalar_i64(
        &mut conn,
        &format!("SELECT attempts::int8 FROM {t} WHERE type = 'nowhere'"),
    )
    .await;
    // Retried while blocked, but at the poll interval (the tests' 50 ms), not in a busy loop: at
    // most one attempt per interval since the start, plus one per batch while other keys of its
    // lanes still flowed (1,000 rows in batches of 200). A busy loop makes hundreds a second.
    let bound = started.elapsed().as_millis() as i64 / 50 + 10;
    assert!(
        (2..=bound).contains(&attempts),
        "{attempts} attempts in {:?}",
        started.elapsed()
    );

    db::exec(
        &mut conn,
        &format!("UPDATE {t} SET type = 'good' WHERE type = 'nowhere'"),
    )
    .await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let released = wait::until("the gauges fall to 0", Duration::from_secs(10), || async {
        gauges().await == (Some(0.0), Some(0.0))
    })
    .await;
    assert!(released.is_ok(), "{:?}", gauges().await);
    let arrived = wait::holds("1,000 rows arrived", Duration::from_secs(30), || async {
        consumer.distinct() >= 1_000
    })
    .await;
    assert!(arrived, "{} arrived", consumer.distinct());
    let report = check(&consumer.arrivals(), &expected);
    assert!(
        report.keys_out_of_order.is_empty(),
        "{:?}",
        report.keys_out_of_order
    );
    assert_eq!(report.first_deliveries, 1_000);
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    consumer.close().await;
}

/// A transaction inserts an earlier row of a key (an older occurred-at) and commits only after
/// later rows of that key were inserted, committed and relayed. What per-key ordering promises
/// for it, as the README says: nothing is lost, and the late row is delivered once it is
/// visible, after the rows of its key that were already relayed (claim order can only order
/// rows that can be seen); rows of the key still pending then wait behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_is_delivered_after_the_rows_already_relayed() {
    let name = unique("per_key_late");
    let (table, mut conn) = keyed_table(&name, 0, 1).await;
    let t = table.name.quoted();
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let insert = |id: uuid::Uuid, minutes_ago: i32| {
        format!(
            "INSERT INTO {t} (id, type, content, occurred_on_utc, {KEY}) \
             VALUES ('{id}', 'good', '{{}}', now() - interval '{minutes_ago} minutes', 'late-key')"
        )
    };
    let (late, first, second) = (
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
    );
    let mut writer = db::connect().await;
    db::exec(&mut writer, "BEGIN").await;
    db::exec(&mut writer, &insert(late, 60)).await;
    db::exec(&mut conn, &insert(first, 30)).await;
    db::exec(&mut conn, &insert(second, 20)).await;
    let mut relay = process::spawn_relay(&name, &ordered_args(&name, &[]));
    let relayed = wait::holds(
        "the committed rows arrived",
        Duration::from_secs(30),
        || async { consumer.has(&first) && consumer.has(&second) },
    )
    .await;
    assert!(relayed, "{}", relay.log_text());
    assert!(!consumer.has(&late), "an uncommitted row was relayed");
    db::exec(&mut writer, "COMMIT").await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let all = wait::holds("the late row arrived", Duration::from_secs(10), || async {
        consumer.has(&late)
    })
    .await;
    assert!(all);
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    assert_eq!(consumer.arrivals(), vec![first, second, late]);
    consumer.close().await;
}
