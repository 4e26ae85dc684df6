//! The tracer provider of a process whose environment asks for spans (see [`super::settings`]):
//! the OTLP/HTTP exporter behind the SDK's batch processor, which queues spans and sends them
//! from a thread of its own, so a slow or absent collector never holds a batch of messages back.
//!
//! An export that fails (the collector down, a refused token) loses those spans, never a message:
//! it is counted and said once, then again once a minute while it lasts, and its end is said.

use std::fmt;
use std::time::Duration;

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use prometheus::IntCounter;
use tracing::{info, warn};

use super::http_client::{CaFileError, RuntimeHttpClient};
use super::settings::OtlpTarget;
use crate::announce::Announcer;

/// Why spans cannot be exported as configured: said at start, exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum ExportSetupError {
    #[error(transparent)]
    CaFile(#[from] CaFileError),
    #[error("cannot set up the OTLP exporter: {0}; check the OTEL_EXPORTER_OTLP_* variables")]
    Exporter(String),
}

/// The counters an exporter keeps (the relay's metrics; the operator passes its own).
#[derive(Clone)]
pub struct ExportCounters {
    pub exported: IntCounter,
    pub failed: IntCounter,
}

/// A provider exporting to `target` as `service` (unless `OTEL_SERVICE_NAME` names the service).
/// `max_links` raises the SDK's default of 128 links a span may hold to a batch's size, unless
/// `OTEL_SPAN_LINK_COUNT_LIMIT` sets it. Call on the tokio runtime the process runs; the caller
/// says where spans go ([`say_exporting`]) once its log is set up.
pub fn tracer_provider(
    target: &OtlpTarget,
    service: &'static str,
    max_links: u32,
    counters: ExportCounters,
) -> Result<SdkTracerProvider, ExportSetupError> {
    let client = RuntimeHttpClient::new(target.ca_file.as_deref())?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(client)
        .build()
        .map_err(|e| ExportSetupError::Exporter(e.to_string()))?;
    let exporter = Reported {
        inner: exporter,
        counters,
        announcer: Announcer::default(),
        endpoint: target.endpoint.clone(),
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let mut provider = SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(exporter);
    if std::env::var_os("OTEL_SPAN_LINK_COUNT_LIMIT").is_none() {
        provider = provider.with_max_links_per_span(max_links.max(128));
    }
    Ok(provider.build())
}

/// The start-up line of a process that exports spans.
pub fn say_exporting(target: &OtlpTarget) {
    info!(endpoint = %target.endpoint, "exporting spans over OTLP/HTTP");
}

/// Sends the spans still queued, waiting at most `within`: at the end of a run, so the last
/// batches' spans are not lost.
pub fn flush_and_stop(provider: SdkTracerProvider, within: Duration) {
    if let Err(e) = provider.shutdown_with_timeout(within) {
        warn!(error = %e, "spans still queued at exit were not all exported");
    }
}

/// The OTLP exporter, counting what it sends and saying once when exports fail.
struct Reported<E> {
    inner: E,
    counters: ExportCounters,
    announcer: Announcer,
    endpoint: String,
}

impl<E> fmt::Debug for Reported<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reported")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl<E: SpanExporter> SpanExporter for Reported<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                self.counters.exported.inc_by(spans);
                if let Some(lasted) = self.announcer.over() {
                    info!(endpoint = %self.endpoint, after = ?lasted, "exporting spans again");
                }
            }
            Err(e) => {
                self.counters.failed.inc_by(spans);
                let text = format!(
                    "cannot export spans to {}: {e}; these spans are lost, nothing else is \
                     affected (counted in *_spans_export_failed_total)",
                    self.endpoint
                );
                if self.announcer.should_say(&text) {
                    warn!("{text}");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
