//! `--broker-protocol amqp10` against two real AMQP 1.0 brokers that scripts/services.sh
//! starts: RabbitMQ (3.10's AMQP 1.0 plugin, or 4.0's core AMQP 1.0 under the broker matrix,
//! `crate::test_broker`) and ActiveMQ Artemis. Rows reach an AMQP 1.0 consumer exactly once with
//! the message properties the docs promise, at each address format the broker takes, nothing
//! stays pending, and a target the broker does not have is named on /readyz.

use std::time::Duration;

use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::Ident;
use outbox_tests::amqp10::{
    self, ARTEMIS_FULL_PREFIX, ARTEMIS_MODIFIED_URL, ARTEMIS_REFUSED_PREFIX, ARTEMIS_TLS_URL,
    ARTEMIS_URL, PrivateArtemis,
};
use outbox_tests::ports::PRIVATE_ARTEMIS_PORT;
use outbox_tests::test_broker::{self, TestBroker};
use outbox_tests::{broker, db, http, process, proxy, rabbit_cluster, unique, wait};

const ROWS: u64 = 100_000;

/// Where the relay sends and the consumer receives on each broker.
#[derive(Clone, Copy)]
enum Broker {
    RabbitMq,
    Artemis,
}

impl Broker {
    fn url(self) -> &'static str {
        match self {
            Broker::RabbitMq => TestBroker::current().amqp10_url(),
            Broker::Artemis => ARTEMIS_URL,
        }
    }

    /// A fresh queue and the address that reaches it. RabbitMQ sends to an existing queue, at
    /// /amq/queue/NAME on 3.10's plugin and /queues/NAME on 4.0; Artemis creates the queue of
    /// an address on demand.
    async fn queue(self, name: &str) -> String {
        match self {
            Broker::RabbitMq => {
                broker::declare_queue(name).await;
                TestBroker::current().queue_address(name)
            }
            Broker::Artemis => name.to_string(),
        }
    }
}

fn amqp10_args<'a>(table: &'a str, broker: Broker, address: &'a str) -> Vec<&'a str> {
    process::run_args_without_exchange(
        table,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            broker.url(),
            "--address",
            address,
            "--headers-column",
            "headers",
        ],
    )
}

