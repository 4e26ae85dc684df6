//! The status the reconciler writes, computed from what it did and observed. Pure functions:
//! the current status goes in (so transition times survive), the new status comes out.
//!
//! Beneath it, what the status is made of: the conditions' bookkeeping ([`conditions`]),
//! kstatus' Reconciling and Stalled ([`progress`]), `spec.suspend` ([`suspension`]), the
//! table's health ([`table_health`]), and the events that announce the same changes
//! ([`events`]).

pub mod conditions;
pub mod events;
pub mod progress;
pub mod suspension;
pub mod table_health;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use outbox_relay::table::migrate::IndexAction;
use outbox_relay::table::reports::ProblemKind;

use crate::crd::{OutboxRelayStatus, RateLimitStatus};
use crate::reconcile::database::{PodProblem, RateShare};
use crate::reconcile::driver::error::Error;
use crate::reconcile::migrate::MigrationOutcome;
use crate::reconcile::observe::pods::{OOM_KILLED, OomKill, oom_message};
use crate::reconcile::scaling::autoscaler::{Limit, Reason};
use crate::reconcile::scaling::recommend::ScalingOutcome;
use crate::reconcile::status::conditions::{
    ConditionStatus, DEGRADED, INDEX_READY, NewCondition, READY, SCALING_ACTIVE, SCALING_LIMITED,
    set_condition,
};
use crate::reconcile::status::progress::Progress;
use crate::reconcile::status::suspension::{
    READY_SUSPENDED, suspended_condition, suspended_message,
};
use crate::reconcile::status::table_health::{
    VACUUM_BLOCKED, table_health_status, vacuum_blocked_message,
};

/// What a successful pass through the pipeline saw.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    pub generation: Option<i64>,
    pub table: String,
    pub migration: &'a MigrationOutcome,
    /// The Deployment as the API server returned it (after the apply, or as read).
    pub deployment: &'a Deployment,
    pub desired_replicas: i32,
    pub selector: String,
    pub scaling: &'a ScalingOutcome,
    /// `spec.database.vacuumBlockedAfter`, parsed.
    pub vacuum_blocked_after: Duration,
    /// Relay pods killed for exceeding their memory limit.
    pub oom_kills: &'a [OomKill],
    /// `spec.relay.maxRate` as divided among the pods this round; None without a limit.
    pub rate_share: Option<RateShare>,
}

