//! Relay pods the kernel killed for exceeding their memory limit: the relay cannot report it,
//! so the operator reads it from the pods' container statuses. A pod down after the kill makes
//! the relay not Ready and Degraded with reason OOMKilled, naming the limit and the field to
//! raise, with one Warning event; the pod list is asked by the Deployment's selector.

use serde_json::{Value, json};

use super::scenario::{Scenario, assert_conditions, live_deployment, message, orders_relay};
use crate::reconcile::database::LagObservation;
use crate::reconcile::status::conditions::{DEGRADED, READY};

/// A relay pod in back-off after its container was OOM-killed twice, limited to 48Mi.
fn killed_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orders-7f9c-abcde", "namespace": "shop"},
        "spec": {"containers": [{
            "name": "relay", "image": "i",
            "resources": {"limits": {"memory": "48Mi"}},
        }]},
        "status": {"containerStatuses": [{
            "name": "relay", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
        }]},
    })
}

#[tokio::test]
async fn an_oom_killed_relay_pod_is_not_ready_degraded_and_announced() {
    let relay = orders_relay("outbox_messages");
    let live = live_deployment(&relay, 1);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| db.lag(|_| Ok(LagObservation::default())))
        .reads_secrets()
        .finds_deployment_with_pods(live, vec![killed_pod()])
        .keeps_deployment()
        .warning(
            "OOMKilled",
            "pod orders-7f9c-abcde killed for exceeding its memory limit of 48Mi",
        )
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "OOMKilled"),
                    (DEGRADED, "True", "OOMKilled"),
                ],
            );
            let ready = message(status, READY);
            assert!(
                ready.contains("spec.relay.resources.limits.memory"),
                "{ready}"
            );
        })
        .run()
        .await;
    assert!(outcome.result.is_ok());
    let listed = outcome
        .seen
        .iter()
        .find(|r| r.uri.starts_with("/api/v1/namespaces/shop/pods"))
        .expect("the pods were listed");
    assert!(
        listed.uri.contains("app.kubernetes.io%2Finstance%3Dorders"),
        "{}",
        listed.uri
    );
}
