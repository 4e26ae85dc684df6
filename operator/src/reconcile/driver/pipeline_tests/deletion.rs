//! Deleting an OutboxRelay: the finalizer is added to every relay, and on deletion the relay
//! pods are stopped, the database cleaned up as `cleanupPolicy` says, and the finalizer
//! removed; when the database cannot be reached, the deletion still completes after the bound.

use std::time::Duration;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use outbox_relay::table::cleanup::CleanupReport;
use serde_json::json;

use super::scenario::{Scenario, live_deployment, orders_relay};
use crate::crd::{CleanupPolicy, OutboxRelay};
use crate::reconcile::cleanup::FINALIZER;
use crate::reconcile::database::claims::Release;
use crate::reconcile::database::{CleanupRequest, CleanupRun};
use crate::reconcile::{Error, error_policy};
use crate::test_support::api_server::Reply;
use crate::test_support::database::DatabaseCall;

/// The fixtures' relay, deleted `ago`.
fn deleted(policy: CleanupPolicy, ago: Duration) -> OutboxRelay {
    let mut relay = orders_relay("outbox_messages");
    relay.spec.database.cleanup_policy = policy;
    let ago = SignedDuration::try_from(ago).unwrap();
    relay.metadata.deletion_timestamp = Some(Time(Timestamp::now() - ago));
    relay
}

fn gone() -> Reply {
    Reply::not_found("deployments.apps", "orders")
}

/// The finalizer helper's removal: test that index 0 is ours, then remove it.
fn removes_our_finalizer(body: &serde_json::Value) {
    assert_eq!(
        body,
        &json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ])
    );
}

fn cleanups(calls: &[DatabaseCall]) -> Vec<CleanupRequest> {
    calls
        .iter()
        .filter_map(|call| match call {
            DatabaseCall::CleanUp(request) => Some(request.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_relay_without_the_finalizer_gets_it_before_anything_else() {
    let mut relay = orders_relay("outbox_messages");
    relay.metadata.finalizers = None;
    let outcome = Scenario::new(relay)
        .patches_finalizers(vec![FINALIZER], |body| {
            assert_eq!(
                body,
                &json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
                ])
            );
        })
        .run()
        .await;
    // The patch wakes the next reconcile, which runs the pipeline.
    assert_eq!(outcome.action(), &Action::await_change());
    assert!(outcome.database.is_empty(), "{:?}", outcome.database);
}

#[tokio::test]
async fn retain_releases_the_claim_says_what_stays_and_lets_the_relay_go() {
    let outcome = Scenario::new(deleted(CleanupPolicy::Retain, Duration::from_secs(1)))
        .deletes_deployment(gone())
        .reads_secrets()
        .event_checked("DatabaseObjectsRetained", |body| {
            assert_eq!(body["type"], "Normal");
            let note = body["note"].as_str().unwrap();
            assert!(note.contains("released the claim"), "{note}");
            assert!(note.contains("index outbox_messages_pending_idx"), "{note}");
        })
        .patches_finalizers(vec![], removes_our_finalizer)
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::await_change());
    assert_eq!(
        cleanups(&outcome.database),
        vec![CleanupRequest {
            relay_name: "shop/orders".into(),
            remove_migration: false,
        }]
    );
    // Nothing of the pipeline runs on a deleted relay.
    assert_eq!(outcome.migrations(), 0);
    assert!(!outcome.seen.iter().any(|e| e.uri.contains("/status")));
}

#[tokio::test]
async fn delete_removes_the_migration_and_reports_it() {
    let outcome = Scenario::new(deleted(CleanupPolicy::Delete, Duration::from_secs(1)))
        .database(|db| {
            db.cleanup(|_| {
                Ok(CleanupRun {
                    claim: Release::Released,
                    removed: Some(CleanupReport {
                        index_dropped: Some("outbox_messages_pending_idx".into()),
                        report_rows_deleted: 2,
                        ..Default::default()
                    }),
                })
            })
        })
        .deletes_deployment(gone())
        .reads_secrets()
        .event_checked("DatabaseCleanedUp", |body| {
            let note = body["note"].as_str().unwrap();
            assert!(
                note.contains("dropped index outbox_messages_pending_idx"),
                "{note}"
            );
            assert!(note.contains("deleted 2 report row(s)"), "{note}");
        })
        .patches_finalizers(vec![], removes_our_finalizer)
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::await_change());
    let requests = cleanups(&outcome.database);
    assert!(
        requests.len() == 1 && requests[0].remove_migration,
        "{requests:?}"
    );
}

