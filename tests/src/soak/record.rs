//! What the soak writes down at the end of each period, and the files it leaves: a CSV for
//! anyone's tools and a Markdown table for the Reliability page.

use std::fmt::Write as _;
use std::path::Path;

/// One period of the run, measured at its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Period {
    pub index: u32,
    /// Seconds from the first period's start to this one's end.
    pub end_s: f64,
    /// How long the period lasted, as measured.
    pub seconds: f64,
    /// Rows the producer inserted during the period.
    pub offered: u64,
    /// Messages the consumer saw for the first time during the period.
    pub delivered: u64,
    /// `delivered` per second.
    pub throughput: f64,
    /// Pending rows in the table at the period's end.
    pub backlog: i64,
    /// End-to-end latency (the row's insert to the consumer) p99 of the period's first
    /// deliveries; None when nothing was delivered.
    pub latency_p99_ms: Option<f64>,
    /// The largest anonymous memory of the relay's pods, MiB.
    pub relay_rss_mib: Option<f64>,
    /// The operator pod's anonymous memory, MiB.
    pub operator_rss_mib: Option<f64>,
    /// The table's dead tuples (pg_stat_user_tables).
    pub dead_tuples: i64,
    /// The table with its indexes and TOAST, MiB.
    pub table_mib: f64,
    /// The faults that started during the period, by name.
    pub faults: Vec<&'static str>,
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |v| format!("{v:.decimals$}"))
}

/// The periods as CSV, one line each.
pub fn csv(periods: &[Period]) -> String {
    let mut text = String::from(
        "period,end_s,offered,delivered,throughput_per_s,backlog,latency_p99_ms,relay_rss_mib,\
         operator_rss_mib,dead_tuples,table_mib,faults\n",
    );
    for p in periods {
        let _ = writeln!(
            text,
            "{},{:.1},{},{},{:.1},{},{},{},{},{},{:.2},{}",
            p.index,
            p.end_s,
            p.offered,
            p.delivered,
            p.throughput,
            p.backlog,
            optional(p.latency_p99_ms, 0),
            optional(p.relay_rss_mib, 1),
            optional(p.operator_rss_mib, 1),
            p.dead_tuples,
            p.table_mib,
            p.faults.join(";")
        );
    }
    text
}

/// The periods as a Markdown table.
pub fn markdown(periods: &[Period]) -> String {
    let mut text = String::from(
        "| period | msg/s | backlog | p99 ms | relay MiB | operator MiB | dead tuples | table MiB | fault |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for p in periods {
        let _ = writeln!(
            text,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {} |",
            p.index,
            p.throughput,
            p.backlog,
            optional(p.latency_p99_ms, 0),
            optional(p.relay_rss_mib, 1),
            optional(p.operator_rss_mib, 1),
            p.dead_tuples,
            p.table_mib,
            p.faults.join(", ")
        );
    }
    text
}

/// Writes `soak.csv` and `soak.md` into `dir`, creating it.
pub fn write(dir: &Path, periods: &[Period]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("soak.csv"), csv(periods))?;
    std::fs::write(dir.join("soak.md"), markdown(periods))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period() -> Period {
        Period {
            index: 3,
            end_s: 24.0,
            seconds: 6.0,
            offered: 3_000,
            delivered: 2_990,
            throughput: 498.3,
            backlog: 12,
            latency_p99_ms: Some(141.2),
            relay_rss_mib: Some(21.31),
            operator_rss_mib: None,
            dead_tuples: 4_100,
            table_mib: 3.5,
            faults: vec!["relay pod killed"],
        }
    }

    #[test]
    fn a_period_is_one_csv_line_with_empty_fields_for_what_was_not_measured() {
        let text = csv(&[period()]);
        let line = text.lines().nth(1).unwrap();
        assert_eq!(
            line,
            "3,24.0,3000,2990,498.3,12,141,21.3,,4100,3.50,relay pod killed"
        );
        assert_eq!(
            text.lines().next().unwrap().split(',').count(),
            line.split(',').count()
        );
    }

    #[test]
    fn the_markdown_table_has_a_row_per_period() {
        let text = markdown(&[period(), period()]);
        assert_eq!(text.lines().count(), 4);
        assert!(text.contains("| 3 | 498 | 12 | 141 | 21.3 |  | 4100 | 3.5 | relay pod killed |"));
    }
}