async fn delivers_every_row_once(broker: Broker) {
    let name = unique("amqp10");
    let mut table: OutboxTable = db::table(&name);
    table.columns.headers = Some(Ident::new("headers").unwrap());
    let mut conn = db::seeded_table(&table, ROWS).await;
    let t = table.name.quoted();
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {t} SET headers = '{{\"region\": \"eu\", \"tries\": 7, \"nested\": {{\"a\": [1]}}}}' \
             WHERE id = (SELECT id FROM {t} ORDER BY occurred_on_utc LIMIT 1)"
        ),
    )
    .await;
    let address = broker.queue(&name).await;
    let consumer = amqp10::consume(broker.url(), &address).await;
    let args = amqp10_args(&name, broker, &address);
    let mut relay = process::spawn_relay(&name, &args);

    let drained = db::wait_until_drained(&table, Duration::from_secs(240)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    let arrived = wait::holds(
        "every row reached the AMQP 1.0 consumer",
        Duration::from_secs(60),
        || async { consumer.distinct() as u64 >= ROWS },
    )
    .await;
    assert!(
        arrived,
        "{} of {ROWS} distinct ids arrived",
        consumer.distinct()
    );
    relay.terminate(Duration::from_secs(20)).await;
    // Nothing more may come after the drain: wait a moment for a late duplicate.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.duplicates(), 0, "duplicates without any fault");
    assert_eq!(consumer.total(), ROWS);

    // The message of the row with headers, as the consumer saw it.
    let (id, kind, payload, occurred_ms) =
        sqlx::query_as::<_, (uuid::Uuid, String, String, i64)>(sqlx::AssertSqlSafe(format!(
            "SELECT id, type, content::text, (extract(epoch FROM occurred_on_utc) * 1000)::bigint \
             FROM {t} WHERE headers IS NOT NULL"
        )))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let seen = consumer.seen(&id).expect("the row with headers arrived");
    assert_eq!(seen.subject.as_deref(), Some(kind.as_str()));
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    assert!(seen.durable, "sent durable");
    // AMQP timestamps are whole seconds in the relay's message, as in 0-9-1.
    let created = seen.creation_time_ms.expect("creation-time");
    assert!(
        (created - occurred_ms).abs() < 1000,
        "{created} vs {occurred_ms}"
    );
    let props = &seen.application_properties;
    assert_eq!(props.get("region").map(String::as_str), Some("eu"));
    assert_eq!(props.get("tries").map(String::as_str), Some("7"));
    assert_eq!(props.get("nested").map(String::as_str), Some("{\"a\":[1]}"));
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        body,
        serde_json::from_str::<serde_json::Value>(&payload).unwrap()
    );
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_rabbitmq_over_amqp10_exactly_once() {
    delivers_every_row_once(Broker::RabbitMq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_artemis_over_amqp10_exactly_once() {
    delivers_every_row_once(Broker::Artemis).await;
}

/// Artemis refuses a sender to an address it will not create (amqp:not-found): the relay
/// names the address on /readyz and relays nothing. (RabbitMQ 3.10's plugin accepts a send to
/// a missing /amq/queue/NAME and drops it; the README says so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_the_broker_refuses_is_named_on_readyz() {
    let name = unique("amqp10_missing");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10).await;
    let address = format!("{ARTEMIS_REFUSED_PREFIX}{name}");
    let mut args = amqp10_args(&name, Broker::Artemis, &address);
    args.retain(|a| *a != "--headers-column" && *a != "headers");
    let relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    let named = wait::until(
        "/readyz names the refused address",
        Duration::from_secs(20),
        || async {
            let (code, body) = http::get(&addr, "/readyz").await;
            code == 503 && body.contains(&format!("address {address} does not exist"))
        },
    )
    .await;
    assert!(named.is_ok(), "{}", relay.log_text());
    assert_eq!(db::pending(&mut conn, &table).await, 10);
}

/// `rows` rows sent over AMQP 1.0 to RabbitMQ at `address`, read back by an AMQP 1.0 consumer
/// from `queue`: each arrives once, nothing stays pending. Returns the relay's log.
async fn rabbitmq_delivers_each_row_once(
    name: &str,
    address: &str,
    queue: &str,
    rows: u64,
) -> String {
    let table = db::table(name);
    let _conn = db::seeded_table(&table, rows).await;
    let broker = TestBroker::current();
    let consumer = amqp10::consume(broker.amqp10_url(), queue).await;
    let mut args = amqp10_args(name, Broker::RabbitMq, address);
    args.retain(|a| *a != "--headers-column" && *a != "headers");
    let mut relay = process::spawn_relay(name, &args);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(
        drained,
        "{}: rows sent to {address} still pending:\n{}",
        broker.name(),
        relay.log_text()
    );
    let arrived = wait::holds(
        "every row reached the AMQP 1.0 consumer",
        Duration::from_secs(30),
        || async { consumer.distinct() as u64 >= rows },
    )
    .await;
    assert!(
        arrived,
        "{}: {} of {rows} rows sent to {address} arrived",
        broker.name(),
        consumer.distinct()
    );
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    // A late duplicate has a moment to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.duplicates(), 0, "ids sent to {address} twice");
    assert_eq!(consumer.total(), rows, "messages sent to {address}");
    consumer.stop().await;
    relay.log_text()
}

