//! Rows the relay must survive: each is relayed or dead-lettered with a clear error, and the
//! batch around it always completes.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::{broker, db, process, unique};
use rand::Rng;

/// Relays `table` (in the database at `url`) to `exchange` with a fast poll until nothing is
/// pending, waits for `expected` messages at the consumer and stops the relay, which must exit
/// cleanly. `extra` are further `run` arguments.
async fn relay_until_drained(
    url: &str,
    table: &str,
    exchange: &str,
    extra: &[&str],
    consumer: &broker::Consumer,
    expected: u64,
) {
    let mut with_url = vec!["--database-url", url];
    with_url.extend_from_slice(extra);
    let mut relay = process::spawn_relay(exchange, &process::run_args(table, exchange, &with_url));
    let drained = db::wait_until_drained_in(url, &db::table(table), Duration::from_secs(60)).await;
    assert!(drained, "{}", relay.log_text());
    assert_eq!(
        consumer.wait_for(expected, Duration::from_secs(30)).await,
        expected
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_huge_and_non_utf8_binary_payloads_are_relayed_byte_for_byte() {
    let name = unique("bytes");
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!("CREATE TABLE {name} (id uuid PRIMARY KEY, type text, content bytea, occurred_on_utc timestamptz, processed_on_utc timestamptz, error text)"),
    )
    .await;
    let mut huge = vec![0u8; 10 * 1024 * 1024];
    rand::rng().fill(&mut huge[..]);
    let payloads: Vec<Vec<u8>> = vec![
        Vec::new(),
        huge,
        vec![0xff, 0xfe, 0x00, 0xc3, 0x28],
        b"plain".to_vec(),
    ];
    for (i, payload) in payloads.iter().enumerate() {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {name} VALUES (gen_random_uuid(), 'blob', $1, now() + make_interval(secs => $2))"
        )))
        .bind(payload)
        .bind(i as f64)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    relay_until_drained(
        &outbox_tests::database_url(),
        &name,
        &name,
        &[],
        &consumer,
        4,
    )
    .await;
    let errors = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM {name} WHERE error IS NOT NULL"),
    )
    .await;
    assert_eq!(errors, 0);
    let sizes = consumer.received.lock().unwrap().sizes.clone();
    let mut sizes: Vec<usize> = sizes.values().copied().collect();
    sizes.sort();
    assert_eq!(sizes, vec![0, 5, 5, 10 * 1024 * 1024]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_null_is_relayed_and_array_headers_are_dead_lettered() {
    let name = unique("jsonish");
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {name} (id uuid PRIMARY KEY, type text, content jsonb, occurred_on_utc timestamptz, processed_on_utc timestamptz, error text, headers jsonb);
             INSERT INTO {name} VALUES
               (gen_random_uuid(), 'a', 'null'::jsonb, now(), NULL, NULL, NULL),
               (gen_random_uuid(), 'b', '{{}}', now() + interval '1 ms', NULL, NULL, '[1, 2]'),
               (gen_random_uuid(), 'c', '{{}}', now() + interval '2 ms', NULL, NULL, '{{\"tenant\": \"t1\"}}'),
               (gen_random_uuid(), 'd', '\"text\"', now() + interval '3 ms', NULL, NULL, 'null');"
        ),
    )
    .await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    relay_until_drained(
        &outbox_tests::database_url(),
        &name,
        &name,
        &["--headers-column", "headers"],
        &consumer,
        3,
    )
    .await;
    let dead: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT error FROM {name} WHERE type = 'b'"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        dead.contains("headers must be a JSON object, got an array"),
        "{dead}"
    );
    let clean = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {name} WHERE error IS NULL AND processed_on_utc IS NOT NULL"
        ),
    )
    .await;
    assert_eq!(clean, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_text_payload_is_relayed_and_a_bad_type_is_dead_lettered() {
    // Only a SQL_ASCII database stores text that is not UTF-8.
    let database = unique("ascii");
    let mut admin = db::connect().await;
    db::exec(
        &mut admin,
        &format!("CREATE DATABASE {database} ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"),
    )
    .await;
    let url = outbox_tests::database_url_of(&database);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    db::exec(
        &mut conn,
        "CREATE TABLE outbox (id uuid PRIMARY KEY, type text, content text, occurred_on_utc timestamptz, processed_on_utc timestamptz, error text);
         INSERT INTO outbox VALUES
           (gen_random_uuid(), 'ok', convert_from('\\xff41fe'::bytea, 'SQL_ASCII'), now(), NULL, NULL),
           (gen_random_uuid(), convert_from('\\xc328'::bytea, 'SQL_ASCII'), 'x', now() + interval '1 ms', NULL, NULL),
           (gen_random_uuid(), 'ok', '', now() + interval '2 ms', NULL, NULL);",
    )
    .await;
    let exchange = unique("ascii_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    relay_until_drained(&url, "outbox", &exchange, &[], &consumer, 2).await;
    let errors: Vec<String> =
        sqlx::query_scalar("SELECT error FROM outbox WHERE error IS NOT NULL")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("type is not valid UTF-8"), "{errors:?}");
    let mut sizes: Vec<usize> = consumer
        .received
        .lock()
        .unwrap()
        .sizes
        .values()
        .copied()
        .collect();
    sizes.sort();
    assert_eq!(sizes, vec![0, 3]);
    drop(conn);
    consumer.close().await;
    db::exec(
        &mut admin,
        &format!("DROP DATABASE {database} WITH (FORCE)"),
    )
    .await;
}
