//! The Pod status a kubelet writes, from what the node agent knows of the container.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

pub enum ContainerState {
    Running(DateTime<Utc>),
    /// Reason and message.
    Waiting(&'static str, String),
}

pub struct PodFacts<'a> {
    pub container: &'a str,
    pub image: &'a str,
    pub state: ContainerState,
    pub last_exit: Option<(i32, DateTime<Utc>)>,
    pub restarts: i32,
    pub ready: bool,
    pub ready_changed: DateTime<Utc>,
    pub start_time: DateTime<Utc>,
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The status of a pod whose one container is in `facts.state`.
pub fn pod_status(facts: &PodFacts<'_>) -> Value {
    let ready = if facts.ready { "True" } else { "False" };
    let started = time(facts.start_time);
    let state = match &facts.state {
        ContainerState::Running(at) => json!({"running": {"startedAt": time(*at)}}),
        ContainerState::Waiting(reason, message) => {
            json!({"waiting": {"reason": reason, "message": message}})
        }
    };
    let last_state = match facts.last_exit {
        Some((code, at)) => json!({"terminated": {
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "finishedAt": time(at),
        }}),
        None => json!({}),
    };
    json!({
        // Always-restarting containers keep a pod Running once it started, as a kubelet does.
        "phase": if matches!(facts.state, ContainerState::Running(_)) || facts.last_exit.is_some() {
            "Running"
        } else {
            "Pending"
        },
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": started,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
            {"type": "Initialized", "status": "True", "lastTransitionTime": started},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": time(facts.ready_changed)},
            {"type": "Ready", "status": ready, "lastTransitionTime": time(facts.ready_changed)},
        ],
        "containerStatuses": [{
            "name": facts.container,
            "image": facts.image,
            "imageID": "",
            "ready": facts.ready,
            "started": matches!(facts.state, ContainerState::Running(_)),
            "restartCount": facts.restarts,
            "state": state,
            "lastState": last_state,
        }],
    })
}
