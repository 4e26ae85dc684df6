//! Logging setup: text for people at a terminal, JSON for log pipelines. `RUST_LOG` overrides
//! the default filter.

pub use outbox_relay::config::LogFormat;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,sqlx=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // A second init (tests) is harmless; keep the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
