//! Reading a relay's `/metrics` text in a test.

/// The value of the first sample of `series`: a name (any label set) or a name with its
/// labels as rendered, e.g. `outbox_relay_autovacuum_enabled{scope="table"}`.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(name, _)| {
            // A name alone matches any of its label sets, never a longer name.
            *name == series || (!series.contains('{') && name.starts_with(&format!("{series}{{")))
        })
        .and_then(|(_, value)| value.trim().parse().ok())
}

/// The label sets of every sample of metric `name`, as written (`{kind="snapshot",…}`).
pub fn label_sets(text: &str, name: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once('}').map(|(labels, _)| labels.to_string()))
        .collect()
}

/// Messages a relay counted sent without a confirm (timed out, nacked, never handed over):
/// what may reach a consumer twice.
pub fn unconfirmed(text: &str) -> u64 {
    ["timeout", "nack", "broker_unavailable"]
        .iter()
        .filter_map(|reason| {
            let series = format!("outbox_relay_publish_failures_total{{reason=\"{reason}\"}}");
            value(text, &series)
        })
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\noutbox_relay_backlog 7\noutbox_relay_backlog_capped 1\n\
                        outbox_relay_autovacuum_enabled{scope=\"table\"} 0\n\
                        outbox_relay_cleanup_horizon_holder{kind=\"snapshot\",pid=\"42\"} 1\n";

    #[test]
    fn values_and_labels_are_read_by_their_full_name() {
        assert_eq!(value(TEXT, "outbox_relay_backlog"), Some(7.0));
        assert_eq!(value(TEXT, "outbox_relay_backlog_capped"), Some(1.0));
        assert_eq!(
            value(TEXT, "outbox_relay_autovacuum_enabled{scope=\"table\"}"),
            Some(0.0)
        );
        assert_eq!(value(TEXT, "outbox_relay_autovacuum_enabled"), Some(0.0));
        assert_eq!(value(TEXT, "outbox_relay_missing"), None);
        assert_eq!(
            label_sets(TEXT, "outbox_relay_cleanup_horizon_holder"),
            vec!["kind=\"snapshot\",pid=\"42\"".to_string()]
        );
    }
}