/// Status after a pass that reached the end of the pipeline.
pub fn healthy_status(
    current: Option<&OutboxRelayStatus>,
    observed: &Observation<'_>,
    now: Timestamp,
) -> OutboxRelayStatus {
    let mut status = current.cloned().unwrap_or_default();
    let generation = observed.generation;
    status.observed_generation = generation;
    let deployment_status = observed.deployment.status.clone().unwrap_or_default();
    status.replicas = Some(deployment_status.replicas.unwrap_or(0));
    status.ready_replicas = Some(deployment_status.ready_replicas.unwrap_or(0));
    status.desired_replicas = Some(observed.desired_replicas);
    status.selector = Some(observed.selector.clone());
    apply_lag(&mut status, observed.scaling);
    status.rate_limit = observed.rate_share.map(|share| {
        let lag = observed.scaling.lag.as_ref();
        RateLimitStatus {
            per_pod_rate: (share.per_pod_rate * 10.0).round() / 10.0,
            held_back: lag.is_some_and(|lag| lag.held_back_by_rate_limit()),
            waited_seconds: lag.map_or(0.0, |lag| (lag.rate_limited_seconds * 10.0).round() / 10.0),
        }
    });
    // A round without figures (no measuring pod reported) keeps the last ones.
    if let Some(health) = observed
        .scaling
        .lag
        .as_ref()
        .and_then(|lag| lag.table_health.as_ref())
    {
        status.table_health = Some(table_health_status(health, observed.vacuum_blocked_after));
        if let Some(version) = health.server_version() {
            status.postgres_version = Some(version);
        }
    }
    let (active, limited) = scaling_conditions(observed.scaling);
    set_condition(&mut status.conditions, active, generation, now);
    set_condition(&mut status.conditions, limited, generation, now);

    let index = index_condition(&status, observed);
    let index_ready = index.status == ConditionStatus::True;
    set_condition(&mut status.conditions, index, generation, now);

    let problem = observed
        .scaling
        .lag
        .as_ref()
        .and_then(|l| l.problem.as_ref());
    let (ready, degraded, progress) = match problem {
        // Zero pods is what the spec asks for: reached, not in progress (kstatus: Current).
        _ if observed.scaling.suspended => (
            NewCondition::new(READY, true, READY_SUSPENDED, suspended_message(&status)),
            table_degraded(&status, &observed.table),
            Progress::Done,
        ),
        // The pods run but cannot relay: that outranks how far the rollout got. A cause that
        // takes a person (an exchange to declare, a password to fix) stalls at once; an outage
        // (the broker down, a failover) is retried by the pods, and stalls only once it lasts.
        Some(problem) => {
            let message = pod_problem_message(problem);
            let progress = if ProblemKind::from_code(&problem.reason).is_outage() {
                Progress::retrying(&problem.reason, &message, not_ready_since(&status), now)
            } else {
                Progress::stuck(&problem.reason, message.clone())
            };
            (
                NewCondition::new(READY, false, &problem.reason, message.clone()),
                NewCondition::new(DEGRADED, true, &problem.reason, message),
                progress,
            )
        }
        // Killed by the kernel, a relay cannot report why: the pods' statuses say it. Ready
        // only while every killed pod runs again; while one is down, the limit needs a person.
        None if !observed.oom_kills.is_empty() => {
            let message = oom_message(observed.oom_kills);
            let (ready, progress) = if observed.oom_kills.iter().any(|kill| kill.down) {
                (
                    NewCondition::new(READY, false, OOM_KILLED, message.clone()),
                    Progress::stuck(OOM_KILLED, message.clone()),
                )
            } else {
                let ready = progress_condition(observed, index_ready);
                let progress = rollout_progress(&ready, observed.deployment);
                (ready, progress)
            };
            (
                ready,
                NewCondition::new(DEGRADED, true, OOM_KILLED, message),
                progress,
            )
        }
        None => {
            let ready = progress_condition(observed, index_ready);
            let progress = rollout_progress(&ready, observed.deployment);
            (ready, table_degraded(&status, &observed.table), progress)
        }
    };
    if let Some(suspended) = suspended_condition(&status, observed.scaling.suspended) {
        set_condition(&mut status.conditions, suspended, generation, now);
    }
    set_condition(&mut status.conditions, ready, generation, now);
    set_condition(&mut status.conditions, degraded, generation, now);
    for condition in progress.conditions() {
        set_condition(&mut status.conditions, condition, generation, now);
    }
    status
}

/// Degraded as the table's health has it: the relay still runs while VACUUM is blocked, so
/// Degraded, not un-Ready.
fn table_degraded(status: &OutboxRelayStatus, table: &str) -> NewCondition {
    match status.table_health.as_ref().filter(|h| h.vacuum_blocked) {
        Some(health) => NewCondition::new(
            DEGRADED,
            true,
            VACUUM_BLOCKED,
            vacuum_blocked_message(health, table),
        ),
        None => NewCondition::new(DEGRADED, false, "AsExpected", "no problems found"),
    }
}

/// Progress as far as Ready tells it: done once Ready, else working on it, unless the
/// Deployment controller gave up on the rollout (its progress deadline passed: pods that never
/// become ready, an image that cannot be pulled), which needs a person.
fn rollout_progress(ready: &NewCondition, deployment: &Deployment) -> Progress {
    if ready.status == ConditionStatus::True {
        return Progress::Done;
    }
    let deadline_passed = deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_.as_deref() == Some("Progressing") && c.status.as_deref() == Some("False"))
        .filter(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"));
    match deadline_passed {
        Some(condition) => Progress::stuck(
            "ProgressDeadlineExceeded",
            format!(
                "{}: {}",
                ready.message,
                condition
                    .message
                    .as_deref()
                    .unwrap_or("the rollout made no progress")
            ),
        ),
        None => Progress::working(&ready.reason, &ready.message),
    }
}

/// Ready as far as the migration and the rollout have got.
fn progress_condition(observed: &Observation<'_>, index_ready: bool) -> NewCondition {
    if index_ready {
        rollout_condition(observed)
    } else {
        NewCondition::new(
            READY,
            false,
            "MigrationPending",
            format!("waiting for the migration of table {}", observed.table),
        )
    }
}

