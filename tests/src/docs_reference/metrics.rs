//! `docs/reference/metrics.md`: every metric the relay and the operator register, read from
//! their registries (`reference_families`, which includes the labelled families `gather` alone
//! would leave out until they have a series).

use prometheus::proto::{MetricFamily, MetricType};

use super::markdown::{cell, code, prose, table};

/// One metric family as the page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricInfo {
    pub name: String,
    pub kind: &'static str,
    pub labels: Vec<String>,
    pub help: String,
}

/// The relay's metrics, by name.
pub fn relay() -> Vec<MetricInfo> {
    describe(outbox_relay::metrics::Metrics::reference_families())
}

/// The operator's metrics, by name.
pub fn operator() -> Vec<MetricInfo> {
    describe(outbox_operator::metrics::Metrics::reference_families())
}

/// The page; `command` is what regenerates it.
pub fn render(command: &str) -> String {
    let mut out = String::from("# Metrics\n\n");
    out.push_str(&format!(
        "Generated from the relay's and the operator's metric registries by `{command}`: do \
         not edit this page, regenerate it.\n\n"
    ));
    out.push_str(&prose(
        "Both serve them in the Prometheus text format on `/metrics`. A histogram is exposed as \
         its `_bucket`, `_sum` and `_count` series. A labelled metric has no series until its \
         first observation.",
    ));
    out.push_str("\n\n");
    out.push_str("## Relay\n\n");
    out.push_str(&prose(
        "Registered by every `outbox-relay run` process (and every relay pod), each with its \
         own values: sum them over the pods of a relay.",
    ));
    out.push_str("\n\n");
    out.push_str(&metrics_table(&relay()));
    out.push_str("\n## Operator\n\n");
    out.push_str(&prose("Registered by `outbox-operator run`."));
    out.push_str("\n\n");
    out.push_str(&metrics_table(&operator()));
    out
}

fn metrics_table(metrics: &[MetricInfo]) -> String {
    let rows: Vec<Vec<String>> = metrics
        .iter()
        .map(|m| {
            let labels = if m.labels.is_empty() {
                "none".to_string()
            } else {
                m.labels
                    .iter()
                    .map(|l| code(l))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![code(&m.name), m.kind.to_string(), labels, cell(&m.help)]
        })
        .collect();
    table(&["Name", "Type", "Labels", "Help"], &rows)
}

/// Name, type, label names and help of each family, sorted by name. The label names come from
/// the one series `reference_families` gives a labelled family; their values mean nothing.
fn describe(families: Vec<MetricFamily>) -> Vec<MetricInfo> {
    let mut metrics: Vec<MetricInfo> = families
        .iter()
        .map(|family| MetricInfo {
            name: family.name().to_string(),
            kind: kind(family.get_field_type()),
            labels: family
                .get_metric()
                .first()
                .map(|series| {
                    series
                        .get_label()
                        .iter()
                        .map(|label| label.name().to_string())
                        .collect()
                })
                .unwrap_or_default(),
            help: family.help().to_string(),
        })
        .collect();
    metrics.sort_by(|a, b| a.name.cmp(&b.name));
    metrics
}

fn kind(metric_type: MetricType) -> &'static str {
    match metric_type {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}
