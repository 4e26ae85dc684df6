//! Logging setup: text for people at a terminal, JSON for log pipelines. `RUST_LOG` overrides
//! the default filter.
//!
//! Spans: when the standard `OTEL_EXPORTER_OTLP_*` variables name an endpoint, the operator's
//! `tracing` spans (a reconcile and its steps: dereference, validate, migrate, observe, apply,
//! status) are exported over OTLP as well, through the relay's exporter (one span per step, the
//! reconcile as their parent). Off otherwise: no tracer and no layer exist.

use opentelemetry::trace::TracerProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
pub use outbox_relay::config::LogFormat;
use outbox_relay::telemetry::export::{
    ExportCounters, ExportSetupError, say_exporting, tracer_provider,
};
use outbox_relay::telemetry::settings::OtlpTarget;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The service name of the operator's spans, unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "outbox-operator";

/// Sets up logging, and span export when `otlp` says where; returns the provider to flush at
/// exit. Call on the tokio runtime.
pub fn init(
    format: LogFormat,
    otlp: Option<&OtlpTarget>,
    counters: ExportCounters,
) -> Result<Option<SdkTracerProvider>, ExportSetupError> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,sqlx=warn"));
    // Built first: a setting it refuses stops the operator before anything else happens.
    let provider = otlp
        .map(|target| tracer_provider(target, SERVICE_NAME, 128, counters))
        .transpose()?;
    let spans = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE_NAME)));
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .boxed(),
    };
    // A second init (tests) is harmless; keep the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(spans)
        .try_init();
    if let Some(target) = otlp {
        say_exporting(target);
    }
    Ok(provider)
}
