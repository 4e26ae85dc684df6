//! Issue 48: the W3C trace context the producing service wrote reaches the consumer, and
//! CloudEvents binary mode is what a real CloudEvents SDK decodes.
//!
//! - A producer writes `traceparent` and `tracestate` columns: a consumer on RabbitMQ sees the
//!   same headers on every message; one carried in the headers column goes on the same way; a
//!   malformed one is delivered without the header and counted.
//! - `--cloudevents binary`: the Python SDK's RabbitMQ binding (AMQP 0-9-1, pika) and its AMQP
//!   binding (AMQP 1.0, from Artemis and from RabbitMQ) decode the attributes, the payload byte
//!   for byte. RabbitMQ is 3.10, or 4.0 under the broker matrix (`outbox_tests::test_broker`).
//! - Binary mode without a source stops at start, naming the setting.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::Ident;
use outbox_tests::amqp10::{self, ARTEMIS_URL};
use outbox_tests::cloudevents::{self, Amqp10Message};
use outbox_tests::test_broker::TestBroker;
use outbox_tests::{broker, db, http, metrics, process, unique, wait};
use sqlx::PgConnection;
use uuid::Uuid;

const ROWS: u64 = 300;
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
/// A valid traceparent the headers column carries instead of the columns.
const IN_HEADERS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

pub(crate) fn trace_table(name: &str) -> OutboxTable {
    let mut table = db::table(name);
    table.columns.traceparent = Some(Ident::new("traceparent").unwrap());
    table.columns.tracestate = Some(Ident::new("tracestate").unwrap());
    table
}

/// Gives every row a traceparent of its own (trace-id from its id) and the tracestate.
pub(crate) async fn write_trace_context(conn: &mut PgConnection, table: &OutboxTable) {
    let t = table.name.quoted();
    db::exec(
        conn,
        &format!(
            "UPDATE {t} SET traceparent = '00-' || replace(id::text, '-', '') || '-' \
             || substr(md5(id::text), 1, 15) || '1-01', tracestate = '{TRACESTATE}'"
        ),
    )
    .await;
}

/// Every row's id and traceparent.
pub(crate) async fn traceparents(
    conn: &mut PgConnection,
    table: &OutboxTable,
) -> HashMap<Uuid, String> {
    sqlx::query_as::<_, (Uuid, Option<String>)>(sqlx::AssertSqlSafe(format!(
        "SELECT id, traceparent FROM {}",
        table.name.quoted()
    )))
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .filter_map(|(id, traceparent)| Some((id, traceparent?)))
    .collect()
}

/// The id of the `n`-th row in claim order.
async fn nth_row(conn: &mut PgConnection, table: &OutboxTable, n: i64) -> Uuid {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {} ORDER BY occurred_on_utc, id OFFSET {n} LIMIT 1",
        table.name.quoted()
    )))
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_reaches_the_consumer_and_a_malformed_one_is_counted() {
    let name = unique("trace");
    let mut table = trace_table(&name);
    table.columns.headers = Some(Ident::new("headers").unwrap());
    let mut conn = db::seeded_table(&table, ROWS).await;
    write_trace_context(&mut conn, &table).await;
    let t = table.name.quoted();
    // Four rows that say something else: a malformed traceparent column, an uppercase one
    // (W3C allows lowercase only), a valid traceparent in the headers column only, and a
    // malformed one there.
    let [bad_column, uppercase, good_header, bad_header] = [
        nth_row(&mut conn, &table, 10).await,
        nth_row(&mut conn, &table, 11).await,
        nth_row(&mut conn, &table, 12).await,
        nth_row(&mut conn, &table, 13).await,
    ];
    db::exec(
        &mut conn,
        &format!("UPDATE {t} SET traceparent = '00-not-a-trace' WHERE id = '{bad_column}'"),
    )
    .await;
    db::exec(
        &mut conn,
        &format!("UPDATE {t} SET traceparent = upper(traceparent) WHERE id = '{uppercase}'"),
    )
    .await;
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {t} SET traceparent = NULL, tracestate = NULL, \
             headers = '{{\"tenant\": \"eu\", \"traceparent\": \"{IN_HEADERS}\"}}' \
             WHERE id = '{good_header}'"
        ),
    )
    .await;
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {t} SET traceparent = NULL, tracestate = NULL, \
             headers = '{{\"tenant\": \"us\", \"traceparent\": \"00-00000000000000000000000000000000-b7ad6b7169203331-01\"}}' \
             WHERE id = '{bad_header}'"
        ),
    )
    .await;
    let expected = traceparents(&mut conn, &table).await;

    let exchange = unique("trace_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &exchange,
        &[
            "--traceparent-column",
            "traceparent",
            "--tracestate-column",
            "tracestate",
            "--headers-column",
            "headers",
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    consumer.assert_each_id_once(&mut conn, &table, ROWS).await;

    // Every row with a valid traceparent column: the same traceparent and tracestate.
    let mut checked = 0;
    for (id, traceparent) in &expected {
        if [bad_column, uppercase].contains(id) {
            continue;
        }
        let headers = consumer
            .headers(id)
            .expect("a message with trace context has headers");
        assert_eq!(headers.get("traceparent"), Some(traceparent), "{id}");
        assert_eq!(
            headers.get("tracestate").map(String::as_str),
            Some(TRACESTATE)
        );
        checked += 1;
    }
    assert_eq!(checked, ROWS as usize - 4);
    // Malformed ones were delivered, without the header.
    for id in [bad_column, uppercase] {
        assert!(consumer.has(&id));
        let headers = consumer.headers(&id).unwrap_or_default();
        assert!(!headers.contains_key("traceparent"), "{id}: {headers:?}");
        assert!(!headers.contains_key("tracestate"), "{id}: {headers:?}");
    }
    let from_headers = consumer.headers(&good_header).expect("headers");
    assert_eq!(
        from_headers.get("traceparent").map(String::as_str),
        Some(IN_HEADERS)
    );
    assert_eq!(from_headers.get("tenant").map(String::as_str), Some("eu"));
    let bad_in_headers = consumer.headers(&bad_header).expect("headers");
    assert_eq!(bad_in_headers.get("tenant").map(String::as_str), Some("us"));
    assert!(
        !bad_in_headers.contains_key("traceparent"),
        "{bad_in_headers:?}"
    );

    // Counted, and said in the log once.
    let addr = relay.metrics_addr().await;
    let (_, text) = http::get(&addr, "/metrics").await;
    assert_eq!(
        metrics::value(
            &text,
            "outbox_relay_trace_context_invalid_total{header=\"traceparent\"}"
        ),
        Some(3.0),
        "{text}"
    );
    let log = relay.log_text();
    assert_eq!(
        log.matches("malformed W3C trace context").count(),
        1,
        "{log}"
    );
    relay.terminate(Duration::from_secs(20)).await;
    consumer.close().await;
}

/// A queue bound to a new fanout exchange, with no consumer: decode.py takes the messages.
async fn queue_for(exchange: &str) -> String {
    let connection = lapin::Connection::connect(&outbox_tests::amqp_url(), Default::default())
        .await
        .expect("RabbitMQ (make services)");
    let channel = connection.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Fanout,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = format!("{exchange}_q");
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), options, FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "declared".into()).await;
    queue
}

