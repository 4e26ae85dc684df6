//! Issue 48, point 4: the OpenTelemetry Collector the span tests read (tests/src/otel_collector.rs)
//! gives back exactly what it was sent over OTLP/HTTP, every field, and two collectors side by
//! side each keep their own spans.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_tests::otel_collector::{Collector, ReceivedSpan};
use outbox_tests::{http, unique, wait};
use serde_json::json;
use uuid::Uuid;

/// `n` random bytes as lowercase hex (a trace id is 16, a span id 8).
fn random_hex(bytes: usize) -> String {
    Uuid::new_v4().simple().to_string()[..bytes * 2].to_string()
}

fn text_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The one span called `name`.
fn by_name<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
}

/// Posts `request` (OTLP JSON) to the collector's /v1/traces, as an SDK's OTLP/HTTP exporter
/// in JSON mode does; the collector must take it whole.
async fn export(collector: &Collector, request: &serde_json::Value) {
    let addr = collector
        .endpoint()
        .trim_start_matches("http://")
        .to_string();
    let body = serde_json::to_vec(request).expect("a JSON body");
    let (code, response) = http::post(&addr, "/v1/traces", "application/json", &body).await;
    assert_eq!(code, 200, "{response}\n{}", collector.log_text());
}

#[tokio::test]
async fn a_collector_gives_back_every_field_of_the_spans_it_received() {
    let collector = Collector::start().await;
    // A second one at the same time: its own port, its own file, nothing of the first's.
    let other = Collector::start().await;
    assert!(collector.endpoint().starts_with("http://127.0.0.1:"));
    assert_ne!(collector.endpoint(), other.endpoint());

    let service = unique("collector_test");
    let trace_id = random_hex(16);
    let (root_id, child_id) = (random_hex(8), random_hex(8));
    let (linked_trace, linked_span) = (random_hex(16), random_hex(8));
    let request = json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": service}},
            ]},
            "scopeSpans": [{
                "scope": {"name": "outbox-tests"},
                "spans": [
                    {
                        "traceId": trace_id,
                        "spanId": child_id,
                        "parentSpanId": root_id,
                        "name": "publish orders",
                        "kind": 4,
                        "startTimeUnixNano": "1700000000000000000",
                        "endTimeUnixNano": "1700000000001000000",
                        "attributes": [
                            {"key": "messaging.system", "value": {"stringValue": "rabbitmq"}},
                            {"key": "messaging.batch.message_count", "value": {"intValue": "100"}},
                            {"key": "outbox.retried", "value": {"boolValue": true}},
                            {"key": "outbox.fill", "value": {"doubleValue": 0.25}},
                        ],
                        "links": [{
                            "traceId": linked_trace,
                            "spanId": linked_span,
                            "attributes": [
                                {"key": "messaging.message.id", "value": {"stringValue": "m-1"}},
                            ],
                        }],
                        "status": {"code": 2, "message": "broker refused 3 messages"},
                    },
                    {
                        "traceId": trace_id,
                        "spanId": root_id,
                        "name": "outbox batch orders",
                        "kind": 1,
                        "startTimeUnixNano": "1700000000000000000",
                        "endTimeUnixNano": "1700000000002000000",
                    },
                ],
            }],
        }],
    });
    export(&collector, &request).await;

    let spans = wait::for_value(
        "the collector's file holds both spans",
        Duration::from_secs(20),
        || {
            let spans = collector.spans();
            async move { (spans.len() >= 2).then_some(spans) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", collector.log_text()));
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let publish = by_name(&spans, "publish orders");
    assert_eq!(publish.service, service);
    assert_eq!(publish.kind, "producer");
    assert_eq!(publish.trace_id, trace_id);
    assert_eq!(publish.span_id, child_id);
    assert_eq!(publish.parent_span_id, root_id);
    assert_eq!(
        publish.attributes,
        text_map(&[
            ("messaging.system", "rabbitmq"),
            ("messaging.batch.message_count", "100"),
            ("outbox.retried", "true"),
            ("outbox.fill", "0.25"),
        ])
    );
    assert_eq!(publish.links.len(), 1);
    let link = &publish.links[0];
    assert_eq!(
        (link.trace_id.as_str(), link.span_id.as_str()),
        (linked_trace.as_str(), linked_span.as_str())
    );
    assert_eq!(
        link.attributes,
        text_map(&[("messaging.message.id", "m-1")])
    );
    assert_eq!(publish.status_code, "error");
    assert_eq!(publish.status_message, "broker refused 3 messages");

    let batch = by_name(&spans, "outbox batch orders");
    assert_eq!(batch.service, service);
    assert_eq!(batch.kind, "internal");
    assert_eq!(batch.trace_id, trace_id);
    assert_eq!(batch.span_id, root_id);
    assert_eq!(batch.parent_span_id, "", "a root span");
    assert!(batch.attributes.is_empty() && batch.links.is_empty());
    assert_eq!(
        (batch.status_code.as_str(), batch.status_message.as_str()),
        ("unset", "")
    );

    // A second export adds to what the first left; the other collector saw none of it.
    export(&collector, &request).await;
    let grown = wait::until(
        "the second export is in the file",
        Duration::from_secs(20),
        || {
            let count = collector.spans().len();
            async move { count == 4 }
        },
    )
    .await;
    assert!(grown.is_ok(), "{:#?}", collector.spans());
    assert!(other.spans().is_empty(), "{:#?}", other.spans());
}
