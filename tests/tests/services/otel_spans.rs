//! Issue 48, point 2: the relay's own spans, received by a real OpenTelemetry Collector (built
//! from the Go module proxy, `scripts/otel-collector.sh`) over OTLP/HTTP.
//!
//! - One trace per batch: `outbox batch <table>` with its claim, publish and settle spans as
//!   children; the publish span follows the messaging conventions (a batch `send`), and it links
//!   to the trace context of every message it carried, as the producer wrote it.
//! - A collector that is gone costs no message: every row is still delivered, the lost spans are
//!   counted and said once.
//! - A setting this build cannot follow (gRPC) stops the relay at start, naming the variable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::otel_collector::{Collector, ReceivedSpan};
use outbox_tests::{broker, db, http, metrics, process, unique, wait};
use uuid::Uuid;

use crate::trace_context::{trace_table, traceparents, write_trace_context};

const ROWS: u64 = 600;
const BATCH: &str = "100";

/// The trace-id and span-id of a traceparent.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    (parts[1].to_string(), parts[2].to_string())
}

fn attribute<'a>(span: &'a ReceivedSpan, key: &str) -> Option<&'a str> {
    span.attributes.get(key).map(String::as_str)
}

fn count(span: &ReceivedSpan, key: &str) -> u64 {
    attribute(span, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} on {}: {:?}", span.name, span.attributes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_spans_reach_a_collector_linked_to_every_producer_trace() {
    let name = unique("spans");
    let table = trace_table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    write_trace_context(&mut conn, &table).await;
    let expected: HashMap<Uuid, (String, String)> = traceparents(&mut conn, &table)
        .await
        .into_iter()
        .map(|(id, traceparent)| (id, ids(&traceparent)))
        .collect();
    assert_eq!(expected.len(), ROWS as usize);

    let collector = Collector::start().await;
    let exchange = unique("spans_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &exchange,
        &[
            "--traceparent-column",
            "traceparent",
            "--tracestate-column",
            "tracestate",
            "--batch-size",
            BATCH,
        ],
    );
    let endpoint = collector.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        // Export every 200 ms rather than every 5 s: the test waits less.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    let mut relay = process::spawn_relay_with_env(&name, &args, &env);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    consumer.assert_each_id_once(&mut conn, &table, ROWS).await;

    let table_name = table.name.to_string();
    let batch_name = format!("outbox batch {table_name}");
    let published = |spans: &[ReceivedSpan]| -> u64 {
        spans
            .iter()
            .filter(|s| s.name == batch_name)
            .map(|s| count(s, "outbox.messages.published"))
            .sum()
    };
    let received = wait::for_value(
        "the collector has every batch's spans",
        Duration::from_secs(30),
        || {
            let spans = collector.spans();
            let done = published(&spans) >= ROWS;
            async move { done.then_some(spans) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));

    let addr = relay.metrics_addr().await;
    let (_, text) = http::get(&addr, "/metrics").await;
    assert!(
        metrics::value(&text, "outbox_relay_spans_exported_total").unwrap_or(0.0) >= 4.0,
        "{text}"
    );
    assert_eq!(
        metrics::value(&text, "outbox_relay_spans_export_failed_total"),
        Some(0.0)
    );
    relay.terminate(Duration::from_secs(20)).await;
    consumer.close().await;

    let by_id: BTreeMap<&str, &ReceivedSpan> =
        received.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let batches: Vec<&ReceivedSpan> = received.iter().filter(|s| s.name == batch_name).collect();
    assert!(
        batches.len() >= (ROWS / 100) as usize,
        "{} batches",
        batches.len()
    );
    assert_eq!(
        published(&received),
        ROWS,
        "every row published once, in one batch"
    );

    let mut linked: HashMap<String, (String, String)> = HashMap::new();
    for batch in &batches {
        assert_eq!(batch.service, "outbox-relay");
        assert_eq!(batch.kind, "internal");
        assert!(batch.parent_span_id.is_empty(), "a batch is a root span");
        let children: Vec<&ReceivedSpan> = received
            .iter()
            .filter(|s| s.parent_span_id == batch.span_id)
            .collect();
        let names: HashSet<String> = children.iter().map(|s| s.name.clone()).collect();
        let publish_name = format!("publish {exchange}");
        let want: HashSet<String> = [
            format!("claim {table_name}"),
            publish_name.clone(),
            format!("settle {table_name}"),
        ]
        .into_iter()
        .collect();
        assert_eq!(names, want, "the steps of batch {}", batch.span_id);
        for child in &children {
            assert_eq!(child.trace_id, batch.trace_id, "one trace per batch");
            assert!(by_id.contains_key(child.parent_span_id.as_str()));
        }
        let claim = children
            .iter()
            .find(|s| s.name.starts_with("claim "))
            .unwrap();
        assert_eq!(claim.kind, "client");
        assert_eq!(attribute(claim, "db.system.name"), Some("postgresql"));
        assert_eq!(
            attribute(claim, "db.collection.name"),
            Some(table_name.as_str())
        );

        let publish = children.iter().find(|s| s.name == publish_name).unwrap();
        assert_eq!(publish.kind, "producer");
        assert_eq!(attribute(publish, "messaging.system"), Some("rabbitmq"));
        assert_eq!(attribute(publish, "messaging.operation.type"), Some("send"));
        assert_eq!(
            attribute(publish, "messaging.destination.name"),
            Some(exchange.as_str())
        );
        let messages = count(publish, "messaging.batch.message_count");
        assert_eq!(publish.links.len() as u64, messages, "a link per message");
        assert_eq!(
            batch.links.len(),
            publish.links.len(),
            "the batch has them too"
        );
        for link in &publish.links {
            let id = link
                .attributes
                .get("messaging.message.id")
                .expect("each link names its message");
            linked.insert(id.clone(), (link.trace_id.clone(), link.span_id.clone()));
        }
    }
    // Every message's link is its producer's trace and span, as the row had them.
    assert_eq!(linked.len(), expected.len());
    for (id, producer) in &expected {
        assert_eq!(linked.get(&id.to_string()), Some(producer), "message {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_gone_costs_no_message_and_is_said_once() {
    let name = unique("spans_gone");
    let table = trace_table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    write_trace_context(&mut conn, &table).await;
    let exchange = unique("spans_gone_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &exchange,
        &["--traceparent-column", "traceparent", "--batch-size", BATCH],
    );
    // A port nothing listens on: every export is refused.
    let port = outbox_tests::services::free_port().expect("a free port");
    let closed = format!("http://127.0.0.1:{port}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", closed.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let mut relay = process::spawn_relay_with_env(&name, &args, &env);
    let drained = db::wait_until_drained(&table, Duration::from_secs(60)).await;
    assert!(drained, "rows still pending:\n{}", relay.log_text());
    consumer.assert_each_id_once(&mut conn, &table, ROWS).await;
    let addr = relay.metrics_addr().await;
    let failed = wait::for_value("an export failed", Duration::from_secs(30), || {
        let addr = addr.clone();
        async move {
            let (_, text) = http::get(&addr, "/metrics").await;
            metrics::value(&text, "outbox_relay_spans_export_failed_total").filter(|v| *v > 0.0)
        }
    })
    .await;
    assert!(failed.is_ok(), "{}", relay.log_text());
    relay.terminate(Duration::from_secs(20)).await;
    let log = relay.log_text();
    assert_eq!(log.matches("cannot export spans").count(), 1, "{log}");
    consumer.close().await;
}

#[tokio::test]
async fn a_protocol_this_build_cannot_speak_stops_the_relay_naming_the_variable() {
    let (database, amqp) = (outbox_tests::database_url(), outbox_tests::amqp_url());
    process::run_relay_refusing_settings(
        &["run", "--table", &unique("spans_grpc")],
        &[
            ("DATABASE_URL", database.as_str()),
            ("AMQP_URL", amqp.as_str()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret-token"),
        ],
        &["OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "http/protobuf"],
        "s3cret-token",
    )
    .await;
}
