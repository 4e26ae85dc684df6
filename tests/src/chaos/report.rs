//! The chaos report: what was injected, what was delivered, what was lost.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: &'static str,
    /// Seconds after the relays started.
    pub at_seconds: f64,
    /// Seconds from the end of the fault until messages flowed again.
    pub recovery_seconds: Option<f64>,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub seed: u64,
    pub rows: u64,
    pub relays: usize,
    pub workers_per_relay: usize,
    pub batch_size: usize,
    pub faults: Vec<FaultRecord>,
    pub ids_delivered: u64,
    pub ids_lost: u64,
    pub duplicates: u64,
    /// What the protocol promises: at most one batch per worker hit by a fault.
    pub duplicate_bound: u64,
    pub rows_pending: i64,
    /// Under per-key ordering: what the order check found.
    pub ordering: Option<OrderingReport>,
    pub relay_exit_codes: Vec<Option<i32>>,
    pub secrets_in_logs: usize,
    pub elapsed_seconds: f64,
}

/// The order check of a per-key run.
#[derive(Debug, Clone, Serialize)]
pub struct OrderingReport {
    pub keys: u64,
    /// Keys whose first deliveries did not come in their claim order: must be none.
    pub keys_out_of_order: Vec<String>,
}

impl ChaosReport {
    pub fn passed(&self) -> bool {
        self.ids_lost == 0
            && self.rows_pending == 0
            && self
                .ordering
                .as_ref()
                .is_none_or(|o| o.keys_out_of_order.is_empty())
            && self.duplicates <= self.duplicate_bound
            && self.secrets_in_logs == 0
            && self.relay_exit_codes.iter().all(|c| *c == Some(0))
    }

    pub fn markdown(&self) -> String {
        let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
        for fault in &self.faults {
            *by_kind.entry(fault.kind).or_default() += 1;
        }
        let kinds = by_kind
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = String::new();
        out.push_str(&format!("## Chaos run (seed {})\n\n", self.seed));
        out.push_str("| what | value |\n|---|---|\n");
        let rows = [
            ("rows", self.rows.to_string()),
            (
                "relays × workers × batch",
                format!(
                    "{} × {} × {}",
                    self.relays, self.workers_per_relay, self.batch_size
                ),
            ),
            (
                "faults injected",
                format!("{} ({kinds})", self.faults.len()),
            ),
            ("ids delivered", self.ids_delivered.to_string()),
            ("ids lost", self.ids_lost.to_string()),
            (
                "duplicates",
                format!(
                    "{} (bound the protocol promises: {})",
                    self.duplicates, self.duplicate_bound
                ),
            ),
            ("rows left pending", self.rows_pending.to_string()),
            (
                "ordering",
                match &self.ordering {
                    None => "unordered".into(),
                    Some(o) => format!("per key, {} keys", o.keys),
                },
            ),
            (
                "keys out of order",
                match &self.ordering {
                    None => "— (unordered run)".into(),
                    Some(o) if o.keys_out_of_order.is_empty() => "0".into(),
                    Some(o) => format!(
                        "{} ({})",
                        o.keys_out_of_order.len(),
                        o.keys_out_of_order
                            .iter()
                            .take(10)
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            ),
            (
                "relay exit codes on SIGTERM",
                format!("{:?}", self.relay_exit_codes),
            ),
            ("secrets found in logs", self.secrets_in_logs.to_string()),
            ("elapsed", format!("{:.1} s", self.elapsed_seconds)),
            (
                "verdict",
                if self.passed() {
                    "PASS".into()
                } else {
                    "FAIL".into()
                },
            ),
        ];
        for (what, value) in rows {
            out.push_str(&format!("| {what} | {value} |\n"));
        }
        out.push_str(
            "\n| # | fault | at (s) | recovered after (s) | detail |\n|---|---|---|---|---|\n",
        );
        for (i, f) in self.faults.iter().enumerate() {
            let recovery = f
                .recovery_seconds
                .map_or("—".to_string(), |r| format!("{r:.2}"));
            out.push_str(&format!(
                "| {} | {} | {:.1} | {recovery} | {} |\n",
                i + 1,
                f.kind,
                f.at_seconds,
                f.detail
            ));
        }
        out
    }
}