#[tokio::test]
async fn the_database_waits_until_the_relay_pods_are_gone() {
    let relay = deleted(CleanupPolicy::Delete, Duration::from_secs(1));
    let mut stopping = live_deployment(&relay, 2);
    stopping["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    stopping["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
    let mut delay = None;
    let outcome = Scenario::new(relay)
        .deletes_deployment(Reply::ok(stopping))
        .run_then(|relay, ctx, result| {
            delay = Some(error_policy(relay, result.as_ref().unwrap_err(), ctx));
        })
        .await;
    assert!(
        matches!(outcome.error(), Error::RelayPodsStopping),
        "{:?}",
        outcome.error()
    );
    assert!(outcome.database.is_empty(), "{:?}", outcome.database);
    let delete = &outcome.seen[0];
    assert_eq!(delete.method, Method::DELETE);
    assert_eq!(delete.body["propagationPolicy"], "Foreground", "{delete:?}");
    // No backoff for stopping pods: soon, and the Deployment's deletion wakes the relay anyway.
    assert_eq!(delay, Some(Action::requeue(Duration::from_secs(5))));
}

#[tokio::test]
async fn an_unreachable_database_is_retried_with_a_warning_within_the_bound() {
    let mut delays = Vec::new();
    let outcome = Scenario::new(deleted(CleanupPolicy::Delete, Duration::from_secs(10)))
        .settings(|s| s.cleanup_timeout = Duration::from_secs(30))
        .database(|db| {
            db.cleanup(|_| {
                Err(Error::DatabaseUnreachable(
                    "connection refused (postgres://app:***@db.shop.svc:5432/orders)".into(),
                ))
            })
        })
        .deletes_deployment(gone())
        .reads_secrets()
        .event_checked("CleanupFailed", |body| {
            assert_eq!(body["type"], "Warning");
            let note = body["note"].as_str().unwrap();
            assert!(note.contains("connection refused"), "{note}");
            assert!(note.contains("deleted anyway"), "{note}");
        })
        .run_then(|relay, ctx, result| {
            let error = result.as_ref().unwrap_err();
            for _ in 0..4 {
                delays.push(error_policy(relay.clone(), error, ctx.clone()));
            }
        })
        .await;
    assert!(matches!(outcome.error(), Error::DatabaseUnreachable(_)));
    // The finalizer stays: no PATCH of the relay.
    assert!(!outcome.seen.iter().any(|e| e.method == Method::PATCH));
    // The backoff (5, 10, 20, 40 s) never goes past the bound (about 20 s left): the last
    // two retries come when the bound ends, not later.
    assert_eq!(delays[0], Action::requeue(Duration::from_secs(5)));
    assert_eq!(delays[1], Action::requeue(Duration::from_secs(10)));
    assert_ne!(
        delays[3],
        Action::requeue(Duration::from_secs(40)),
        "{delays:?}"
    );
    assert_ne!(
        delays[2],
        Action::requeue(Duration::from_secs(20)),
        "{delays:?}"
    );
}

#[tokio::test]
async fn past_the_bound_the_finalizer_goes_with_a_warning_naming_what_stays() {
    let outcome = Scenario::new(deleted(CleanupPolicy::Delete, Duration::from_secs(301)))
        .deletes_deployment(gone())
        .reads_secret("orders-db", Reply::not_found("secrets", "orders-db"))
        .event_checked("CleanupAbandoned", |body| {
            assert_eq!(body["type"], "Warning");
            let note = body["note"].as_str().unwrap();
            for shown in [
                "Secret orders-db not found",
                "outbox_relay_claims",
                "index outbox_messages_pending_idx",
                "report rows of shop/orders",
            ] {
                assert!(note.contains(shown), "{shown:?} not in {note}");
            }
        })
        .patches_finalizers(vec![], removes_our_finalizer)
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::await_change());
    assert!(outcome.database.is_empty());
}

#[tokio::test]
async fn a_relay_deleted_with_orphan_keeps_its_pods() {
    let mut relay = deleted(CleanupPolicy::Retain, Duration::from_secs(1));
    relay.metadata.finalizers = Some(vec![FINALIZER.into(), "orphan".into()]);
    let outcome = Scenario::new(relay)
        .reads_secrets()
        .event("DatabaseObjectsRetained")
        .patches_finalizers(vec!["orphan"], removes_our_finalizer)
        .run()
        .await;
    assert!(!outcome.seen.iter().any(|e| e.method == Method::DELETE));
    assert_eq!(outcome.seen.last().unwrap().method, Method::PATCH);
}
