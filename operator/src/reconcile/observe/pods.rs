//! The relay pods as the kubelet reports them. A relay that the kernel kills for exceeding its
//! memory limit says nothing in its reports (it has no chance to), so the operator reads the
//! pods' container statuses: `OOMKilled` as the current or the last termination.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::reconcile::build::CONTAINER_NAME as RELAY_CONTAINER;

/// The kubelet's termination reason for a container the kernel's OOM killer ended.
pub const OOM_KILLED: &str = "OOMKilled";

/// A relay pod whose container was killed for exceeding its memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub pod: String,
    /// The container's memory limit as the pod spec says it (`128Mi`), if it has one.
    pub limit: Option<String>,
    /// How often the kubelet restarted the container.
    pub restarts: i32,
    /// Whether the container is down now (terminated or waiting to restart), rather than
    /// running again after the kill.
    pub down: bool,
}

/// Lists the relay's pods (by the Deployment's selector) and finds those OOM-killed. A pod
/// list that fails is logged and taken as none: it must not stop the reconcile.
pub async fn observe_oom_kills(pods: &Api<Pod>, selector: &str) -> Vec<OomKill> {
    match pods.list(&ListParams::default().labels(selector)).await {
        Ok(list) => oom_kills(&list.items),
        Err(error) => {
            tracing::warn!(%error, "relay pods not listed this round");
            Vec::new()
        }
    }
}

/// The pods whose relay container was OOM-killed, as its current or last termination.
pub fn oom_kills(pods: &[Pod]) -> Vec<OomKill> {
    let mut kills: Vec<OomKill> = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let status = relay_container_status(pod)?;
            let now_killed = terminated_reason(status, false) == Some(OOM_KILLED);
            let last_killed = terminated_reason(status, true) == Some(OOM_KILLED);
            if !now_killed && !last_killed {
                return None;
            }
            let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
            Some(OomKill {
                pod: pod.name_any(),
                limit: memory_limit(pod),
                restarts: status.restart_count,
                down: !running,
            })
        })
        .collect();
    kills.sort_by(|a, b| a.pod.cmp(&b.pod));
    kills
}

/// `pod orders-7f9c was killed for exceeding its memory limit of 64Mi (2 restarts): …`
pub fn oom_message(kills: &[OomKill]) -> String {
    let pods = match kills {
        [one] => format!("pod {}", one.pod),
        many => format!(
            "{} pods ({})",
            many.len(),
            many.iter()
                .map(|k| k.pod.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let limit = kills
        .iter()
        .find_map(|k| k.limit.as_deref())
        .map_or("its memory limit".to_string(), |limit| {
            format!("its memory limit of {limit}")
        });
    let restarts: i32 = kills.iter().map(|k| k.restarts).sum();
    format!(
        "{pods} killed for exceeding {limit} ({restarts} restarts): raise \
         spec.relay.resources.limits.memory, or lower spec.relay.batchSize or \
         spec.relay.workersPerPod (each worker holds a batch of rows with their payloads in \
         memory)"
    )
}

fn relay_container_status(pod: &Pod) -> Option<&ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|s| s.name == RELAY_CONTAINER)
        .or(statuses.first())
}

fn terminated_reason(status: &ContainerStatus, last: bool) -> Option<&str> {
    let state = if last {
        status.last_state.as_ref()
    } else {
        status.state.as_ref()
    };
    state?.terminated.as_ref()?.reason.as_deref()
}

fn memory_limit(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let container = spec
        .containers
        .iter()
        .find(|c| c.name == RELAY_CONTAINER)
        .or(spec.containers.first())?;
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    limits.get("memory").map(|quantity| quantity.0.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, container_status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{
                "name": RELAY_CONTAINER,
                "resources": {"limits": {"memory": "64Mi"}},
            }]},
            "status": {"containerStatuses": [container_status]},
        }))
        .unwrap()
    }

    fn status(
        state: serde_json::Value,
        last: serde_json::Value,
        restarts: i32,
    ) -> serde_json::Value {
        json!({
            "name": RELAY_CONTAINER, "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts, "state": state, "lastState": last,
        })
    }

    #[test]
    fn a_pod_in_back_off_after_an_oom_kill_is_down_and_named_with_its_limit() {
        let waiting = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let killed = json!({"terminated": {"reason": "OOMKilled", "exitCode": 137}});
        let pods = [pod("orders-a", status(waiting, killed, 3))];
        let kills = oom_kills(&pods);
        assert_eq!(
            kills,
            [OomKill {
                pod: "orders-a".into(),
                limit: Some("64Mi".into()),
                restarts: 3,
                down: true,
            }]
        );
        let message = oom_message(&kills);
        assert!(
            message.starts_with(
                "pod orders-a killed for exceeding its memory limit of 64Mi (3 restarts)"
            ),
            "{message}"
        );
        assert!(
            message.contains("spec.relay.resources.limits.memory"),
            "{message}"
        );
    }

    #[test]
    fn a_pod_running_again_after_an_oom_kill_is_not_down() {
        let running = json!({"running": {"startedAt": "2026-12-03T10:00:00Z"}});
        let killed = json!({"terminated": {"reason": "OOMKilled", "exitCode": 137}});
        let kills = oom_kills(&[pod("orders-b", status(running, killed, 1))]);
        assert_eq!(kills.len(), 1);
        assert!(!kills[0].down);
    }

    #[test]
    fn other_terminations_and_healthy_pods_are_not_oom_kills() {
        let running = json!({"running": {"startedAt": "2026-12-03T10:00:00Z"}});
        let errored = json!({"terminated": {"reason": "Error", "exitCode": 1}});
        let pods = [
            pod("orders-c", status(running.clone(), json!({}), 0)),
            pod("orders-d", status(running, errored, 1)),
        ];
        assert!(oom_kills(&pods).is_empty());
    }
}
