//! The table's health as the pods report it: a cleanup horizon held past
//! `spec.database.vacuumBlockedAfter` makes the relay Degraded (VacuumBlocked) with one Warning
//! event; its end clears the condition with one Normal event. The relay stays Ready meanwhile.

use outbox_relay::table::health::{HolderKind, HorizonHolder, TableHealth};

use super::scenario::{Scenario, assert_conditions, live_deployment, message, orders_relay};
use crate::crd::{OutboxRelay, OutboxRelayStatus, TableHealthStatus};
use crate::reconcile::database::LagObservation;
use crate::reconcile::status::conditions::{DEGRADED, READY};

/// What the measuring pod reported: a snapshot held open `age_seconds` by a report job.
fn reported(age_seconds: f64) -> TableHealth {
    TableHealth {
        horizon: Some(HorizonHolder {
            kind: HolderKind::Snapshot,
            pid: Some(4242),
            name: Some("billing-report".into()),
            user: Some("app".into()),
            state: Some("idle in transaction".into()),
            xid: "7001".into(),
            age_xids: 52_000,
            age_seconds,
            visible: true,
        }),
        dead_tuples: Some(180_000),
        live_tuples: Some(2_000),
        last_vacuum_age_seconds: Some(900.0),
        pending_index_bytes: Some(4_259_840),
        server_autovacuum: true,
        table_autovacuum: true,
        server_version_num: Some(160_004),
    }
}

fn relay_with_limit(limit: &str) -> OutboxRelay {
    let mut relay = orders_relay("outbox_messages");
    relay.spec.database.vacuum_blocked_after = limit.into();
    relay
}

/// `relay` as the last round left it: VacuumBlocked, the horizon `age_seconds` old.
fn blocked_before(mut relay: OutboxRelay, age_seconds: f64) -> OutboxRelay {
    relay.status = Some(OutboxRelayStatus {
        table_health: Some(TableHealthStatus {
            vacuum_blocked: true,
            horizon_age_seconds: age_seconds,
            ..Default::default()
        }),
        ..Default::default()
    });
    relay
}

fn scenario(relay: OutboxRelay, health: TableHealth) -> Scenario {
    let live = live_deployment(&relay, 1);
    Scenario::new(relay)
        .migrated_before()
        .database(move |db| {
            db.lag(move |_| {
                Ok(LagObservation {
                    reporting_pods: 1,
                    table_health: Some(health.clone()),
                    ..Default::default()
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .keeps_deployment()
}

#[tokio::test]
async fn a_horizon_held_past_the_limit_degrades_the_relay_naming_the_holder() {
    let outcome = scenario(relay_with_limit("5m"), reported(754.0))
        .warning(
            "VacuumBlocked",
            "pid 4242 (application \"billing-report\", user app, idle in transaction) holds a snapshot",
        )
        .writes_status(|status| {
            assert_conditions(
                status,
                &[(READY, "True", "Available"), (DEGRADED, "True", "VacuumBlocked")],
            );
            let degraded = message(status, DEGRADED);
            assert!(degraded.contains("held back for 12m 34s"), "{degraded}");
            assert!(degraded.contains("180000 dead tuples"), "{degraded}");
            let health = status.table_health.as_ref().expect("tableHealth");
            assert!(health.vacuum_blocked);
            assert_eq!(
                (health.horizon_age_seconds, health.horizon_age_xids),
                (754.0, 52_000)
            );
            assert_eq!(health.pending_index_bytes, Some(4_259_840));
            assert_eq!(status.postgres_version.as_deref(), Some("16.4"));
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

#[tokio::test]
async fn a_horizon_younger_than_the_limit_is_shown_but_not_degraded() {
    // The default limit is 10m: 9 minutes is a figure in the status, not a condition.
    let outcome = scenario(orders_relay("outbox_messages"), reported(540.0))
        .writes_status(|status| {
            assert_conditions(status, &[(DEGRADED, "False", "AsExpected")]);
            let health = status.table_health.as_ref().expect("tableHealth");
            assert!(!health.vacuum_blocked);
            assert_eq!(health.horizon_age_seconds, 540.0);
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

#[tokio::test]
async fn the_end_of_the_hold_clears_degraded_with_one_normal_event() {
    let relay = blocked_before(relay_with_limit("5m"), 754.0);
    let outcome = scenario(relay, reported(0.4))
        .event_checked("VacuumUnblocked", |body| {
            assert_eq!(body["type"], "Normal", "{body}");
        })
        .writes_status(|status| {
            assert_conditions(status, &[(DEGRADED, "False", "AsExpected")]);
            assert!(!status.table_health.as_ref().unwrap().vacuum_blocked);
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

#[tokio::test]
async fn a_hold_that_goes_on_is_not_announced_again() {
    let relay = blocked_before(relay_with_limit("5m"), 700.0);
    // No event step: the scripted API server fails the test on an unexpected request.
    let outcome = scenario(relay, reported(760.0))
        .writes_status(|status| {
            assert_conditions(status, &[(DEGRADED, "True", "VacuumBlocked")]);
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
}