/// Every address format RabbitMQ takes delivers: an exchange and its routing key in the v1
/// format (`/exchange/NAME/KEY`) on both, and on 4.0 also the v2 ones (`/exchanges/NAME/KEY`),
/// and a queue's v1 address, which 4.0.5 still takes (the deprecated feature `amqp_address_v1`
/// is permitted by default). A queue's own format is `rows_reach_rabbitmq_over_amqp10_…`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_rabbitmq_at_each_address_format_it_takes() {
    let broker = TestBroker::current();
    let mut formats = vec!["v1 exchange"];
    if broker == TestBroker::Rabbitmq4 {
        formats.extend(["v2 exchange", "v1 queue"]);
    }
    for format in formats {
        let name = unique("amqp10_format");
        // A fanout exchange NAME and its queue NAME_q.
        rabbit_cluster::declare(&broker.amqp_url(), &name, Default::default()).await;
        let queue = format!("{name}_q");
        // The address, and what the relay's start line says of it.
        let (address, says) = match format {
            "v1 exchange" => (
                format!("/exchange/{name}/orders.created"),
                format!(
                    "v1 address format, which RabbitMQ 4 deprecates and refuses where amqp_address_v1 is not permitted; for RabbitMQ 4, give --address /exchanges/{name}/orders.created"
                ),
            ),
            "v2 exchange" => (
                format!("/exchanges/{name}/orders.created"),
                "v2 address format, an exchange".to_string(),
            ),
            _ => (
                test_broker::v1_queue_address(&queue),
                format!("give --address /queues/{queue}"),
            ),
        };
        let log =
            rabbitmq_delivers_each_row_once(&name, &address, &broker.queue_address(&queue), 300)
                .await;
        let line = format!("AMQP 1.0 target {address}: ");
        let said: Vec<_> = log.lines().filter(|l| l.contains(&line)).collect();
        assert!(
            said.len() == 1 && said[0].contains(&says) && said[0].contains(" INFO "),
            "{format}: the start line says {says:?} once:\n{log}"
        );
    }
}

/// An address RabbitMQ does not have, as each broker answers it. 4.0 ends the session at the
/// attach with amqp:not-found, for a queue and for an exchange alike: the relay names the
/// address on /readyz (`AddressNotFound`, "create it, or fix --address") and claims nothing.
/// 3.10's plugin attaches a sender to a missing /amq/queue/NAME and drops what it is sent (the
/// README says so): the rows are settled and nothing is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_rabbitmq_does_not_have_is_named_or_dropped_as_the_broker_does() {
    let broker = TestBroker::current();
    let absent = unique("amqp10_absent");
    let addresses = match broker {
        TestBroker::Rabbitmq3 => vec![test_broker::v1_queue_address(&absent)],
        TestBroker::Rabbitmq4 => vec![
            test_broker::v2_queue_address(&absent),
            format!("/exchanges/{absent}/orders.created"),
        ],
    };
    for address in addresses {
        let name = unique("amqp10_missing");
        let table = db::table(&name);
        let mut conn = db::seeded_table(&table, 10).await;
        let mut args = amqp10_args(&name, Broker::RabbitMq, &address);
        args.retain(|a| *a != "--headers-column" && *a != "headers");
        let mut relay = process::spawn_relay(&name, &args);
        let addr = relay.metrics_addr().await;
        match broker {
            TestBroker::Rabbitmq3 => {
                let drained = db::wait_until_drained(&table, Duration::from_secs(30)).await;
                assert!(drained, "{address}:\n{}", relay.log_text());
                let (code, body) = http::get(&addr, "/readyz").await;
                assert_eq!(code, 200, "{address}: {body}");
            }
            TestBroker::Rabbitmq4 => {
                let expected = format!(
                    "not ready (AddressNotFound): address {address} does not exist on the broker"
                );
                let named = wait::holds(
                    "/readyz names the missing address",
                    Duration::from_secs(30),
                    || async {
                        let (code, body) = http::get(&addr, "/readyz").await;
                        code == 503 && body.contains(&expected) && body.contains("--address")
                    },
                )
                .await;
                let (_, body) = http::get(&addr, "/readyz").await;
                assert!(named, "{body}\n{}", relay.log_text());
                assert_eq!(db::pending(&mut conn, &table).await, 10, "{address}");
                assert!(
                    !relay.log_text().contains("cannot reach the broker"),
                    "{address} is no outage:\n{}",
                    relay.log_text()
                );
            }
        }
        assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    }
}

