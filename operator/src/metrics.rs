//! Prometheus metrics of the operator: reconciles, failures by cause, and duration, per relay;
//! the reconciles running now; and the requests it sent the API server, by method and answer.

use outbox_relay::metrics::registered;
use outbox_relay::telemetry::export::ExportCounters;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    /// Reconciles started and not yet finished: at most the reconcile concurrency.
    in_flight: IntGauge,
    /// Requests to the API server, by HTTP method and status code ("error" when no answer
    /// came): what the operator costs the control plane, and any 429 it was told.
    pub api_requests: IntCounterVec,
    /// The reconcile spans exported over OTLP, and those lost in failed exports.
    pub spans: ExportCounters,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new_custom(Some("outbox_operator".into()), None)
            .expect("static prefix is valid");
        let r = &registry;
        let reconciles = registered(
            r,
            IntCounterVec::new(
                Opts::new("reconciles_total", "Reconciles started, by relay"),
                &["relay"],
            ),
        );
        let failures = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "reconcile_failures_total",
                    "Reconciles that failed, by relay and cause",
                ),
                &["relay", "error"],
            ),
        );
        let duration = registered(
            r,
            HistogramVec::new(
                HistogramOpts::new("reconcile_duration_seconds", "Time one reconcile took")
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["relay"],
            ),
        );
        let in_flight = registered(
            r,
            IntGauge::new(
                "reconciles_in_flight",
                "Reconciles running now (bounded by --reconcile-concurrency)",
            ),
        );
        let api_requests = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "api_requests_total",
                    "Requests sent to the Kubernetes API server, by HTTP method and status code \
                     (\"error\" when none came back)",
                ),
                &["method", "code"],
            ),
        );
        let spans = ExportCounters {
            exported: registered(
                r,
                IntCounter::new(
                    "spans_exported_total",
                    "Reconcile spans accepted by the OTLP endpoint",
                ),
            ),
            failed: registered(
                r,
                IntCounter::new(
                    "spans_export_failed_total",
                    "Reconcile spans lost because their export to the OTLP endpoint failed",
                ),
            ),
        };
        Self {
            registry,
            reconciles,
            failures,
            duration,
            in_flight,
            api_requests,
            spans,
        }
    }
}

/// One reconcile being timed and counted as in flight; both end when it is dropped.
pub struct ReconcileGuard {
    _timer: prometheus::HistogramTimer,
    in_flight: IntGauge,
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

impl Metrics {
    /// Counts a reconcile of `relay` (`namespace/name`) and one more in flight; the returned
    /// guard records its duration and counts it out when dropped.
    pub fn reconcile_started(&self, relay: &str) -> ReconcileGuard {
        self.reconciles.with_label_values(&[relay]).inc();
        self.in_flight.inc();
        ReconcileGuard {
            _timer: self.duration.with_label_values(&[relay]).start_timer(),
            in_flight: self.in_flight.clone(),
        }
    }

    /// Counts a failed reconcile of `relay` by its cause, the error's metric label.
    pub fn reconcile_failed(&self, relay: &str, cause: &str) {
        self.failures.with_label_values(&[relay, cause]).inc();
    }

    /// Every metric family the operator exposes, the labelled ones included, for the generated
    /// reference page (`docs/reference/metrics.md`, `make docs-reference`). `Registry::gather`
    /// leaves a labelled family out until it has a series, and a registry does not hand its
    /// collectors back, so a throwaway instance (its own registry) gives each family one series
    /// with empty label values. Read the names, types, help and label names, not the values. A
    /// new family needs its line here: the reference test (tests/tests/repo_docs_reference.rs)
    /// fails on a metric name it does not find.
    pub fn reference_families() -> Vec<prometheus::proto::MetricFamily> {
        let metrics = Self::default();
        metrics.reconciles.with_label_values(&[""]);
        metrics.failures.with_label_values(&["", ""]);
        metrics.duration.with_label_values(&[""]);
        metrics.api_requests.with_label_values(&["", ""]);
        metrics.registry.gather()
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_the_error_label() {
        let metrics = Metrics::default();
        drop(metrics.reconcile_started("shop/orders"));
        metrics.reconcile_failed("shop/orders", "secret_not_found");
        let text = metrics.render();
        assert!(
            text.contains("outbox_operator_reconciles_total{relay=\"shop/orders\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "outbox_operator_reconcile_failures_total{error=\"secret_not_found\",relay=\"shop/orders\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("outbox_operator_reconcile_duration_seconds_count"),
            "{text}"
        );
    }

    #[test]
    fn a_reconcile_is_in_flight_until_its_guard_is_dropped() {
        let metrics = Metrics::default();
        let first = metrics.reconcile_started("shop/orders");
        let second = metrics.reconcile_started("shop/invoices");
        assert!(
            metrics
                .render()
                .contains("outbox_operator_reconciles_in_flight 2")
        );
        drop(first);
        drop(second);
        assert!(
            metrics
                .render()
                .contains("outbox_operator_reconciles_in_flight 0")
        );
    }
}
