//! The table's health in the status (pure): the figures the measuring pod reported, and
//! whether the cleanup horizon has been held back long enough to call the relay Degraded
//! (`VacuumBlocked`). Split from [`status`](crate::reconcile::status) so the words of the
//! condition and of the events are written once.

use std::time::Duration;

use outbox_relay::table::health::TableHealth;

use crate::crd::TableHealthStatus;

/// The condition and event reason while the horizon is held back.
pub const VACUUM_BLOCKED: &str = "VacuumBlocked";
/// The event reason when it is released again.
pub const VACUUM_UNBLOCKED: &str = "VacuumUnblocked";

/// The status block for `health`, with `vacuum_blocked` decided against the spec's limit.
pub fn table_health_status(health: &TableHealth, blocked_after: Duration) -> TableHealthStatus {
    let age = health.horizon_age_seconds();
    let holder = health.horizon.as_ref().map(|holder| {
        if holder.visible {
            holder.to_string()
        } else {
            // The age is then a lower bound, and the fix is a grant: say both.
            format!(
                "{holder}; its age counts from when the relay first saw it, since the relay's \
                 role may not see another role's sessions (grant it pg_read_all_stats)"
            )
        }
    });
    TableHealthStatus {
        vacuum_blocked: age >= blocked_after.as_secs_f64(),
        horizon_age_seconds: (age * 10.0).round() / 10.0,
        horizon_age_xids: health.horizon.as_ref().map_or(0, |h| h.age_xids),
        horizon_holder: holder,
        dead_tuples: health.dead_tuples,
        live_tuples: health.live_tuples,
        last_vacuum_age_seconds: health.last_vacuum_age_seconds.map(f64::round),
        pending_index_bytes: health.pending_index_bytes,
        autovacuum: health.server_autovacuum && health.table_autovacuum,
    }
}

/// The `Degraded` message and the `VacuumBlocked` event's note.
pub fn vacuum_blocked_message(health: &TableHealthStatus, table: &str) -> String {
    let held = humantime::format_duration(Duration::from_secs(health.horizon_age_seconds as u64));
    let holder = health
        .horizon_holder
        .as_deref()
        .unwrap_or("an unknown session");
    let dead = health
        .dead_tuples
        .map_or(String::new(), |dead| format!(" ({dead} dead tuples now)"));
    format!(
        "the cleanup horizon has been held back for {held} ({} transactions): {holder}. VACUUM \
         cannot remove the dead rows of table {table}{dead} until it ends, and claims slow down; \
         end that transaction or session (runbook: docs/operations/cleanup-horizon.md)",
        health.horizon_age_xids
    )
}

/// The `VacuumUnblocked` event's note.
pub fn vacuum_unblocked_message(health: &TableHealthStatus, table: &str) -> String {
    format!(
        "the cleanup horizon is no longer held back (now {:.0} s old): VACUUM can clean table \
         {table} again",
        health.horizon_age_seconds
    )
}

/// How the blocked state moved between the status read and the status computed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VacuumChange {
    Started,
    Cleared,
    Unchanged,
}

pub fn vacuum_change(
    previous: Option<&TableHealthStatus>,
    current: Option<&TableHealthStatus>,
) -> VacuumChange {
    let was = previous.is_some_and(|h| h.vacuum_blocked);
    match (was, current.map(|h| h.vacuum_blocked)) {
        (false, Some(true)) => VacuumChange::Started,
        (true, Some(false)) => VacuumChange::Cleared,
        _ => VacuumChange::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use outbox_relay::table::health::{HolderKind, HorizonHolder};

    use super::*;

    fn health(age_seconds: f64, visible: bool) -> TableHealth {
        TableHealth {
            horizon: Some(HorizonHolder {
                kind: HolderKind::Snapshot,
                pid: Some(4242),
                name: Some("billing-report".into()),
                user: visible.then(|| "app".into()),
                state: visible.then(|| "idle in transaction".into()),
                xid: "900".into(),
                age_xids: 1234,
                age_seconds,
                visible,
            }),
            dead_tuples: Some(120_000),
            live_tuples: Some(5_000),
            last_vacuum_age_seconds: Some(61.4),
            pending_index_bytes: Some(16_384),
            server_autovacuum: true,
            table_autovacuum: true,
            server_version_num: Some(170_002),
        }
    }

    #[test]
    fn the_horizon_blocks_vacuum_from_the_limit_on() {
        let limit = Duration::from_secs(600);
        assert!(!table_health_status(&health(599.0, true), limit).vacuum_blocked);
        assert!(table_health_status(&health(600.0, true), limit).vacuum_blocked);
        let nobody = TableHealth {
            horizon: None,
            ..health(0.0, true)
        };
        let status = table_health_status(&nobody, limit);
        assert_eq!(
            (status.vacuum_blocked, status.horizon_age_seconds),
            (false, 0.0)
        );
    }

    #[test]
    fn the_message_names_the_holder_the_age_and_the_fix() {
        let status = table_health_status(&health(750.0, true), Duration::from_secs(600));
        let message = vacuum_blocked_message(&status, "orders");
        for part in [
            "held back for 12m 30s (1234 transactions)",
            "pid 4242 (application \"billing-report\", user app, idle in transaction) holds a snapshot",
            "table orders (120000 dead tuples now)",
            "docs/operations/cleanup-horizon.md",
        ] {
            assert!(message.contains(part), "{message}");
        }
        let hidden = table_health_status(&health(750.0, false), Duration::from_secs(600));
        let message = vacuum_blocked_message(&hidden, "orders");
        assert!(message.contains("grant it pg_read_all_stats"), "{message}");
    }

    #[test]
    fn events_mark_the_start_and_the_end_only() {
        let limit = Duration::from_secs(600);
        let blocked = table_health_status(&health(700.0, true), limit);
        let fine = table_health_status(&health(3.0, true), limit);
        assert_eq!(vacuum_change(None, Some(&blocked)), VacuumChange::Started);
        assert_eq!(
            vacuum_change(Some(&fine), Some(&blocked)),
            VacuumChange::Started
        );
        assert_eq!(
            vacuum_change(Some(&blocked), Some(&blocked)),
            VacuumChange::Unchanged
        );
        assert_eq!(
            vacuum_change(Some(&blocked), Some(&fine)),
            VacuumChange::Cleared
        );
        assert_eq!(vacuum_change(Some(&blocked), None), VacuumChange::Unchanged);
        assert_eq!(vacuum_change(None, Some(&fine)), VacuumChange::Unchanged);
    }
}