/// A full quorum queue (`x-max-length` 20, `x-overflow: reject-publish`) behind an AMQP 1.0
/// sender: the broker's state, not the messages' fault, so no row spends an attempt or is
/// dead-lettered (`--max-attempts 2`), and once a consumer makes room every row arrives. Each
/// broker says it its own way: RabbitMQ 4.0 answers `rejected` without a reason (where AMQP
/// 0-9-1 nacks), counted as nacks with pauses; 3.10's plugin drops the whole connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_rabbitmq_queue_spends_no_attempt_over_amqp10() {
    use lapin::types::AMQPValue;
    const ROWS: u64 = 200;
    let broker = TestBroker::current();
    let name = unique("amqp10_full");
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    let mut conn = db::seeded_table(&table, ROWS).await;
    let arguments = rabbit_cluster::quorum(&[
        ("x-max-length", AMQPValue::LongLongInt(20)),
        ("x-overflow", AMQPValue::LongString("reject-publish".into())),
    ]);
    rabbit_cluster::declare(&broker.amqp_url(), &name, arguments).await;
    let address = broker.queue_address(&format!("{name}_q"));
    let mut args = amqp10_args(&name, Broker::RabbitMq, &address);
    args.retain(|a| *a != "--headers-column" && *a != "headers");
    args.extend([
        "--attempts-column",
        "attempts",
        "--max-attempts",
        "2",
        "--batch-size",
        "10",
        "--publish-timeout",
        "2s",
    ]);
    let mut relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    // The queue fills; what cannot go stays pending, with no attempt spent.
    let full = wait::holds("the queue is full", Duration::from_secs(30), || async {
        tally(&mut db::connect().await, &table).await.0 >= 20
    })
    .await;
    assert!(full, "{}", relay.log_text());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, dead, pending, attempts) = tally(&mut conn, &table).await;
    assert_eq!(
        (dead, attempts),
        (0, 0),
        "{}: a full queue spent attempts:\n{}",
        broker.name(),
        relay.log_text()
    );
    assert!(pending > 0, "{}", relay.log_text());
    if broker == TestBroker::Rabbitmq4 {
        let (_, text) = http::get(&addr, "/metrics").await;
        let nacks = outbox_tests::metrics::value(
            &text,
            "outbox_relay_publish_failures_total{reason=\"nack\"}",
        );
        assert!(nacks.is_some_and(|n| n > 0.0), "no nack counted:\n{text}");
        assert!(relay.log_text().contains("the broker nacked"));
    }

    let consumer = amqp10::consume(broker.amqp10_url(), &address).await;
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "{}", relay.log_text());
    let arrived = wait::holds("every row arrived", Duration::from_secs(30), || async {
        consumer.distinct() as u64 >= ROWS
    })
    .await;
    assert!(arrived, "{} of {ROWS} arrived", consumer.distinct());
    assert_eq!(tally(&mut conn, &table).await, (ROWS as i64, 0, 0, 0));
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    consumer.stop().await;
}

/// Rows of a table with an attempts column, and how many are settled, pending or carry an
/// error: (published without error, dead-lettered with error, pending, attempts spent).
async fn tally(conn: &mut sqlx::PgConnection, table: &OutboxTable) -> (i64, i64, i64, i64) {
    let t = table.name.quoted();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE processed_on_utc IS NOT NULL AND error IS NULL), \
                count(*) FILTER (WHERE processed_on_utc IS NOT NULL AND error IS NOT NULL), \
                count(*) FILTER (WHERE processed_on_utc IS NULL), \
                coalesce(sum(attempts), 0)::bigint FROM {t}"
    )))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A full Artemis address answers `rejected` (amqp:resource-limit-exceeded) to all but the
