//! The relay's own spans over OpenTelemetry: what turns them on ([`settings`]: the standard
//! `OTEL_*` variables), the exporter ([`export`], over [`http_client`]), and the spans of a batch
//! ([`batch_spans`]). The operator exports its reconcile spans through [`export`] too.
//!
//! Off by default, and then free: no tracer exists, a batch notes no times, and no span is built.

pub mod settings;

pub mod http_client;

pub mod export;

pub mod batch_spans;