/// A row as the SDK must see it.
struct Row {
    kind: String,
    payload: String,
    occurred: DateTime<Utc>,
    key: Option<String>,
    traceparent: String,
}

async fn rows(conn: &mut PgConnection, table: &OutboxTable, key: bool) -> HashMap<Uuid, Row> {
    let key_column = if key { "aggregate_id" } else { "NULL::text" };
    sqlx::query_as::<_, (Uuid, String, String, DateTime<Utc>, Option<String>, String)>(
        sqlx::AssertSqlSafe(format!(
            "SELECT id, type, content::text, occurred_on_utc, {key_column}, traceparent FROM {}",
            table.name.quoted()
        )),
    )
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .map(|(id, kind, payload, occurred, key, traceparent)| {
        let row = Row {
            kind,
            payload,
            occurred,
            key,
            traceparent,
        };
        (id, row)
    })
    .collect()
}

/// What the SDK decoded matches the row: the attributes the docs promise, the payload byte for
/// byte, the trace context as the distributed-tracing extension. `time_ms`: the AMQP 1.0
/// binding's native timestamp carries milliseconds.
fn check_event(
    event: &cloudevents::Decoded,
    rows: &HashMap<Uuid, Row>,
    source: &str,
    time_ms: bool,
) {
    let id: Uuid = event
        .attribute("id")
        .expect("id")
        .parse()
        .expect("a uuid id");
    let row = rows.get(&id).expect("an id of the table");
    assert_eq!(event.attribute("specversion"), Some("1.0"));
    assert_eq!(event.attribute("type"), Some(row.kind.as_str()));
    assert_eq!(event.attribute("source"), Some(source));
    assert_eq!(event.attribute("datacontenttype"), Some("application/json"));
    assert_eq!(event.attribute("subject"), row.key.as_deref());
    assert_eq!(
        event.attribute("traceparent"),
        Some(row.traceparent.as_str())
    );
    assert_eq!(event.attribute("tracestate"), Some(TRACESTATE));
    let time = DateTime::parse_from_rfc3339(event.attribute("time").expect("time"))
        .expect("the SDK's time")
        .with_timezone(&Utc);
    if time_ms {
        // Python turns the milliseconds into a float of seconds: within a microsecond.
        let expected = DateTime::from_timestamp_millis(row.occurred.timestamp_millis()).unwrap();
        let off = (time - expected).num_microseconds().unwrap().abs();
        assert!(off <= 1, "{id}: {time} vs {expected}");
    } else {
        assert_eq!(time, row.occurred, "{id}");
    }
    assert_eq!(
        event.body(),
        row.payload.as_bytes(),
        "{id}: the payload byte for byte"
    );
    let parsed: serde_json::Value = serde_json::from_str(&row.payload).unwrap();
    assert_eq!(event.data, parsed, "{id}: the data the SDK parsed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_is_decoded_by_the_sdk_from_rabbitmq() {
    let name = unique("ce_rabbit");
    let mut table = trace_table(&name);
    table.columns.partition_key = Some(Ident::new("aggregate_id").unwrap());
    let mut conn = db::seeded_table(&table, ROWS).await;
    write_trace_context(&mut conn, &table).await;
    let exchange = unique("ce_x");
    let queue = queue_for(&exchange).await;
    let source = "urn:example:orders";
    let args = process::run_args(
        &name,
        &exchange,
        &[
            "--traceparent-column",
            "traceparent",
            "--tracestate-column",
            "tracestate",
            "--partition-key-column",
            "aggregate_id",
            "--ordering",
            "per-key",
            "--cloudevents",
            "binary",
            "--cloudevents-source",
            source,
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    relay.terminate(Duration::from_secs(20)).await;

    let expected = rows(&mut conn, &table, true).await;
    let queue_name = queue.clone();
    let events = tokio::task::spawn_blocking(move || {
        cloudevents::decode_from_rabbitmq(&queue_name, ROWS as usize)
    })
    .await
    .unwrap();
    assert_eq!(events.len(), ROWS as usize);
    for event in &events {
        check_event(event, &expected, source, false);
    }
    let ids: std::collections::HashSet<_> = events.iter().map(|e| e.attribute("id")).collect();
    assert_eq!(ids.len(), ROWS as usize, "every row once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_is_decoded_by_the_sdk_from_artemis() {
    let name = unique("ce_artemis");
    cloudevents_over_amqp10_are_decoded_by_the_sdk(&name, ARTEMIS_URL, &name).await;
}

/// The same through RabbitMQ's AMQP 1.0 (3.10's plugin, or 4.0's core under the broker matrix),
/// to a queue at the broker's own address format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_over_amqp10_is_decoded_by_the_sdk_from_rabbitmq() {
    let name = unique("ce_rabbit10");
    broker::declare_queue(&name).await;
    let rabbitmq = TestBroker::current();
    let address = rabbitmq.queue_address(&name);
    cloudevents_over_amqp10_are_decoded_by_the_sdk(&name, rabbitmq.amqp10_url(), &address).await;
}

/// Rows of table `name` sent over AMQP 1.0 in CloudEvents binary mode to `address` on the
/// broker at `url`, received there by an AMQP 1.0 consumer and decoded by the SDK's AMQP binding.
async fn cloudevents_over_amqp10_are_decoded_by_the_sdk(name: &str, url: &str, address: &str) {
    let table = trace_table(name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    write_trace_context(&mut conn, &table).await;
    let consumer = amqp10::consume(url, address).await;
    let source = "/orders";
    let args = process::run_args_without_exchange(
        name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            url,
            "--address",
            address,
            "--traceparent-column",
            "traceparent",
            "--tracestate-column",
            "tracestate",
            "--cloudevents",
            "binary",
            "--cloudevents-source",
            source,
        ],
    );
    let mut relay = process::spawn_relay(name, &args);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    let arrived = wait::holds(
        "every row reached the AMQP 1.0 consumer",
        Duration::from_secs(30),
        || async { consumer.distinct() as u64 >= ROWS },
    )
    .await;
    assert!(arrived, "{} of {ROWS} arrived", consumer.distinct());
    relay.terminate(Duration::from_secs(20)).await;

    let expected = rows(&mut conn, &table, false).await;
    let mut messages = Vec::new();
    for (id, row) in &expected {
        let seen = consumer.seen(id).expect("arrived");
        // The bare W3C property too, for OpenTelemetry's instrumentations.
        assert_eq!(
            seen.application_properties.get("traceparent"),
            Some(&row.traceparent)
        );
        messages.push(Amqp10Message {
            content_type: seen.content_type.clone(),
            application_properties: seen.typed_properties.clone(),
            body_b64: cloudevents::base64_encode(&seen.body),
        });
    }
    consumer.stop().await;
    let events = tokio::task::spawn_blocking(move || cloudevents::decode_amqp10(&messages))
        .await
        .unwrap();
    assert_eq!(events.len(), ROWS as usize);
    for event in &events {
        check_event(event, &expected, source, true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_without_a_source_is_refused_at_start() {
    let name = unique("ce_nosource");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 1).await;
    let url = outbox_tests::database_url();
    let amqp = outbox_tests::amqp_url();
    let env = [("DATABASE_URL", url.as_str()), ("AMQP_URL", amqp.as_str())];
    let args = process::run_args(&name, "outbox", &["--cloudevents", "binary"]);
    process::run_relay_refusing_settings(
        &args,
        &env,
        &["--cloudevents-source", "URI-reference"],
        "guest:guest",
    )
    .await;
    let bad = process::run_args(
        &name,
        "outbox",
        &[
            "--cloudevents",
            "binary",
            "--cloudevents-source",
            "not a uri",
        ],
    );
    process::run_relay_refusing_settings(&bad, &env, &["--cloudevents-source"], "guest:guest")
        .await;
}
