//! The reconcile's spans, as an OTLP exporter receives them: one trace per reconcile, a span for
//! each step inside it, and the error status on a reconcile that failed.

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{SpanId, Status, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt;

use super::scenario::{Scenario, orders_relay};
use crate::reconcile::status::conditions::READY;

/// Keeps what it is handed: the exporter's side of the SDK, without a collector.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Collected {
    fn named(&self, name: &str) -> Vec<SpanData> {
        let spans = self.0.lock().unwrap();
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }
}

/// Runs `scenario` with the operator's span layer over an exporter that keeps the spans.
async fn traced(scenario: Scenario) -> Collected {
    let collected = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(collected.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    // This thread only (the test's runtime is single-threaded); the cache is rebuilt so that a
    // callsite another test registered before this subscriber existed is seen by it.
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    tracing::callsite::rebuild_interest_cache();
    scenario.run().await;
    collected
}

#[tokio::test]
async fn a_reconcile_is_one_trace_with_a_span_per_step() {
    let scenario = Scenario::new(orders_relay("outbox_messages"))
        .reads_secrets()
        .event("IndexCreated")
        .finds_no_deployment()
        .applies_deployment(1, 0, |_| {})
        .event("DeploymentCreated")
        .writes_status(|_| {});
    let collected = traced(scenario).await;

    let reconciles = collected.named("reconcile");
    assert_eq!(reconciles.len(), 1, "{:#?}", collected.0.lock().unwrap());
    let reconcile = &reconciles[0];
    assert_eq!(reconcile.parent_span_id, SpanId::INVALID, "a root span");
    assert_eq!(reconcile.status, Status::Unset);
    for step in [
        "dereference",
        "validate",
        "migrate",
        "observe",
        "recommend",
        "apply",
        "status",
    ] {
        let spans = collected.named(step);
        assert_eq!(spans.len(), 1, "one {step} span");
        let span = &spans[0];
        assert_eq!(
            span.span_context.trace_id(),
            reconcile.span_context.trace_id(),
            "{step} is in the reconcile's trace"
        );
        assert_eq!(
            span.parent_span_id,
            reconcile.span_context.span_id(),
            "{step} is a child of the reconcile"
        );
        assert!(span.start_time >= reconcile.start_time && span.end_time <= reconcile.end_time);
    }
    let migrate = &collected.named("migrate")[0];
    assert!(
        migrate
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "table" && kv.value.as_str().contains("outbox_messages")),
        "{:?}",
        migrate.attributes
    );
}

#[tokio::test]
async fn a_failed_reconcile_has_the_error_status() {
    let mut relay = orders_relay("outbox_messages");
    relay.spec.relay.batch_size = -1;
    let scenario = Scenario::new(relay)
        .reads_secrets()
        .writes_status(|status| {
            let ready = status.conditions.iter().find(|c| c.type_ == READY).unwrap();
            assert_eq!(ready.reason, "InvalidSpec");
        })
        .event("InvalidSpec");
    let collected = traced(scenario).await;
    let reconcile = &collected.named("reconcile")[0];
    match &reconcile.status {
        Status::Error { description } => {
            assert!(
                description.contains("spec.relay.batchSize"),
                "{description}"
            );
        }
        other => panic!("the failed reconcile's span has status {other:?}"),
    }
    assert!(
        collected.named("migrate").is_empty(),
        "nothing after the validation ran"
    );
}