/// first message: each rejection spends an attempt, and after max attempts the row is
/// dead-lettered with the broker's words in its error column; the accepted one is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_message_spends_attempts_and_is_dead_lettered() {
    let name = unique("amqp10_rejected");
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    let mut conn = db::seeded_table(&table, 5).await;
    let address = format!("{ARTEMIS_FULL_PREFIX}{name}");
    let mut args = amqp10_args(&name, Broker::Artemis, &address);
    args.retain(|a| *a != "--headers-column" && *a != "headers");
    args.extend([
        "--attempts-column",
        "attempts",
        "--max-attempts",
        "2",
        "--workers",
        "1",
    ]);
    let relay = process::spawn_relay(&name, &args);
    let settled = wait::holds("every row settled", Duration::from_secs(30), || async {
        db::pending(&mut db::connect().await, &table).await == 0
    })
    .await;
    assert!(settled, "{}", relay.log_text());
    let (published, dead, pending, attempts) = tally(&mut conn, &table).await;
    assert_eq!(
        (published, dead, pending),
        (1, 4, 0),
        "{}",
        relay.log_text()
    );
    assert_eq!(attempts, 8, "two rejections for each of the four");
    let error: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT error FROM {} WHERE error IS NOT NULL LIMIT 1",
        table.name.quoted()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        error.contains("rejected by the broker") && error.contains("resource-limit-exceeded"),
        "{error}"
    );
}

/// On the acceptor that answers `modified` for a full address, the messages the broker did
/// not take stay pending with no attempt spent and the relay backs off; once a consumer makes
/// room, every row arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modified_message_stays_pending_without_spending_an_attempt() {
    let name = unique("amqp10_modified");
    let mut table = db::table(&name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    let mut conn = db::seeded_table(&table, 5).await;
    let address = format!("{ARTEMIS_FULL_PREFIX}{name}");
    let args_base = amqp10_args(&name, Broker::Artemis, &address);
    let mut args: Vec<&str> = args_base
        .iter()
        .map(|a| {
            if *a == ARTEMIS_URL {
                ARTEMIS_MODIFIED_URL
            } else {
                a
            }
        })
        .filter(|a| *a != "--headers-column" && *a != "headers")
        .collect();
    args.extend([
        "--attempts-column",
        "attempts",
        "--workers",
        "1",
        "--publish-timeout",
        "2s",
    ]);
    let relay = process::spawn_relay(&name, &args);
    let one = wait::holds(
        "the first row is published",
        Duration::from_secs(30),
        || async { tally(&mut db::connect().await, &table).await.0 == 1 },
    )
    .await;
    assert!(one, "{}", relay.log_text());
    // Several sends later, nothing else is settled and no attempt was spent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        tally(&mut conn, &table).await,
        (1, 0, 4, 0),
        "{}",
        relay.log_text()
    );
    assert!(
        relay.log_text().contains("released"),
        "{}",
        relay.log_text()
    );

    let consumer = amqp10::consume(ARTEMIS_URL, &address).await;
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "{}", relay.log_text());
    assert_eq!(tally(&mut conn, &table).await, (5, 0, 0, 0));
    let arrived = wait::holds("all five arrived", Duration::from_secs(20), || async {
        consumer.distinct() == 5
    })
    .await;
    assert!(arrived, "{} arrived", consumer.distinct());
    consumer.stop().await;
}

/// Waits until the relay's log says its broker connect failed with `cause` (lowercase), then
/// checks that /readyz says the broker is not connected.
async fn refused_connect(relay: &process::RelayProcess, cause: &str) {
    let logged = wait::until(
        &format!("the relay logs a failed broker connect: {cause}"),
        Duration::from_secs(30),
        || async { relay.log_text().to_lowercase().contains(cause) },
    )
    .await;
    assert!(logged.is_ok(), "{}", relay.log_text());
    let addr = http::metrics_addr(&relay.log_text()).expect("metrics address logged");
    let (code, body) = http::get(&addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("broker: not connected"), "{body}");
}

