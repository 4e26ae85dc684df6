//! Events (events.k8s.io) on OutboxRelay objects. Publishing is best effort: an event that
//! cannot be written is logged, never a reason to fail the reconcile.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::crd::OutboxRelay;

/// Event reasons, as `kubectl describe obr` shows them.
pub mod reasons {
    pub const INDEX_CREATED: &str = "IndexCreated";
    pub const INVALID_INDEX_REBUILT: &str = "InvalidIndexRebuilt";
    pub const AUTOVACUUM_OFF: &str = "AutovacuumOff";
    pub const DEPLOYMENT_CREATED: &str = "DeploymentCreated";
    pub const DEPLOYMENT_UPDATED: &str = "DeploymentUpdated";
    pub const SCALED_UP: &str = "ScaledUp";
    pub const SCALED_DOWN: &str = "ScaledDown";
}

/// Publishes one event about `relay`.
pub async fn publish(
    recorder: &Recorder,
    relay: &OutboxRelay,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        // The API server refuses notes above 1 kB.
        note: Some(truncate(note, 1000)),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &relay.object_ref(&())).await {
        tracing::warn!(%error, reason, "could not publish event");
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
