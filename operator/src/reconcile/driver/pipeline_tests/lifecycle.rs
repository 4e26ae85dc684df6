//! A relay's life when all goes well: created, left alone, restored, updated.

use std::time::Duration;

use http::{Method, StatusCode};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use outbox_relay::table::migrate::{IndexAction, MigrationReport};
use serde_json::json;

use super::scenario::{
    Scenario, assert_conditions, live_deployment, message, orders_relay, served,
};
use crate::crd::OutboxRelay;
use crate::reconcile::database::{LagObservation, MigrationRun};
use crate::reconcile::input::validate::validate;
use crate::reconcile::migrate::MigrationOutcome;
use crate::reconcile::scaling::recommend::ScalingOutcome;
use crate::reconcile::status::conditions::{DEGRADED, INDEX_READY, READY};
use crate::reconcile::status::{Observation, healthy_status};

#[tokio::test]
async fn new_relay_is_migrated_deployed_and_reported() {
    let relay = orders_relay("outbox_messages");
    let outcome = Scenario::new(relay)
        .reads_secrets()
        .event("IndexCreated")
        .finds_no_deployment()
        .applies_deployment(1, 0, |body| {
            assert_eq!(body["kind"], "Deployment");
            let owner = &body["metadata"]["ownerReferences"][0];
            assert_eq!(owner["kind"], "OutboxRelay");
            assert_eq!(owner["uid"], "uid-orders");
            assert_eq!(body["spec"]["replicas"], 1);
        })
        .event("DeploymentCreated")
        .writes_status(|status| {
            assert_eq!(status.observed_generation, Some(1));
            assert_conditions(
                status,
                &[
                    (INDEX_READY, "True", "IndexCreated"),
                    (READY, "False", "Progressing"),
                    (DEGRADED, "False", "AsExpected"),
                ],
            );
            assert_eq!(status.desired_replicas, Some(1));
            assert_eq!(
                status.selector.as_deref(),
                Some("app.kubernetes.io/instance=orders,app.kubernetes.io/name=outbox-relay")
            );
            let index = message(status, INDEX_READY);
            assert!(index.contains("outbox_messages"), "{index}");
        })
        .run()
        .await;

    assert_eq!(outcome.action(), &Action::requeue(Duration::from_secs(300)));
    assert_eq!(outcome.migrations(), 1);
    let apply = outcome
        .seen
        .iter()
        .find(|e| e.method == Method::PATCH && e.uri.contains("/deployments/"))
        .unwrap();
    assert!(
        apply.uri.contains("fieldManager=outbox-operator"),
        "{}",
        apply.uri
    );
    assert!(apply.uri.contains("force=true"), "{}", apply.uri);
}

#[tokio::test]
async fn a_server_without_autovacuum_is_warned_about_before_the_index_event() {
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .database(|db| {
            db.migrated(|report| MigrationReport {
                server_autovacuum_off: true,
                ..report
            })
        })
        .reads_secrets()
        .warning("AutovacuumOff", "VACUUM the outbox table")
        .event("IndexCreated")
        .creates_deployment()
        .writes_status(|_| {})
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

/// A relay whose Deployment and status are exactly what the operator would write.
fn settled_relay(generation: i64) -> (OutboxRelay, serde_json::Value) {
    let mut relay = orders_relay("outbox_messages");
    relay.metadata.generation = Some(generation);
    let live = live_deployment(&relay, 1);
    let live_typed: Deployment = serde_json::from_value(live.clone()).unwrap();
    let migrated = MigrationOutcome::AlreadyMigrated;
    // Manual mode, one pod, no report yet: what the reconcile will observe.
    let scaling = ScalingOutcome {
        replicas: 1,
        previous: 1,
        lag: Some(LagObservation::default()),
        lag_problem: None,
        recommendation: None,
        observation: None,
        last_scale_time: None,
        suspended: false,
        replicas_before_suspend: None,
    };
    let plan = validate(&relay.spec).unwrap();
    let observation = Observation {
        generation: Some(generation),
        table: plan.table.name.to_string(),
        migration: &migrated,
        deployment: &live_typed,
        desired_replicas: 1,
        selector: crate::reconcile::build::selector_string(&relay),
        scaling: &scaling,
        vacuum_blocked_after: plan.vacuum_blocked_after,
        oom_kills: &[],
        rate_share: None,
    };
    relay.status = Some(healthy_status(None, &observation, Timestamp::now()));
    (relay, live)
}

#[tokio::test]
async fn unchanged_relay_causes_no_writes() {
    let (relay, live) = settled_relay(1);
    assert_conditions(
        relay.status.as_ref().unwrap(),
        &[(READY, "True", "Available")],
    );
    let outcome = Scenario::new(relay)
        .migrated_before()
        .reads_secrets()
        .finds_deployment(live)
        .keeps_deployment()
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::requeue(Duration::from_secs(300)));
    assert!(
        outcome.seen.iter().all(|e| e.method == Method::GET),
        "{:#?}",
        outcome.seen
    );
    assert_eq!(outcome.migrations(), 0);
}

