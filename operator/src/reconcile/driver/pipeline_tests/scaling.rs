//! The autoscaler through the pipeline: what the database says about the lag becomes replicas,
//! an event and the scaling conditions.

use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::json;

use super::scenario::{Scenario, assert_conditions, live_deployment, message, orders_relay};
use crate::crd::OutboxRelay;
use crate::reconcile::database::{LagObservation, LagQuery, RateShare};
use crate::test_support::database::{DatabaseCall, nothing_reported};

/// A relay with a scaling block.
fn scaling_relay(min: i32, max: i32, target: i64) -> OutboxRelay {
    let mut relay = orders_relay("outbox_messages");
    let scaling =
        json!({"minReplicas": min, "maxReplicas": max, "targetBacklogPerReplica": target});
    relay.spec.scaling = Some(serde_json::from_value(scaling).unwrap());
    relay
}

fn lag_queries(calls: &[DatabaseCall]) -> Vec<&LagQuery> {
    let queries = calls.iter().filter_map(|call| match call {
        DatabaseCall::ObserveLag(query) => Some(query),
        _ => None,
    });
    queries.collect()
}

#[tokio::test]
async fn reported_backlog_scales_up_within_the_rate_policy_with_an_event() {
    let relay = scaling_relay(1, 10, 1000);
    let live = live_deployment(&relay, 1);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            // Two pods reported: one measured 9,000 pending rows; they publish 120 and 80/s.
            db.lag(|_| {
                Ok(LagObservation {
                    backlog: Some(9_000),
                    backlog_age: Some(Duration::from_secs(2)),
                    publish_rate: 200.0,
                    reporting_pods: 2,
                    ..Default::default()
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        // 9 asked for; from 1 pod the default policies allow max(+100 %, +4) = 5.
        .applies_deployment(2, 1, |body| assert_eq!(body["spec"]["replicas"], 5))
        .event("DeploymentUpdated")
        .event_checked("ScaledUp", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(
                note.contains("from 1 to 5 replicas: backlog 9000 asks for 9"),
                "{note}"
            );
        })
        .writes_status(|status| {
            assert_eq!(status.desired_replicas, Some(5));
            assert_eq!(status.backlog, Some(9_000));
            assert_eq!(status.publish_rate, Some(200.0));
            assert!(status.last_scale_time.is_some());
            assert_conditions(
                status,
                &[
                    ("ScalingActive", "True", "ValidBacklog"),
                    ("ScalingLimited", "True", "ScaleUpLimit"),
                ],
            );
        })
        .run()
        .await;
    assert_eq!(outcome.action(), &Action::requeue(Duration::from_secs(15)));
    let queries = lag_queries(&outcome.database);
    assert_eq!(queries.len(), 1);
    assert_eq!(queries[0].relay_name, "shop/orders");
    assert_eq!(queries[0].running, 1);
}

#[tokio::test]
async fn at_zero_pods_the_operator_measures_and_wakes_the_relay() {
    let relay = scaling_relay(0, 4, 1000);
    let live = live_deployment(&relay, 0);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            db.lag(|query| {
                Ok(LagObservation {
                    backlog: Some(30),
                    ..nothing_reported(query)
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 0, |body| assert_eq!(body["spec"]["replicas"], 1))
        .event("DeploymentUpdated")
        .event_checked("ScaledUp", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("from 0 to 1 replicas: backlog 30"), "{note}");
        })
        .writes_status(|status| {
            assert_eq!(status.backlog, Some(30));
            let active = message(status, "ScalingActive");
            assert!(active.contains("measured by the operator"), "{active}");
        })
        .run()
        .await;
    // The database was asked with no pod running, which is what makes it count.
    assert_eq!(lag_queries(&outcome.database)[0].running, 0);
}

#[tokio::test]
async fn stale_reports_run_the_fallback_never_zero() {
    let mut relay = scaling_relay(0, 10, 1000);
    relay.spec.scaling.as_mut().unwrap().fallback.replicas = 2;
    // Three pods run, none has reported: the backlog is unknown.
    let live = live_deployment(&relay, 3);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 2, |body| assert_eq!(body["spec"]["replicas"], 2))
        .event("DeploymentUpdated")
        .event_checked("ScaledDown", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("fallback of 2 replicas"), "{note}");
        })
        .writes_status(|status| {
            assert_eq!(status.desired_replicas, Some(2));
            assert_conditions(
                status,
                &[
                    ("ScalingActive", "False", "StaleReports"),
                    ("ScalingLimited", "True", "StaleReports"),
                ],
            );
        })
        .run()
        .await;
    let queries = lag_queries(&outcome.database);
    assert_eq!(queries[0].running, 3);
    assert_eq!(
        queries[0].stale_after,
        Duration::from_secs(60),
        "the CRD's default"
    );
}

/// `spec.suspend` under autoscaling: whatever the backlog, zero pods; the autoscaler is not
/// asked (no ScaledDown event, its conditions say Suspended), the operator counts the backlog
/// itself from this round on, and one Suspended event marks it.
#[tokio::test]
async fn a_suspended_relay_goes_to_zero_pods_and_the_operator_measures_the_backlog() {
    let mut relay = scaling_relay(2, 10, 100);
    relay.spec.suspend = true;
    // Three pods run; a backlog that would ask for ten.
    let live = live_deployment(&relay, 3);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            db.lag(|query| {
                Ok(LagObservation {
                    backlog: Some(5_000),
                    ..nothing_reported(query)
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 0, |body| assert_eq!(body["spec"]["replicas"], 0))
        .event("DeploymentUpdated")
        .event_checked("Suspended", |body| {
            assert_eq!(body["type"], "Normal");
            let note = body["note"].as_str().unwrap_or_default();
            assert!(
                note.contains("suspended by spec.suspend") && note.contains("5000 rows wait"),
                "{note}"
            );
        })
        .writes_status(|status| {
            assert_eq!(status.desired_replicas, Some(0));
            assert_eq!(status.backlog, Some(5_000));
            assert_conditions(
                status,
                &[
                    ("Suspended", "True", "SuspendedBySpec"),
                    ("Ready", "True", "Suspended"),
                    ("Reconciling", "False", "Reconciled"),
                    ("Stalled", "False", "Reconciled"),
                    ("ScalingActive", "False", "Suspended"),
                ],
            );
        })
        .run()
        .await;
    // Asked with no pod counted as running, although three still did: the operator counts.
    assert_eq!(lag_queries(&outcome.database)[0].running, 0);
}

/// `suspend: false` again: the autoscaler starts from the zero pods it finds, on the backlog
/// the operator measured, and one Resumed event marks it.
#[tokio::test]
async fn a_resumed_relay_scales_from_zero_on_the_measured_backlog() {
    let mut relay = scaling_relay(1, 10, 100);
    let mut suspended_status: crate::crd::OutboxRelayStatus = serde_json::from_value(json!({
        "conditions": [{"type": "Suspended", "status": "True", "reason": "SuspendedBySpec",
            "message": "delivery is suspended", "lastTransitionTime": "2026-12-05T06:00:00Z"}]
    }))
    .unwrap();
    suspended_status.replicas = Some(0);
    relay.status = Some(suspended_status);
    let live = live_deployment(&relay, 0);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            db.lag(|query| {
                Ok(LagObservation {
                    backlog: Some(5_000),
                    ..nothing_reported(query)
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        // 50 asked for; from zero the default policies allow four.
        .applies_deployment(2, 0, |body| assert_eq!(body["spec"]["replicas"], 4))
        .event("DeploymentUpdated")
        .event("ScaledUp")
        .event_checked("Resumed", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("4 relay pods asked for"), "{note}");
        })
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    ("Suspended", "False", "Resumed"),
                    ("ScalingActive", "True", "ValidBacklog"),
                ],
            );
        })
        .run()
        .await;
    assert_eq!(lag_queries(&outcome.database)[0].running, 0);
}

#[tokio::test]
async fn a_rate_limit_is_divided_among_the_pods_and_caps_the_scale_up() {
    let mut relay = scaling_relay(1, 10, 1000);
    relay.spec.relay.max_rate = Some(1_000.0);
    let live = live_deployment(&relay, 1);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            // One pod, its share the whole 1,000 msg/s, publishes 250/s: not held back by the
            // limit, and 4 such pods reach it; the backlog asks for 9.
            db.lag(|_| {
                Ok(LagObservation {
                    backlog: Some(9_000),
                    backlog_age: Some(Duration::from_secs(2)),
                    publish_rate: 250.0,
                    reporting_pods: 1,
                    max_rate: Some(1_000.0),
                    limited_publish_rate: 250.0,
                    ..Default::default()
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 1, |body| assert_eq!(body["spec"]["replicas"], 4))
        .event("DeploymentUpdated")
        .event_checked("ScaledUp", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("spec.relay.maxRate 1000"), "{note}");
        })
        .writes_status(|status| {
            assert_eq!(status.desired_replicas, Some(4));
            let rate = status.rate_limit.as_ref().expect("status.rateLimit");
            assert_eq!((rate.per_pod_rate, rate.held_back), (250.0, false));
            assert_conditions(status, &[("ScalingLimited", "True", "RateLimited")]);
        })
        .run()
        .await;
    // The share for 4 pods, written in the round that asks for them.
    let shares: Vec<&Option<RateShare>> = outcome
        .database
        .iter()
        .filter_map(|call| match call {
            DatabaseCall::WriteRateShare(share) => Some(share),
            _ => None,
        })
        .collect();
    assert_eq!(
        shares,
        [&Some(RateShare {
            per_pod_rate: 250.0,
            max_rate: 1_000.0,
            replicas: 4
        })]
    );
}

/// A relay's status while suspended, as the rounds before wrote it.
fn suspended_status() -> crate::crd::OutboxRelayStatus {
    let mut status: crate::crd::OutboxRelayStatus = serde_json::from_value(json!({
        "conditions": [{"type": "Suspended", "status": "True", "reason": "SuspendedBySpec",
            "message": "delivery is suspended", "lastTransitionTime": "2026-12-05T06:00:00Z"}]
    }))
    .unwrap();
    status.replicas = Some(0);
    status
}

fn backlog_of(
    rows: i64,
) -> impl Fn(&LagQuery) -> Result<LagObservation, crate::reconcile::Error> + Send + 'static {
    move |query| {
        Ok(LagObservation {
            backlog: Some(rows),
            ..nothing_reported(query)
        })
    }
}

/// `scaling.paused` keeps the count it finds, and a suspension leaves zero: the count before
/// the suspension is kept on the Deployment, on the cluster, so a paused relay resumes with
/// it, even when the operator restarted in between (each round here is a fresh process: no
/// history, no memory).
#[tokio::test]
async fn a_paused_relay_resumes_with_the_replicas_it_had_before_even_after_a_restart() {
    use std::sync::{Arc, Mutex};
    const BEFORE: &str = "outboxrelay.io/replicas-before-suspend";

    let mut relay = scaling_relay(1, 10, 100);
    relay.spec.scaling.as_mut().unwrap().paused = true;
    relay.spec.suspend = true;
    // Paused at three pods; a backlog that would ask for fifty.
    let running = live_deployment(&relay, 3);
    let applied = Arc::new(Mutex::new(None));
    let keep = applied.clone();
    Scenario::new(relay.clone())
        .migrated_before()
        .database(|db| db.lag(backlog_of(5_000)))
        .reads_secrets()
        .finds_deployment(running)
        .applies_deployment(2, 0, move |body| {
            assert_eq!(body["spec"]["replicas"], 0);
            assert_eq!(body["metadata"]["annotations"][BEFORE], "3", "{body}");
            *keep.lock().unwrap() = Some(body.clone());
        })
        .event("DeploymentUpdated")
        .event("Suspended")
        .writes_status(|status| assert_eq!(status.desired_replicas, Some(0)))
        .run()
        .await;
    let suspended = super::scenario::served(applied.lock().unwrap().take().unwrap(), 2, 0, 0);

    // The operator restarts while suspended: the next round finds zero pods and the count on
    // the Deployment, and leaves both as they are.
    relay.status = Some(suspended_status());
    Scenario::new(relay.clone())
        .migrated_before()
        .database(|db| db.lag(backlog_of(5_000)))
        .reads_secrets()
        .finds_deployment(suspended.clone())
        .keeps_deployment()
        .writes_status(|status| assert_eq!(status.desired_replicas, Some(0)))
        .run()
        .await;

    // Resumed, by a fresh process again: three pods, still paused, and the annotation goes
    // (server-side apply drops what the operator no longer applies).
    relay.spec.suspend = false;
    Scenario::new(relay)
        .migrated_before()
        .database(|db| db.lag(backlog_of(5_000)))
        .reads_secrets()
        .finds_deployment(suspended)
        .applies_deployment(3, 0, |body| {
            assert_eq!(body["spec"]["replicas"], 3);
            let annotations = body["metadata"]["annotations"].as_object().unwrap();
            assert!(!annotations.contains_key(BEFORE), "{body}");
        })
        .event("DeploymentUpdated")
        .event("ScaledUp")
        .event_checked("Resumed", |body| {
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("3 relay pods asked for"), "{note}");
        })
        .writes_status(|status| {
            assert_eq!(status.desired_replicas, Some(3));
            assert_conditions(
                status,
                &[
                    ("Suspended", "False", "Resumed"),
                    ("ScalingActive", "False", "Paused"),
                ],
            );
        })
        .run()
        .await;
}

/// Without `scaling`, a resume asks for `spec.replicas`, whatever ran before the suspension,
/// and drops the remembered count.
#[tokio::test]
async fn a_manual_relay_resumes_with_spec_replicas() {
    let mut relay = orders_relay("outbox_messages");
    relay.spec.replicas = 2;
    relay.status = Some(suspended_status());
    let mut live = live_deployment(&relay, 0);
    live["metadata"]["annotations"]["outboxrelay.io/replicas-before-suspend"] = json!("5");
    Scenario::new(relay)
        .migrated_before()
        .database(|db| db.lag(backlog_of(40)))
        .reads_secrets()
        .finds_deployment(live)
        .applies_deployment(2, 0, |body| {
            assert_eq!(body["spec"]["replicas"], 2);
            let annotations = body["metadata"]["annotations"].as_object().unwrap();
            assert!(
                !annotations.contains_key("outboxrelay.io/replicas-before-suspend"),
                "{body}"
            );
        })
        .event("DeploymentUpdated")
        .event("Resumed")
        .writes_status(|status| assert_eq!(status.desired_replicas, Some(2)))
        .run()
        .await;
}