/// `pod orders-7f9c (1 of 1 reporting): exchange x does not exist on vhost /: declare it, ...`
pub fn pod_problem_message(problem: &PodProblem) -> String {
    let pods = match problem.pods.as_slice() {
        [one] => format!("pod {one}"),
        many => format!("{} pods ({})", many.len(), many.join(", ")),
    };
    format!("{pods} cannot relay: {}", problem.message)
}

/// Status after a pass that stopped at `error`, for errors the user can act on.
pub fn failed_status(
    current: Option<&OutboxRelayStatus>,
    generation: Option<i64>,
    reason: &str,
    error: &Error,
    now: Timestamp,
) -> OutboxRelayStatus {
    let mut status = current.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let message = error.to_string();
    set_condition(
        &mut status.conditions,
        NewCondition::new(READY, false, reason, message.clone()),
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        NewCondition::new(DEGRADED, true, reason, message.clone()),
        generation,
        now,
    );
    let progress = if error.is_transient() {
        Progress::retrying(reason, &message, not_ready_since(&status), now)
    } else {
        Progress::stuck(reason, message.clone())
    };
    for condition in progress.conditions() {
        set_condition(&mut status.conditions, condition, generation, now);
    }
    if error.concerns_the_index() {
        set_condition(
            &mut status.conditions,
            NewCondition::new(INDEX_READY, false, reason, message),
            generation,
            now,
        );
    }
    status
}

/// Since when Ready has been False, if it is: how long a retried failure has lasted.
fn not_ready_since(status: &OutboxRelayStatus) -> Option<Timestamp> {
    conditions::find(&status.conditions, READY)
        .filter(|ready| ready.status == "False")
        .map(|ready| ready.last_transition_time.0)
}

/// Copies what was observed of the lag into the status; a round that could not observe it
/// leaves the last known figures.
fn apply_lag(status: &mut OutboxRelayStatus, scaling: &ScalingOutcome) {
    if let Some(lag) = &scaling.lag {
        status.backlog = lag.backlog;
        status.backlog_capped = lag.backlog.map(|_| lag.backlog_capped);
        status.oldest_age_seconds = lag
            .oldest_age_seconds
            .map(|age| (age * 10.0).round() / 10.0);
        // A relay at zero pods publishes nothing; no report is not "unknown" there.
        status.publish_rate = Some((lag.publish_rate * 10.0).round() / 10.0);
    }
    if let Some(at) = scaling.last_scale_time
        && let Ok(timestamp) = Timestamp::from_second(at.timestamp())
    {
        status.last_scale_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            timestamp,
        ));
    }
}

/// ScalingActive (can the autoscaler compute from fresh data?) and ScalingLimited (is the
/// recommendation held back from what the backlog asks for?), named as the HPA names them.
pub fn scaling_conditions(scaling: &ScalingOutcome) -> (NewCondition, NewCondition) {
    if scaling.suspended {
        let message =
            "delivery is suspended by spec.suspend: zero pods, the autoscaler computes nothing";
        return (
            NewCondition::new(SCALING_ACTIVE, false, READY_SUSPENDED, message),
            NewCondition::new(SCALING_LIMITED, false, READY_SUSPENDED, message),
        );
    }
    let (Some(recommendation), Some(observation)) = (&scaling.recommendation, &scaling.observation)
    else {
        let message = format!(
            "spec.scaling is not set; spec.replicas ({}) decides",
            scaling.replicas
        );
        return (
            NewCondition::new(SCALING_ACTIVE, false, "ScalingDisabled", message.clone()),
            NewCondition::new(SCALING_LIMITED, false, "ScalingDisabled", message),
        );
    };
    let message = recommendation.message(observation);
    match recommendation.reason {
        Reason::Paused => (
            NewCondition::new(SCALING_ACTIVE, false, "Paused", message.clone()),
            NewCondition::new(SCALING_LIMITED, true, "Paused", message),
        ),
        Reason::AwaitingReports => (
            NewCondition::new(
                SCALING_ACTIVE,
                ConditionStatus::Unknown,
                "AwaitingReports",
                message.clone(),
            ),
            NewCondition::new(SCALING_LIMITED, false, "AwaitingReports", message),
        ),
        Reason::StaleReports => {
            let why = scaling
                .lag_problem
                .clone()
                .unwrap_or_else(|| "no relay pod reported the backlog recently".into());
            (
                NewCondition::new(
                    SCALING_ACTIVE,
                    false,
                    "StaleReports",
                    format!("{why}; {message}"),
                ),
                NewCondition::new(SCALING_LIMITED, true, "StaleReports", message),
            )
        }
        Reason::Backlog => {
            let source = match &scaling.lag {
                Some(lag) if lag.measured_by_operator => {
                    "measured by the operator (no pod running)"
                }
                _ => "reported by the relay pods",
            };
            let active = NewCondition::new(
                SCALING_ACTIVE,
                true,
                "ValidBacklog",
                format!("backlog {} {source}", observation.backlog.unwrap_or(0)),
            );
            let limited = match recommendation.limit {
                Some(limit) if limit != Limit::WithinTolerance => {
                    NewCondition::new(SCALING_LIMITED, true, limit.reason(), message)
                }
                _ => NewCondition::new(SCALING_LIMITED, false, "DesiredWithinRange", message),
            };
            (active, limited)
        }
    }
}