/// amqps:// to Artemis's TLS acceptor, whose certificate a CA of the test's own signed: with
/// that CA trusted (SSL_CERT_FILE) every row arrives, as a user whose password needs
/// percent-encoding in the URL; with the CA not trusted, or a wrong password, nothing is
/// relayed and /readyz says the broker is unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_checks_the_certificate_and_decodes_the_password() {
    const TLS_ROWS: u64 = 2_000;
    let ca = amqp10::artemis_ca();
    assert!(
        ca.exists(),
        "{} is missing: run scripts/services.sh",
        ca.display()
    );
    let ca = ca.to_str().unwrap().to_string();

    // The CA trusted, the right password: every row, exactly once.
    let name = unique("amqps");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, TLS_ROWS).await;
    let consumer = amqp10::consume(ARTEMIS_URL, &name).await;
    let args = process::run_args_without_exchange(
        &name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            ARTEMIS_TLS_URL,
            "--address",
            &name,
        ],
    );
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("SSL_CERT_FILE", &ca)]);
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    let arrived = wait::holds(
        "every row reached the consumer through TLS",
        Duration::from_secs(30),
        || async { consumer.distinct() as u64 >= TLS_ROWS },
    )
    .await;
    assert!(arrived, "{} of {TLS_ROWS} arrived", consumer.distinct());
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    consumer.stop().await;
    let log = relay.log_text();
    assert!(
        !log.contains("k3y/With+Base64="),
        "password in the log:\n{log}"
    );

    // The CA not trusted (the system's store only): the handshake fails, nothing is relayed.
    let untrusted = unique("amqps_untrusted");
    let table = db::table(&untrusted);
    let mut conn2 = db::seeded_table(&table, 10).await;
    let args = process::run_args_without_exchange(
        &untrusted,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            ARTEMIS_TLS_URL,
            "--address",
            &untrusted,
        ],
    );
    let empty = std::env::temp_dir().join(format!("{untrusted}-no-ca.pem"));
    std::fs::write(&empty, "").unwrap();
    let mut relay = process::spawn_relay_with_env(
        &untrusted,
        &args,
        &[("SSL_CERT_FILE", empty.to_str().unwrap())],
    );
    refused_connect(&relay, "certificate").await;
    assert_eq!(db::pending(&mut conn2, &table).await, 10);
    relay.terminate(Duration::from_secs(20)).await;

    // A wrong password over TLS is refused: SASL really carries the password (no anonymous
    // fallback makes the first case pass).
    let wrong = unique("amqps_wrong");
    let table = db::table(&wrong);
    let mut conn3 = db::seeded_table(&table, 10).await;
    let wrong_url = ARTEMIS_TLS_URL.replace("k3y%2FWith", "k3y%2FWrong");
    let args = process::run_args_without_exchange(
        &wrong,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            &wrong_url,
            "--address",
            &wrong,
        ],
    );
    let mut relay = process::spawn_relay_with_env(&wrong, &args, &[("SSL_CERT_FILE", &ca)]);
    refused_connect(&relay, "sasl").await;
    assert_eq!(db::pending(&mut conn3, &table).await, 10);
    relay.terminate(Duration::from_secs(20)).await;
    let _ = std::fs::remove_file(empty);
}

