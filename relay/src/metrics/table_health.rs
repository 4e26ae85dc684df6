//! The table-health gauges: what keeps VACUUM from cleaning the outbox table, and how far it
//! is behind. Only the measuring pod of a relay sets them (like the backlog), once per report.

use prometheus::{Gauge, IntGauge, IntGaugeVec, Opts, Registry};

use super::registry::registered;

#[derive(Clone)]
pub struct TableHealthMetrics {
    /// How long the oldest snapshot, transaction, prepared transaction or replication slot has
    /// held back the cleanup horizon of the database.
    pub horizon_age_seconds: Gauge,
    /// The same age in transaction ids: the distance from the horizon to the next xid.
    pub horizon_age_xids: IntGauge,
    /// 1 for the holder of the horizon (kind, pid, application name); one series at a time.
    pub horizon_holder: IntGaugeVec,
    pub dead_tuples: IntGauge,
    pub live_tuples: IntGauge,
    /// Seconds since the table's last VACUUM or autovacuum; -1 when the statistics know none.
    pub last_vacuum_age_seconds: Gauge,
    pub pending_index_bytes: IntGauge,
    /// 1 when autovacuum runs, by scope: `server` (autovacuum and track_counts) and `table`.
    pub autovacuum_enabled: IntGaugeVec,
}

impl TableHealthMetrics {
    pub fn new(r: &Registry) -> Self {
        Self {
            horizon_age_seconds: registered(
                r,
                Gauge::new(
                    "outbox_relay_cleanup_horizon_age_seconds",
                    "How long the oldest snapshot, transaction or slot has held back VACUUM",
                ),
            ),
            horizon_age_xids: registered(
                r,
                IntGauge::new(
                    "outbox_relay_cleanup_horizon_age_xids",
                    "Transaction ids between the cleanup horizon and the next transaction id",
                ),
            ),
            horizon_holder: registered(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "outbox_relay_cleanup_horizon_holder",
                        "1 for what holds the cleanup horizon back (kind, pid, application_name)",
                    ),
                    &["kind", "pid", "application_name"],
                ),
            ),
            dead_tuples: registered(
                r,
                IntGauge::new(
                    "outbox_relay_table_dead_tuples",
                    "Dead tuples in the outbox table (pg_stat_user_tables.n_dead_tup)",
                ),
            ),
            live_tuples: registered(
                r,
                IntGauge::new(
                    "outbox_relay_table_live_tuples",
                    "Live tuples in the outbox table (pg_stat_user_tables.n_live_tup)",
                ),
            ),
            last_vacuum_age_seconds: registered(
                r,
                Gauge::new(
                    "outbox_relay_table_last_vacuum_age_seconds",
                    "Seconds since the outbox table's last VACUUM or autovacuum; -1 for never",
                ),
            ),
            pending_index_bytes: registered(
                r,
                IntGauge::new(
                    "outbox_relay_pending_index_bytes",
                    "Size of the pending-rows index in bytes",
                ),
            ),
            autovacuum_enabled: registered(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "outbox_relay_autovacuum_enabled",
                        "1 when autovacuum runs, for the server and for the outbox table",
                    ),
                    &["scope"],
                ),
            ),
        }
    }
}