fn index_condition(status: &OutboxRelayStatus, observed: &Observation<'_>) -> NewCondition {
    match observed.migration {
        MigrationOutcome::Migrated(report) => {
            let reason = match report.index {
                IndexAction::Created => "IndexCreated",
                IndexAction::AlreadyValid => "IndexValid",
                IndexAction::RebuiltInvalid => "InvalidIndexRebuilt",
            };
            NewCondition::new(INDEX_READY, true, reason, report.lines().join("; "))
        }
        MigrationOutcome::AlreadyMigrated => {
            match conditions::find(&status.conditions, INDEX_READY) {
                // Keep what the migration said when it ran.
                Some(c) if c.status == "True" => {
                    NewCondition::new(INDEX_READY, true, c.reason.clone(), c.message.clone())
                }
                _ => NewCondition::new(
                    INDEX_READY,
                    true,
                    "IndexValid",
                    format!("table {} is migrated", observed.table),
                ),
            }
        }
        MigrationOutcome::LockBusy => NewCondition::new(
            INDEX_READY,
            ConditionStatus::Unknown,
            "MigrationInProgress",
            format!(
                "another migration of table {} holds the lock; retrying shortly",
                observed.table
            ),
        ),
    }
}

/// Ready follows the Deployment's rollout: every desired pod updated and ready, no old pods.
fn rollout_condition(observed: &Observation<'_>) -> NewCondition {
    let desired = observed.desired_replicas;
    let deployment = observed.deployment;
    let status = deployment.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let seen = match (deployment.metadata.generation, status.observed_generation) {
        (Some(generation), Some(observed)) => observed >= generation,
        (Some(_), None) => false,
        (None, _) => true,
    };
    if seen && desired == 0 && total == 0 {
        return NewCondition::new(READY, true, "ScaledToZero", "no relay pods are needed");
    }
    if seen && ready >= desired && updated >= desired && total == desired {
        NewCondition::new(
            READY,
            true,
            "Available",
            format!("{ready} of {desired} relay pods ready"),
        )
    } else {
        NewCondition::new(
            READY,
            false,
            "Progressing",
            format!("{ready} of {desired} relay pods ready, {updated} updated"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::status::conditions::{RECONCILING, STALLED, SUSPENDED};
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
    use outbox_relay::table::migrate::MigrationReport;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn deployment(replicas: i32, ready: i32) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(2);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(2),
            replicas: Some(replicas),
            ready_replicas: Some(ready),
            updated_replicas: Some(replicas),
            ..Default::default()
        });
        d
    }

    fn report(index: IndexAction) -> MigrationOutcome {
        MigrationOutcome::Migrated(MigrationReport {
            index_name: "t_pending_idx".into(),
            index,
            reports_table_created: true,
            frontier_created: true,
            autovacuum_changed: true,
            notify_installed: false,
            server_autovacuum_off: false,
        })
    }

    fn observe<'a>(
        migration: &'a MigrationOutcome,
        d: &'a Deployment,
        desired: i32,
    ) -> Observation<'a> {
        Observation {
            generation: Some(4),
            table: "t".into(),
            migration,
            deployment: d,
            desired_replicas: desired,
            selector: "a=b".into(),
            scaling: manual(),
            vacuum_blocked_after: Duration::from_secs(600),
            oom_kills: &[],
            rate_share: None,
        }
    }

    fn manual() -> &'static ScalingOutcome {
        static MANUAL: std::sync::OnceLock<ScalingOutcome> = std::sync::OnceLock::new();
        MANUAL.get_or_init(|| ScalingOutcome {
            replicas: 1,
            previous: 1,
            lag: None,
            lag_problem: None,
            recommendation: None,
            observation: None,
            last_scale_time: None,
            suspended: false,
            replicas_before_suspend: None,
        })
    }

    fn condition<'a>(status: &'a OutboxRelayStatus, type_: &str) -> (&'a str, &'a str) {
        let c = conditions::find(&status.conditions, type_).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn ready_once_every_pod_is_ready() {
        let migrated = report(IndexAction::Created);
        let d = deployment(2, 1);
        let progressing = healthy_status(None, &observe(&migrated, &d, 2), at(10));
        assert_eq!(condition(&progressing, READY), ("False", "Progressing"));
        assert_eq!(
            condition(&progressing, INDEX_READY),
            ("True", "IndexCreated")
        );
        assert_eq!(condition(&progressing, DEGRADED), ("False", "AsExpected"));
        // kstatus: in progress, not stalled.
        assert_eq!(
            condition(&progressing, RECONCILING),
            ("True", "Progressing")
        );
        assert_eq!(condition(&progressing, STALLED), ("False", "Progressing"));
        assert_eq!(progressing.observed_generation, Some(4));
        assert_eq!(progressing.ready_replicas, Some(1));
        assert_eq!(progressing.selector.as_deref(), Some("a=b"));

        let d = deployment(2, 2);
        let already = MigrationOutcome::AlreadyMigrated;
        let ready = healthy_status(Some(&progressing), &observe(&already, &d, 2), at(20));
        assert_eq!(condition(&ready, READY), ("True", "Available"));
        assert_eq!(condition(&ready, RECONCILING), ("False", "Reconciled"));
        assert_eq!(condition(&ready, STALLED), ("False", "Reconciled"));
        // The migration's own reason is kept while nothing new was migrated.
        assert_eq!(condition(&ready, INDEX_READY), ("True", "IndexCreated"));
        let index = conditions::find(&ready.conditions, INDEX_READY).unwrap();
        assert_eq!(index.last_transition_time.0, at(10));
    }

    #[test]
    fn a_busy_lock_leaves_the_index_unknown_and_the_relay_not_ready() {
        let busy = MigrationOutcome::LockBusy;
        let d = deployment(1, 1);
        let status = healthy_status(None, &observe(&busy, &d, 1), at(10));
        assert_eq!(
            condition(&status, INDEX_READY),
            ("Unknown", "MigrationInProgress")
        );
        assert_eq!(condition(&status, READY), ("False", "MigrationPending"));
    }

    #[test]
    fn an_old_deployment_generation_is_not_ready() {
        let migrated = report(IndexAction::AlreadyValid);
        let mut d = deployment(1, 1);
        d.metadata.generation = Some(3);
        let status = healthy_status(None, &observe(&migrated, &d, 1), at(10));
        assert_eq!(condition(&status, READY), ("False", "Progressing"));
    }

    fn oom_kill(down: bool) -> OomKill {
        OomKill {
            pod: "orders-a".into(),
            limit: Some("32Mi".into()),
            restarts: 2,
            down,
        }
    }

    #[test]
    fn an_oom_killed_pod_that_is_down_makes_the_relay_not_ready_and_degraded() {
        let migrated = report(IndexAction::AlreadyValid);
        let d = deployment(1, 0);
        let kills = [oom_kill(true)];
        let observed = Observation {
            oom_kills: &kills,
            rate_share: None,
            ..observe(&migrated, &d, 1)
        };
        let status = healthy_status(None, &observed, at(10));
        assert_eq!(condition(&status, READY), ("False", OOM_KILLED));
        assert_eq!(condition(&status, DEGRADED), ("True", OOM_KILLED));
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert!(ready.message.contains("32Mi"), "{}", ready.message);
    }

    #[test]
    fn a_pod_running_again_after_an_oom_kill_leaves_ready_to_the_rollout() {
        let migrated = report(IndexAction::AlreadyValid);
        let d = deployment(1, 1);
        let kills = [oom_kill(false)];
        let observed = Observation {
            oom_kills: &kills,
            rate_share: None,
            ..observe(&migrated, &d, 1)
        };
        let status = healthy_status(None, &observed, at(10));
        assert_eq!(condition(&status, READY), ("True", "Available"));
        assert_eq!(condition(&status, DEGRADED), ("True", OOM_KILLED));
    }

    #[test]
    fn zero_desired_pods_is_ready() {
        let migrated = report(IndexAction::AlreadyValid);
        let d = deployment(0, 0);
        let status = healthy_status(None, &observe(&migrated, &d, 0), at(10));
        assert_eq!(condition(&status, READY), ("True", "ScaledToZero"));
    }

    #[test]
    fn a_suspended_relay_is_ready_and_suspended_not_reconciling_and_says_the_backlog() {
        let migrated = MigrationOutcome::AlreadyMigrated;
        // Two pods still finishing their batches, an OOM kill among them: suspended wins.
        let d = deployment(2, 0);
        let mut scaling = manual().clone();
        scaling.replicas = 0;
        scaling.suspended = true;
        scaling.lag = Some(crate::reconcile::database::LagObservation {
            backlog: Some(700),
            oldest_age_seconds: Some(12.0),
            measured_by_operator: true,
            ..Default::default()
        });
        let kills = [oom_kill(true)];
        let observed = Observation {
            scaling: &scaling,
            oom_kills: &kills,
            ..observe(&migrated, &d, 0)
        };
        let suspended = healthy_status(None, &observed, at(10));
        assert_eq!(condition(&suspended, READY), ("True", "Suspended"));
        assert_eq!(
            condition(&suspended, SUSPENDED),
            ("True", "SuspendedBySpec")
        );
        assert_eq!(condition(&suspended, RECONCILING).0, "False");
        assert_eq!(condition(&suspended, STALLED).0, "False");
        assert_eq!(
            condition(&suspended, SCALING_ACTIVE),
            ("False", "Suspended")
        );
        assert_eq!(suspended.backlog, Some(700));
        assert_eq!(suspended.desired_replicas, Some(0));
        let message = &conditions::find(&suspended.conditions, SUSPENDED)
            .unwrap()
            .message;
        assert!(
            message.contains("spec.suspend") && message.contains("700 rows wait"),
            "{message}"
        );
        assert!(message.contains("2 relay pods are finishing"), "{message}");

        // Resumed: the condition stays, False, and the rollout decides Ready again.
        let d = deployment(1, 0);
        let resumed = healthy_status(Some(&suspended), &observe(&migrated, &d, 1), at(20));
        assert_eq!(condition(&resumed, SUSPENDED), ("False", "Resumed"));
        assert_eq!(condition(&resumed, READY), ("False", "Progressing"));
        // A relay never suspended has no Suspended condition at all.
        let never = healthy_status(None, &observe(&migrated, &d, 1), at(20));
        assert!(conditions::find(&never.conditions, SUSPENDED).is_none());
    }

    #[test]
    fn a_rollout_past_its_progress_deadline_is_stalled() {
        let migrated = report(IndexAction::AlreadyValid);
        let mut d = deployment(1, 0);
        d.status.as_mut().unwrap().conditions = Some(vec![DeploymentCondition {
            type_: Some("Progressing".into()),
            status: Some("False".into()),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("ReplicaSet \"t-1\" has timed out progressing.".into()),
            ..Default::default()
        }]);
        let status = healthy_status(None, &observe(&migrated, &d, 1), at(10));
        assert_eq!(condition(&status, READY), ("False", "Progressing"));
        assert_eq!(
            condition(&status, STALLED),
            ("True", "ProgressDeadlineExceeded")
        );
        assert_eq!(condition(&status, RECONCILING).0, "False");
        let stalled = conditions::find(&status.conditions, STALLED).unwrap();
        assert!(stalled.message.contains("timed out"), "{}", stalled.message);
    }

    #[test]
    fn pods_that_cannot_relay_stall_the_relay() {
        let migrated = report(IndexAction::AlreadyValid);
        let d = deployment(1, 1);
        let mut scaling = manual().clone();
        scaling.lag = Some(crate::reconcile::database::LagObservation {
            problem: Some(PodProblem {
                reason: "ExchangeNotFound".into(),
                message: "exchange x does not exist".into(),
                pods: vec!["t-a".into()],
            }),
            ..Default::default()
        });
        let observed = Observation {
            scaling: &scaling,
            ..observe(&migrated, &d, 1)
        };
        let status = healthy_status(None, &observed, at(10));
        assert_eq!(condition(&status, STALLED), ("True", "ExchangeNotFound"));
        assert_eq!(condition(&status, RECONCILING).0, "False");
    }

    #[test]
    fn pods_that_cannot_reach_the_broker_are_retrying_until_it_lasts() {
        let migrated = report(IndexAction::AlreadyValid);
        let d = deployment(1, 1);
        let mut scaling = manual().clone();
        scaling.lag = Some(crate::reconcile::database::LagObservation {
            problem: Some(PodProblem {
                reason: "BrokerUnreachable".into(),
                message: "cannot reach the broker: connection refused".into(),
                pods: vec!["t-a".into()],
            }),
            ..Default::default()
        });
        let observed = Observation {
            scaling: &scaling,
            ..observe(&migrated, &d, 1)
        };
        let first = healthy_status(None, &observed, at(100));
        assert_eq!(condition(&first, READY), ("False", "BrokerUnreachable"));
        assert_eq!(condition(&first, DEGRADED), ("True", "BrokerUnreachable"));
        assert_eq!(
            condition(&first, RECONCILING),
            ("True", "BrokerUnreachable")
        );
        assert_eq!(condition(&first, STALLED).0, "False");
        let later = healthy_status(Some(&first), &observed, at(160));
        assert_eq!(condition(&later, STALLED).0, "False");
        // Unreachable for longer than STALL_AFTER: a person should look.
        let stalled = healthy_status(Some(&later), &observed, at(500));
        assert_eq!(condition(&stalled, STALLED), ("True", "BrokerUnreachable"));
        assert_eq!(condition(&stalled, RECONCILING).0, "False");
    }

    #[test]
    fn a_person_is_needed_at_once_for_a_missing_secret_but_only_later_for_a_database_away() {
        let missing = Error::SecretNotFound { name: "db".into() };
        let status = failed_status(None, Some(2), "SecretNotFound", &missing, at(10));
        assert_eq!(condition(&status, STALLED), ("True", "SecretNotFound"));
        assert_eq!(condition(&status, RECONCILING).0, "False");

        let away = Error::DatabaseUnreachable("connection refused".into());
        let first = failed_status(None, Some(2), "DatabaseUnreachable", &away, at(100));
        assert_eq!(
            condition(&first, RECONCILING),
            ("True", "DatabaseUnreachable")
        );
        assert_eq!(condition(&first, STALLED).0, "False");
        // Still unreachable a minute later: still retrying.
        let later = failed_status(Some(&first), Some(2), "DatabaseUnreachable", &away, at(160));
        assert_eq!(condition(&later, STALLED).0, "False");
        // Ready has been False for longer than STALL_AFTER: a person should look.
        let stalled = failed_status(Some(&later), Some(2), "DatabaseUnreachable", &away, at(500));
        assert_eq!(
            condition(&stalled, STALLED),
            ("True", "DatabaseUnreachable")
        );
        assert_eq!(condition(&stalled, RECONCILING).0, "False");
    }

    #[test]
    fn failures_mark_degraded_and_not_ready() {
        let error = Error::DatabaseUnreachable("connection refused".into());
        let status = failed_status(None, Some(2), "DatabaseUnreachable", &error, at(10));
        assert_eq!(condition(&status, READY), ("False", "DatabaseUnreachable"));
        assert_eq!(
            condition(&status, DEGRADED),
            ("True", "DatabaseUnreachable")
        );
        assert_eq!(
            condition(&status, INDEX_READY),
            ("False", "DatabaseUnreachable")
        );
        let error = Error::SecretNotFound { name: "db".into() };
        let status = failed_status(None, Some(2), "SecretNotFound", &error, at(10));
        assert!(conditions::find(&status.conditions, INDEX_READY).is_none());
        assert_eq!(
            conditions::find(&status.conditions, READY).unwrap().message,
            "Secret db not found in the relay's namespace"
        );
    }
}