/// Faults over AMQP 1.0, on Artemis through a proxy: the link cut three times mid-run (as a
/// broker restart or a dropped connection does; the relay must say so at once, not at the
/// publish timeout), then the relay killed with SIGKILL and
/// started again. At every cut, every row marked is one the consumer got (nothing is settled
/// without its `accepted`); at the end nothing is lost or pending, and the duplicates stay
/// within one batch per worker per fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_links_and_kill_9_lose_nothing_over_amqp10() {
    // Enough that the three cuts (each followed by 0.7 s of relaying) end well before the
    // table does.
    const FAULT_ROWS: u64 = 150_000;
    let (batch, workers, faults) = (200u64, 2u64, 4u64);
    let name = unique("amqp10_faults");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, FAULT_ROWS).await;
    // The pending-row index, as users run it: without it every claim sorts the whole table,
    // and on a slow machine under the parallel suite 150,000 rows did not drain in time.
    outbox_relay::table::migrate::migrate(
        &mut conn,
        &table,
        &outbox_relay::table::migrate::MigrationOptions::default(),
    )
    .await
    .expect("migrate");
    let consumer = amqp10::consume(ARTEMIS_URL, &name).await;
    let (url, switch) = proxy::start_for_url(ARTEMIS_URL).await.unwrap();
    let args = process::run_args_without_exchange(
        &name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            &url,
            "--address",
            &name,
            "--batch-size",
            "200",
            "--workers",
            "2",
            // Far above the 10 s the test gives the relay to notice a cut.
            "--publish-timeout",
            "30s",
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let started = wait::holds("5,000 rows arrived", Duration::from_secs(60), || async {
        consumer.distinct() >= 5_000
    })
    .await;
    assert!(started, "{}", relay.log_text());
    for _ in 0..3 {
        // Held while the consumer catches up: it takes one message at a time and falls behind
        // a relay that reconnects at once, and lag is not loss. The relay's reconnects wait.
        let said_before = relay.log_text().matches("broker connection").count();
        switch.stall();
        switch.cut();
        let said = wait::holds(
            "the relay says the connection broke",
            Duration::from_secs(10),
            || async { relay.log_text().matches("broker connection").count() > said_before },
        )
        .await;
        assert!(
            said,
            "a cut not noticed within 10 s (publish timeout 30 s):\n{}",
            relay.log_text()
        );
        let marked = db::processed_ids(&mut conn, &table).await;
        let settled = wait::holds(
            "every marked row reached the consumer",
            Duration::from_secs(60),
            || async { marked.iter().all(|id| consumer.has(id)) },
        )
        .await;
        let missing = marked.iter().filter(|id| !consumer.has(id)).count();
        assert!(
            settled,
            "{missing} of {} rows marked without reaching the broker",
            marked.len()
        );
        switch.resume();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    relay.kill9().await;
    assert!(
        db::pending(&mut conn, &table).await > 0,
        "the relay finished before it could be killed"
    );
    let mut restarted = process::spawn_relay(&name, &args);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "{}",
        restarted.log_text()
    );
    let arrived = wait::holds(
        "every row reached the consumer",
        Duration::from_secs(30),
        || async { consumer.distinct() as u64 >= FAULT_ROWS },
    )
    .await;
    assert!(arrived, "{} of {FAULT_ROWS} arrived", consumer.distinct());
    assert_eq!(restarted.terminate(Duration::from_secs(30)).await, Some(0));
    let ids = db::all_ids(&mut conn, &table).await;
    assert_eq!(
        ids.iter().filter(|id| !consumer.has(id)).count(),
        0,
        "ids lost"
    );
    let extra = consumer.total() - FAULT_ROWS;
    assert!(
        extra <= batch * workers * faults,
        "{extra} duplicates; at most one batch per worker per fault ({})",
        batch * workers * faults
    );
    consumer.stop().await;
}

fn artemis_args<'a>(name: &'a str, url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--broker-protocol",
        "amqp10",
        "--broker-url",
        url,
        "--address",
        name,
    ];
    args.extend_from_slice(extra);
    process::run_args_without_exchange(name, &args)
}

/// SIGTERM mid-run over AMQP 1.0: the process finishes its batches and exits 0, and a
/// restart adds no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_over_amqp10_exits_zero_without_duplicates() {
    const TERM_ROWS: u64 = 40_000;
    let name = unique("amqp10_term");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, TERM_ROWS).await;
    let consumer = amqp10::consume(ARTEMIS_URL, &name).await;
    let args = artemis_args(&name, ARTEMIS_URL, &["--workers", "4"]);
    let mut relay = process::spawn_relay(&name, &args);
    let started = wait::holds("5,000 rows arrived", Duration::from_secs(60), || async {
        consumer.distinct() >= 5_000
    })
    .await;
    assert!(started, "{}", relay.log_text());
    assert_eq!(
        relay.terminate(Duration::from_secs(30)).await,
        Some(0),
        "{}",
        relay.log_text()
    );
    assert!(
        db::pending(&mut conn, &table).await > 0,
        "the relay finished before SIGTERM arrived"
    );
    assert!(relay.log_text().contains("all batches settled"));
    let mut second = process::spawn_relay(&name, &args);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "{}",
        second.log_text()
    );
    let all = wait::holds("every row arrived", Duration::from_secs(30), || async {
        consumer.distinct() as u64 >= TERM_ROWS
    })
    .await;
    assert!(all, "{} of {TERM_ROWS}", consumer.distinct());
    assert_eq!(second.terminate(Duration::from_secs(30)).await, Some(0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.total(), TERM_ROWS, "SIGTERM produced duplicates");
    consumer.stop().await;
}

