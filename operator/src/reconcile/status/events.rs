//! Events (events.k8s.io) on OutboxRelay objects. Publishing is best effort: an event that
//! cannot be written is logged, never a reason to fail the reconcile.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use outbox_relay::table::migrate::{AUTOVACUUM_OFF_WARNING, IndexAction};

use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::reconcile::database::PodProblem;
use crate::reconcile::migrate::MigrationOutcome;
use crate::reconcile::observe::pods::{OOM_KILLED, OomKill, oom_message};
use crate::reconcile::scaling::recommend::ScalingOutcome;
use crate::reconcile::status::conditions::{self, DEGRADED, READY};
use crate::reconcile::status::suspension::{
    READY_SUSPENDED, RESUMED, SuspensionChange, resumed_message, suspended_message,
    suspension_change,
};
use crate::reconcile::status::table_health::{
    VACUUM_BLOCKED, VACUUM_UNBLOCKED, VacuumChange, vacuum_blocked_message, vacuum_change,
    vacuum_unblocked_message,
};

/// Event reasons, as `kubectl describe obr` shows them.
pub mod reasons {
    pub const INDEX_CREATED: &str = "IndexCreated";
    pub const INVALID_INDEX_REBUILT: &str = "InvalidIndexRebuilt";
    pub const AUTOVACUUM_OFF: &str = "AutovacuumOff";
    pub const DEPLOYMENT_CREATED: &str = "DeploymentCreated";
    pub const DEPLOYMENT_UPDATED: &str = "DeploymentUpdated";
    pub const SCALED_UP: &str = "ScaledUp";
    pub const SCALED_DOWN: &str = "ScaledDown";
    /// A deleted relay's cleanup failed once; it is retried until the bound.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// The bound passed: the finalizer went, and the note says what stayed in the database.
    pub const CLEANUP_ABANDONED: &str = "CleanupAbandoned";
    pub const DATABASE_CLEANED_UP: &str = "DatabaseCleanedUp";
    pub const DATABASE_OBJECTS_RETAINED: &str = "DatabaseObjectsRetained";
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

/// ScaledUp / ScaledDown events, with the numbers that led there. Manual changes are announced
/// as DeploymentUpdated; these events are the autoscaler's.
pub async fn announce_scaling(recorder: &Recorder, relay: &OutboxRelay, scale: &ScalingOutcome) {
    let (Some(recommendation), Some(observation)) = (&scale.recommendation, &scale.observation)
    else {
        return;
    };
    if !scale.changed() {
        return;
    }
    let (reason, direction) = if scale.replicas > scale.previous {
        (reasons::SCALED_UP, "up")
    } else {
        (reasons::SCALED_DOWN, "down")
    };
    let why = recommendation.message(observation);
    let note = format!(
        "scaled {direction} from {} to {} replicas: {why}",
        scale.previous, scale.replicas
    );
    publish(recorder, relay, EventType::Normal, reason, "Scale", note).await;
}

/// What a migration that ran did to the index, and a warning when nothing vacuums the table.
pub async fn announce_migration(
    recorder: &Recorder,
    relay: &OutboxRelay,
    migration: &MigrationOutcome,
) {
    let MigrationOutcome::Migrated(report) = migration else {
        return;
    };
    if report.server_autovacuum_off {
        let note = AUTOVACUUM_OFF_WARNING.to_string();
        let reason = reasons::AUTOVACUUM_OFF;
        publish(recorder, relay, EventType::Warning, reason, "Migrate", note).await;
    }
    let (type_, reason) = match report.index {
        IndexAction::Created => (EventType::Normal, reasons::INDEX_CREATED),
        // Good news about bad news: the earlier build failed; say so loudly.
        IndexAction::RebuiltInvalid => (EventType::Warning, reasons::INVALID_INDEX_REBUILT),
        IndexAction::AlreadyValid => return,
    };
    let note = report.lines().join("; ");
    publish(recorder, relay, type_, reason, "Migrate", note).await;
}

/// A Warning when pods start reporting a problem (Ready turns False with its reason); none
/// while it goes on, so a long outage is one event, not one per reconcile.
pub async fn announce_pod_problem(
    recorder: &Recorder,
    relay: &OutboxRelay,
    problem: Option<&PodProblem>,
    message: impl FnOnce(&PodProblem) -> String,
) {
    let Some(problem) = problem else {
        return;
    };
    if !problem_started(relay.status.as_ref(), problem) {
        return;
    }
    let note = message(problem);
    let reason = problem.reason.as_str();
    publish(recorder, relay, EventType::Warning, reason, "Observe", note).await;
}

/// A Warning when the cleanup horizon starts blocking VACUUM, a Normal event when it stops:
/// two events per episode, however long it lasts.
pub async fn announce_vacuum(
    recorder: &Recorder,
    relay: &OutboxRelay,
    status: &OutboxRelayStatus,
    table: &str,
) {
    let previous = relay.status.as_ref().and_then(|s| s.table_health.as_ref());
    let Some(current) = status.table_health.as_ref() else {
        return;
    };
    let (type_, reason, note) = match vacuum_change(previous, Some(current)) {
        VacuumChange::Started => (
            EventType::Warning,
            VACUUM_BLOCKED,
            vacuum_blocked_message(current, table),
        ),
        VacuumChange::Cleared => (
            EventType::Normal,
            VACUUM_UNBLOCKED,
            vacuum_unblocked_message(current, table),
        ),
        VacuumChange::Unchanged => return,
    };
    publish(recorder, relay, type_, reason, "Observe", note).await;
}

/// A Normal event when `spec.suspend` stops delivery, another when it resumes: two per
/// suspension, however long it lasts.
pub async fn announce_suspension(
    recorder: &Recorder,
    relay: &OutboxRelay,
    status: &OutboxRelayStatus,
    suspended: bool,
) {
    let (reason, note) = match suspension_change(relay.status.as_ref(), suspended) {
        SuspensionChange::Suspended => (READY_SUSPENDED, suspended_message(status)),
        SuspensionChange::Resumed => (
            RESUMED,
            resumed_message(status.desired_replicas.unwrap_or(0)),
        ),
        SuspensionChange::Unchanged => return,
    };
    publish(recorder, relay, EventType::Normal, reason, "Suspend", note).await;
}

/// A Warning when relay pods were OOM-killed and Degraded did not already say so.
pub async fn announce_oom_kills(recorder: &Recorder, relay: &OutboxRelay, kills: &[OomKill]) {
    if kills.is_empty() {
        return;
    }
    let degraded = relay
        .status
        .as_ref()
        .and_then(|status| conditions::find(&status.conditions, DEGRADED));
    if degraded.is_some_and(|c| c.status == "True" && c.reason == OOM_KILLED) {
        return;
    }
    let note = oom_message(kills);
    publish(
        recorder,
        relay,
        EventType::Warning,
        OOM_KILLED,
        "Observe",
        note,
    )
    .await;
}

/// Is `problem` new, i.e. was Ready not already False for this reason?
pub fn problem_started(previous: Option<&OutboxRelayStatus>, problem: &PodProblem) -> bool {
    let ready = previous.and_then(|status| conditions::find(&status.conditions, READY));
    !ready.is_some_and(|c| c.status == "False" && c.reason == problem.reason)
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
