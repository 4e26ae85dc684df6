//! The relay against RabbitMQ 4.0 (Debian 13's, `scripts/services.sh rabbitmq4`), beside the
//! tests' 3.10: AMQP 0-9-1 with publisher confirms (and inside TLS, logged in by the test client
//! certificate), and AMQP 1.0 (core in 4.x) to a queue named
//! by RabbitMQ 4's v2 address format (`/queues/NAME`) and by 3.10's v1 one (`/amq/queue/NAME`).

use std::time::Duration;

use lapin::ExchangeKind;
use lapin::types::FieldTable;
use outbox_tests::rabbitmq4::{self, AMQP_URL, AMQP10_URL, AMQPS_EXTERNAL_URL};
use outbox_tests::{amqp10, broker, db, http, process, rabbit_cluster, tls, unique, wait};

const ROWS: u64 = 3_000;

/// Every row reaches a queue on RabbitMQ 4 over AMQP 0-9-1, with publisher confirms, each id
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_rabbitmq4_over_amqp091_with_confirms_each_id_once() {
    rabbitmq4::up().await;
    let name = unique("r4");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    let consumer = broker::consume_at(
        AMQP_URL,
        &name,
        ExchangeKind::Fanout,
        "",
        FieldTable::default(),
    )
    .await;
    let args = process::run_args(
        &name,
        &name,
        &["--workers", "2", "--publisher-confirms", "true"],
    );
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("AMQP_URL", AMQP_URL)]);
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.assert_each_id_once(&mut conn, &table, ROWS).await;
    consumer.close().await;
}

/// The same over AMQPS with the test CA, logged in by client certificate (EXTERNAL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_rabbitmq4_over_amqps_with_certificate_login_each_id_once() {
    rabbitmq4::up().await;
    let name = unique("r4_amqps");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    let consumer = broker::consume_at(
        AMQP_URL,
        &name,
        ExchangeKind::Fanout,
        "",
        FieldTable::default(),
    )
    .await;
    let (ca, cert, key) = (
        tls::file("ca.pem"),
        tls::file("client.pem"),
        tls::file("client.key"),
    );
    let mut relay = process::spawn_relay_with_env(
        &name,
        &process::run_args(&name, &name, &["--workers", "2"]),
        &[
            ("AMQP_URL", AMQPS_EXTERNAL_URL),
            ("BROKER_CA_FILE", &ca),
            ("BROKER_CLIENT_CERT", &cert),
            ("BROKER_CLIENT_KEY", &key),
        ],
    );
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.assert_each_id_once(&mut conn, &table, ROWS).await;
    consumer.close().await;
}

/// `rows` rows of a fresh table sent over AMQP 1.0 to `address` (a name for the queue
/// `NAME_q`, which is declared first), read back from `/queues/NAME_q`: each arrives once.
async fn amqp10_delivers_each_row_once(rows: u64, address: impl Fn(&str) -> String) {
    rabbitmq4::up().await;
    let name = unique("r4_amqp10");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, rows).await;
    rabbit_cluster::declare(AMQP_URL, &name, FieldTable::default()).await;
    let queue = format!("{name}_q");
    let consumer = amqp10::consume(AMQP10_URL, &format!("/queues/{queue}")).await;
    let address = address(&queue);
    let args = process::run_args_without_exchange(
        &name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            AMQP10_URL,
            "--address",
            &address,
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(
        drained,
        "rows sent to {address} still pending:\n{}",
        relay.log_text()
    );
    let arrived = wait::holds(
        "every row reached the AMQP 1.0 consumer",
        Duration::from_secs(30),
        || async { consumer.distinct() as u64 >= rows },
    )
    .await;
    assert!(arrived, "{} of {rows} ids arrived", consumer.distinct());
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    // A late duplicate has a moment to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.duplicates(), 0, "ids that arrived twice");
    assert_eq!(consumer.total(), rows);
    consumer.stop().await;
}

/// AMQP 1.0 to RabbitMQ 4's v2 address of a queue, `/queues/NAME`: each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_rabbitmq4_over_amqp10_at_a_v2_address_each_once() {
    amqp10_delivers_each_row_once(ROWS, |queue| format!("/queues/{queue}")).await;
}

/// 3.10's address of the same queue, `/amq/queue/NAME` (v1), still reaches it on 4.0.5: the
/// v1 format is a deprecated feature (`amqp_address_v1`) permitted by default. With
/// `deprecated_features.permit.amqp_address_v1 = false` the broker ends the session at the
/// attach with `amqp:invalid-field` "Attach rejected: {amqp_address_v1_not_permitted, ...}",
/// which the relay reports as a setting to fix, naming the v2 format (issue 56, point 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_address_still_reaches_rabbitmq4_by_default() {
    amqp10_delivers_each_row_once(300, |queue| format!("/amq/queue/{queue}")).await;
}

/// A v2 address of a queue RabbitMQ 4 does not have: the broker ends the session at the attach
/// with amqp:not-found, and the relay says the address is missing (`AddressNotFound` on
/// `/readyz`), not that the broker is unreachable; nothing is claimed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_on_rabbitmq4_is_named_as_a_missing_address() {
    rabbitmq4::up().await;
    let name = unique("r4_missing");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10).await;
    let address = format!("/queues/{name}_absent");
    let args = process::run_args_without_exchange(
        &name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            AMQP10_URL,
            "--address",
            &address,
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    let named = wait::holds(
        "/readyz names the missing address",
        Duration::from_secs(30),
        || {
            let addr = addr.clone();
            async move {
                let (code, body) = http::get(&addr, "/readyz").await;
                code == 503 && body.contains("not ready (AddressNotFound):")
            }
        },
    )
    .await;
    let (_, body) = http::get(&addr, "/readyz").await;
    assert!(named, "{body}\n{}", relay.log_text());
    assert!(body.contains(&address), "{body}");
    assert_eq!(db::pending(&mut conn, &table).await, 10);
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
}