#[tokio::test]
async fn a_disruption_budget_deleted_by_hand_is_put_back() {
    let (relay, live) = settled_relay(1);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .reads_secrets()
        .finds_deployment(live)
        .restores_deleted_budget()
        .run()
        .await;
    assert!(outcome.result.is_ok());
    let writes: Vec<_> = outcome
        .seen
        .iter()
        .filter(|e| e.method != Method::GET)
        .map(|e| e.uri.split('?').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        writes,
        ["/apis/policy/v1/namespaces/shop/poddisruptionbudgets/orders"],
        "only the budget is written"
    );
}

#[tokio::test]
async fn replicas_changed_behind_our_back_are_restored() {
    let (relay, mut live) = settled_relay(1);
    live["spec"]["replicas"] = json!(3);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(1, 1, |body| assert_eq!(body["spec"]["replicas"], 1))
        .event("DeploymentUpdated")
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

#[tokio::test]
async fn a_deployment_the_api_server_refuses_is_reported() {
    let mut relay = orders_relay("outbox_messages");
    let labels = &mut relay.spec.relay.pod_labels;
    labels.insert("bad label!".into(), "x".into());
    let outcome = Scenario::new(relay)
        .reads_secrets()
        .event("IndexCreated")
        .finds_no_deployment()
        .refuses_deployment(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Deployment.apps \"orders\" is invalid: spec.template.metadata.labels: Invalid value: \"bad label!\"",
        )
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "DeploymentRejected"),
                    (DEGRADED, "True", "DeploymentRejected"),
                ],
            );
            let ready = message(status, READY);
            assert!(ready.contains("bad label!"), "{ready}");
        })
        .event("DeploymentRejected")
        .run()
        .await;
    assert_eq!(outcome.error().metric_label(), "apply_deployment");
}

#[tokio::test]
async fn spec_change_updates_the_deployment_and_advances_observed_generation() {
    // Generation 1 was settled; generation 2 is migrated again, the index is already valid,
    // so there is no index event.
    let (mut relay, live) = settled_relay(1);
    relay.metadata.generation = Some(2);
    relay.spec.relay.batch_size = 2000;
    let outcome = Scenario::new(relay)
        .database(|db| {
            db.migrated(|report| MigrationReport {
                index: IndexAction::AlreadyValid,
                reports_table_created: false,
                frontier_created: false,
                autovacuum_changed: false,
                ..report
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 1, |body| {
            let args = body["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap();
            let at = args.iter().position(|a| a == "--batch-size").unwrap();
            assert_eq!(args[at + 1], "2000");
        })
        .event("DeploymentUpdated")
        .writes_status(|status| {
            assert_eq!(status.observed_generation, Some(2));
            assert_conditions(
                status,
                &[
                    (INDEX_READY, "True", "IndexValid"),
                    (READY, "True", "Available"),
                ],
            );
            let ready =
                crate::reconcile::status::conditions::find(&status.conditions, READY).unwrap();
            assert_eq!(ready.observed_generation, Some(2));
        })
        .run()
        .await;
    assert_eq!(outcome.migrations(), 1);
}

#[tokio::test]
async fn an_invalid_index_rebuilt_is_a_warning_and_the_index_ready() {
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .database(|db| {
            db.migrated(|report| MigrationReport {
                index: IndexAction::RebuiltInvalid,
                ..report
            })
        })
        .reads_secrets()
        .warning("InvalidIndexRebuilt", "INVALID")
        .creates_deployment()
        .writes_status(|status| {
            assert_conditions(status, &[(INDEX_READY, "True", "InvalidIndexRebuilt")]);
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
}

#[tokio::test]
async fn busy_migration_lock_does_not_block_the_reconcile() {
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .database(|db| db.migration(|_| Ok(MigrationRun::LockBusy)))
        .reads_secrets()
        .creates_deployment()
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (INDEX_READY, "Unknown", "MigrationInProgress"),
                    (READY, "False", "MigrationPending"),
                ],
            );
        })
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::requeue(Duration::from_secs(5)));
}

#[test]
fn a_deployment_status_round_trips() {
    // Guards the fixtures: what `served` writes must read back as a DeploymentStatus.
    let value = served(
        json!({"metadata": {}, "spec": {"selector": {}, "template": {}}}),
        3,
        1,
        2,
    );
    let deployment: Deployment = serde_json::from_value(value).unwrap();
    assert_eq!(
        deployment.status,
        Some(DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(2),
            ready_replicas: Some(1),
            updated_replicas: Some(2),
            ..Default::default()
        })
    );
}
