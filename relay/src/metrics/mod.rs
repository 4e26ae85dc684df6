//! Prometheus metrics of one relay process. Each process owns its registry (not the global
//! one) so tests can run several relays side by side.

mod blocked_keys;
mod broker;
mod gauge_seat;
mod registry;
mod table_health;

pub use blocked_keys::{BlockedKeys, KeyEvent};
pub use broker::BrokerMetrics;
pub use gauge_seat::GaugeSeat;
pub use registry::registered;
pub use table_health::TableHealthMetrics;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// The stages of one batch, each timed separately so a slow one is visible.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    Claim,
    /// Waiting for a publish slot (`--inflight-batches`) with the claimed rows in hand.
    Slot,
    Publish,
    Confirm,
    Mark,
    Commit,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Stage::Claim => "claim",
            Stage::Slot => "slot",
            Stage::Publish => "publish",
            Stage::Confirm => "confirm",
            Stage::Mark => "mark",
            Stage::Commit => "commit",
        }
    }
}

/// Why a message was not confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The broker answered basic.nack: the row stays pending, no attempt spent.
    Nack,
    /// The broker returned the message as unroutable (mandatory publish).
    Unroutable,
    /// An AMQP 1.0 broker answered `rejected`.
    Rejected,
    /// An AMQP 1.0 broker answered `released` or `modified`: not taken, no attempt spent.
    Released,
    /// The row cannot become a message (NULL payload, over-long type, bad headers).
    Malformed,
    /// No confirm within the publish timeout.
    Timeout,
    /// The connection or channel failed; the row stays pending without spending an attempt.
    BrokerUnavailable,
}