/// The broker itself crashes mid-run (SIGKILL of a private Artemis the test owns) and comes
/// back: the relay waits, reconnects and finishes; every row is on the broker afterwards
/// (received before the crash, or there for a consumer after it), none pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_crash_mid_run_loses_nothing_over_amqp10() {
    const CRASH_ROWS: u64 = 40_000;
    let broker =
        tokio::task::spawn_blocking(|| PrivateArtemis::start("restart", PRIVATE_ARTEMIS_PORT))
            .await
            .unwrap();
    let url = broker.url();
    let name = unique("amqp10_crash");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, CRASH_ROWS).await;
    let before = amqp10::consume(&url, &name).await;
    let args = artemis_args(
        &name,
        &url,
        &["--batch-size", "200", "--publish-timeout", "3s"],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let started = wait::holds("5,000 rows arrived", Duration::from_secs(60), || async {
        before.distinct() >= 5_000
    })
    .await;
    assert!(started, "{}", relay.log_text());
    let broker = tokio::task::spawn_blocking(move || {
        broker.crash();
        broker
    })
    .await
    .unwrap();
    let received_before: Vec<uuid::Uuid> = {
        let seen = before.received.lock().unwrap();
        seen.counts.keys().copied().collect()
    };
    assert!(
        db::pending(&mut conn, &table).await > 0,
        "the relay finished before the broker crashed"
    );
    // Down for a few seconds: the relay backs off and marks nothing meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let broker = tokio::task::spawn_blocking(move || {
        broker.up();
        broker
    })
    .await
    .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    let after = amqp10::consume(&url, &name).await;
    let ids = db::all_ids(&mut conn, &table).await;
    let received_before: std::collections::HashSet<uuid::Uuid> =
        received_before.into_iter().collect();
    let complete = wait::holds(
        "every row was received before the crash or is on the broker",
        Duration::from_secs(60),
        || async {
            ids.iter()
                .all(|id| received_before.contains(id) || after.has(id))
        },
    )
    .await;
    let missing = ids
        .iter()
        .filter(|id| !received_before.contains(id) && !after.has(id))
        .count();
    assert!(complete, "{missing} rows lost across the broker crash");
    assert!(
        relay.log_text().contains("reconnected to the broker"),
        "{}",
        relay.log_text()
    );
    after.stop().await;
    drop(before);
    drop(broker);
}

/// A broker that stops answering cannot hold a close: fe2o3-amqp waits for the broker's detach,
/// end and close replies without a limit, so the publisher bounds each step (the bench once
/// hung there, its session task spinning). Replies are stalled at a proxy; the close returns
/// within its three bounded steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_against_a_broker_that_stopped_answering_returns() {
    use outbox_relay::broker::Publisher;
    use outbox_relay::broker::amqp10::{Amqp10Publisher, Amqp10Settings, CLOSE_STEP};
    use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};

    let name = unique("amqp10_close");
    let (url, switch) = proxy::start_for_url(ARTEMIS_URL).await.unwrap();
    let settings = Amqp10Settings {
        address: name.clone(),
        timeout: Duration::from_secs(5),
        content_type: "application/json".into(),
        container_id: name.clone(),
        tls: Default::default(),
        password_file: None,
        cloudevents: None,
    };
    let url = SecretUrl::parse(&url, UrlKind::Amqp).unwrap();
    let publisher = Amqp10Publisher::connect(&url, settings).await.unwrap();
    assert!(publisher.is_connected());
    switch.stall_replies();
    let started = std::time::Instant::now();
    let closed =
        tokio::time::timeout(CLOSE_STEP * 3 + Duration::from_secs(5), publisher.close()).await;
    assert!(
        closed.is_ok(),
        "close still waiting after {:?}",
        started.elapsed()
    );
    switch.resume();
}