impl FailureReason {
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Nack => "nack",
            FailureReason::Unroutable => "unroutable",
            FailureReason::Rejected => "rejected",
            FailureReason::Released => "released",
            FailureReason::Malformed => "malformed",
            FailureReason::Timeout => "timeout",
            FailureReason::BrokerUnavailable => "broker_unavailable",
        }
    }
}

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub published: IntCounter,
    pub dead_lettered: IntCounter,
    pub failures: IntCounterVec,
    /// Lag reports that failed, by cause: a schema's (ReportTableMissing, ReportColumnMissing,
    /// ReportPrivilege) or the database's (Database).
    pub report_failures: IntCounterVec,
    /// Malformed W3C trace context (by header) left off messages that were still sent.
    pub trace_context_invalid: IntCounterVec,
    /// The relay's own spans handed to the OTLP endpoint, and those lost in exports that failed
    /// (only while OTEL_EXPORTER_OTLP_* configure an export).
    pub spans_exported: IntCounter,
    pub spans_export_failed: IntCounter,
    pub batch_size: Histogram,
    stage_seconds: HistogramVec,
    pub backlog: IntGauge,
    pub backlog_capped: IntGauge,
    pub oldest_age_seconds: Gauge,
    pub publish_rate: Gauge,
    pub database_connected: IntGauge,
    /// 1 while the last database connect found only servers that cannot take writes.
    pub database_waiting_for_primary: IntGauge,
    /// Connections closed because their server was a standby (or read-only) where the relay
    /// needs a primary.
    pub database_standby_refusals: IntCounter,
    /// Connections dropped because the server said it became a standby or is going away, or a
    /// COMMIT did not return in time.
    pub database_connections_discarded: IntCounter,
    /// Failed database connects of the workers and the start-up check by cause (DatabaseUnreachable, DatabaseAuth,
    /// DatabaseTLS, DatabaseSettings, DatabaseReadOnly, DatabaseError).
    pub database_connect_failures: IntCounterVec,
    pub broker_connected: IntGauge,
    /// Worker connections the broker blocks (`connection.blocked`: a memory or disk alarm).
    pub broker_blocked: IntGauge,
    pub workers_busy: IntGauge,
    /// 1 while delivery is suspended (SIGUSR1 until SIGUSR2): no claims, the backlog still
    /// measured.
    pub suspended: IntGauge,
    /// Seconds the workers waited for rate-limit permits (summed over workers).
    pub rate_limit_wait_seconds: prometheus::Counter,
    /// The rate limit in force, in messages per second; 0: none.
    pub rate_limit: Gauge,
    /// When this process last wrote its lag report (Unix seconds): an alert sees it go stale.
    pub last_report_timestamp: Gauge,
    pub table: TableHealthMetrics,
    /// Under per-key ordering: the keys this process's workers hold back.
    pub blocked_keys: BlockedKeys,
    /// Broker nodes and nack pauses.
    pub broker: BrokerMetrics,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        Self {
            published: registered(
                r,
                IntCounter::new(
                    "outbox_relay_messages_published_total",
                    "Messages confirmed by the broker and settled in the table",
                ),
            ),
            dead_lettered: registered(
                r,
                IntCounter::new(
                    "outbox_relay_messages_dead_lettered_total",
                    "Messages given up on after max attempts or because the row is malformed; \
                     `outbox-relay dead-letters list` groups them by cause",
                ),
            ),
            failures: registered(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "outbox_relay_publish_failures_total",
                        "Messages not confirmed, by reason",
                    ),
                    &["reason"],
                ),
            ),
            report_failures: registered(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "outbox_relay_report_failures_total",
                        "Lag reports that failed, by reason (ReportTableMissing, \
                         ReportColumnMissing, ReportPrivilege: fixed by a migration or a grant; \
                         Database: retried on a new connection)",
                    ),
                    &["reason"],
                ),
            ),
            trace_context_invalid: registered(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "outbox_relay_trace_context_invalid_total",
                        "Malformed W3C trace context headers (traceparent, tracestate) of rows, \
                         left off their messages, which were sent without them",
                    ),
                    &["header"],
                ),
            ),
            spans_exported: registered(
                r,
                IntCounter::new(
                    "outbox_relay_spans_exported_total",
                    "The relay's batch spans accepted by the OTLP endpoint",
                ),
            ),
            spans_export_failed: registered(
                r,
                IntCounter::new(
                    "outbox_relay_spans_export_failed_total",
                    "The relay's batch spans lost because their export to the OTLP endpoint failed \
                     (the messages are not affected)",
                ),
            ),
            batch_size: registered(
                r,
                Histogram::with_opts(
                    HistogramOpts::new("outbox_relay_batch_size", "Rows claimed per batch")
                        .buckets(vec![
                            0.0, 1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
                            10000.0,
                        ]),
                ),
            ),
            stage_seconds: registered(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "outbox_relay_stage_duration_seconds",
                        "Duration of each batch stage",
                    )
                    .buckets(
                        prometheus::exponential_buckets(0.0005, 2.0, 16).expect("static buckets"),
                    ),
                    &["stage"],
                ),
            ),
            backlog: registered(
                r,
                IntGauge::new(
                    "outbox_relay_backlog",
                    "Pending rows (capped count) at the last measure",
                ),
            ),
            backlog_capped: registered(
                r,
                IntGauge::new(
                    "outbox_relay_backlog_capped",
                    "1 when the last backlog count stopped at its cap",
                ),
            ),
            oldest_age_seconds: registered(
                r,
                Gauge::new(
                    "outbox_relay_oldest_pending_age_seconds",
                    "Age of the oldest pending row at the last measure",
                ),
            ),
            publish_rate: registered(
                r,
                Gauge::new(
                    "outbox_relay_publish_rate",
                    "Messages per second published by this process",
                ),
            ),
            database_connected: registered(
                r,
                IntGauge::new(
                    "outbox_relay_database_connected",
                    "Workers connected to PostgreSQL",
                ),
            ),
            database_waiting_for_primary: registered(
                r,
                IntGauge::new(
                    "outbox_relay_database_waiting_for_primary",
                    "1 while every database server reached is a read-only standby: the relay \
                     waits for a primary",
                ),
            ),
            database_standby_refusals: registered(
                r,
                IntCounter::new(
                    "outbox_relay_database_standby_refusals_total",
                    "Database connections closed before use because the server was a standby \
                     or read-only (target_session_attrs)",
                ),
            ),
            database_connections_discarded: registered(
                r,
                IntCounter::new(
                    "outbox_relay_database_connections_discarded_total",
                    "Database connections dropped because the server became a standby, shut \
                     down or went away, or a COMMIT did not return within --commit-timeout",
                ),
            ),
            database_connect_failures: registered(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "outbox_relay_database_connect_failures_total",
                        "Failed database connects (the start-up check's and the workers') by \
                         cause (reason: \
                         DatabaseUnreachable, DatabaseAuth, DatabaseTLS, DatabaseSettings, \
                         DatabaseReadOnly, DatabaseError)",
                    ),
                    &["reason"],
                ),
            ),
            broker_connected: registered(
                r,
                IntGauge::new(
                    "outbox_relay_broker_connected",
                    "Workers connected to the broker",
                ),
            ),
            broker_blocked: registered(
                r,
                IntGauge::new(
                    "outbox_relay_broker_blocked",
                    "Worker connections the broker blocks from publishing (connection.blocked: \
                     a memory or disk alarm); they claim nothing until it lifts",
                ),
            ),
            workers_busy: registered(
                r,
                IntGauge::new(
                    "outbox_relay_workers_busy",
                    "Workers with a batch in flight",
                ),
            ),
            suspended: registered(
                r,
                IntGauge::new(
                    "outbox_relay_suspended",
                    "1 while delivery is suspended (SIGUSR1; SIGUSR2 resumes): workers claim \
                     nothing, the backlog is still measured",
                ),
            ),
            rate_limit_wait_seconds: registered(
                r,
                prometheus::Counter::new(
                    "outbox_relay_rate_limit_wait_seconds_total",
                    "Seconds the workers waited for rate-limit permits before claiming, summed \
                     over workers: growing about as fast as the workers' count times the clock \
                     means the limit, not the broker or the database, holds the relay back",
                ),
            ),
            rate_limit: registered(
                r,
                Gauge::new(
                    "outbox_relay_rate_limit_messages_per_second",
                    "The rate limit in force in this process (the smaller of --max-rate and \
                     the pod's share of spec.relay.maxRate); 0 when there is none",
                ),
            ),
            last_report_timestamp: registered(
                r,
                Gauge::new(
                    "outbox_relay_last_report_timestamp_seconds",
                    "When this process last wrote its lag report (Unix time)",
                ),
            ),
            table: TableHealthMetrics::new(r),
            blocked_keys: BlockedKeys::new(r),
            broker: BrokerMetrics::new(r),
            registry,
        }
    }

    pub fn stage(&self, stage: Stage) -> Histogram {
        self.stage_seconds.with_label_values(&[stage.label()])
    }

    pub fn failure(&self, reason: FailureReason) {
        self.failures.with_label_values(&[reason.label()]).inc();
    }

    /// Every metric family a relay process exposes, the labelled ones included, for the
    /// generated reference page (`docs/reference/metrics.md`, `make docs-reference`).
    /// `Registry::gather` leaves a labelled family out until it has a series, and a registry
    /// does not hand its collectors back, so a throwaway instance (its own registry) gives each
    /// labelled family one series with empty label values. Read the names, types, help and
    /// label names, not the values. A new labelled family needs its line here: the reference
    /// test (tests/tests/repo_docs_reference.rs) fails on a metric name it does not find.
    pub fn reference_families() -> Vec<prometheus::proto::MetricFamily> {
        let metrics = Self::new();
        metrics.failures.with_label_values(&[""]);
        metrics.trace_context_invalid.with_label_values(&[""]);
        metrics.stage_seconds.with_label_values(&[""]);
        metrics
            .table
            .horizon_holder
            .with_label_values(&["", "", ""]);
        metrics.table.autovacuum_enabled.with_label_values(&[""]);
        metrics.broker.node_connections.with_label_values(&[""]);
        metrics.broker.connect_failures.with_label_values(&[""]);
        metrics.report_failures.with_label_values(&[""]);
        metrics.database_connect_failures.with_label_values(&[""]);
        metrics.registry.gather()
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        self.blocked_keys.refresh();
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding to a Vec cannot fail");
        String::from_utf8(buffer).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let metrics = Metrics::new();
        metrics.published.inc_by(3);
        metrics.failure(FailureReason::Nack);
        metrics.stage(Stage::Claim).observe(0.01);
        let text = metrics.render();
        assert!(text.contains("outbox_relay_messages_published_total 3"));
        assert!(text.contains("outbox_relay_publish_failures_total{reason=\"nack\"} 1"));
        assert!(text.contains("outbox_relay_stage_duration_seconds_count{stage=\"claim\"} 1"));
        assert!(text.contains("outbox_relay_backlog 0"));
    }
}
