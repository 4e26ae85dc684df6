//! `spec.suspend` in the status and the events (pure): the `Suspended` condition, Ready's
//! reason while suspended, and whether this round suspended or resumed delivery. Split from
//! [`status`](crate::reconcile::status) so the words of the condition and of the events are
//! written once.
//!
//! A suspended relay has reached what its spec asks (zero pods), so Ready stays True with
//! reason `Suspended` and neither `Reconciling` nor `Stalled` holds: kstatus says Current,
//! `kubectl wait --for=condition=Ready` returns, and the shipped Argo CD health check says
//! `Suspended` from the `Suspended` condition.

use crate::crd::OutboxRelayStatus;
use crate::reconcile::status::conditions::{self, NewCondition, SUSPENDED};

/// The `Suspended` condition's reason while `spec.suspend` is true.
pub const SUSPENDED_BY_SPEC: &str = "SuspendedBySpec";
/// Ready's reason while suspended, and the event's when delivery is suspended.
pub const READY_SUSPENDED: &str = "Suspended";
/// The `Suspended` condition's reason, and the event's, once delivery runs again.
pub const RESUMED: &str = "Resumed";

/// What a suspended relay's `Suspended` and `Ready` conditions say, from the status this round
/// computed (its replicas and backlog).
pub fn suspended_message(status: &OutboxRelayStatus) -> String {
    let pods = match status.replicas.unwrap_or(0) {
        0 => "no relay pod runs".to_string(),
        1 => "1 relay pod is finishing its batch in flight".to_string(),
        n => format!("{n} relay pods are finishing their batches in flight"),
    };
    let backlog = match status.backlog {
        None => "the backlog is not measured yet".to_string(),
        Some(rows) => {
            let at_least = if status.backlog_capped == Some(true) {
                "at least "
            } else {
                ""
            };
            let oldest = status
                .oldest_age_seconds
                .map_or(String::new(), |age| format!(", the oldest {age:.0} s old"));
            format!("{at_least}{rows} rows wait{oldest} (measured by the operator)")
        }
    };
    format!(
        "delivery is suspended by spec.suspend: {pods}; {backlog}; set spec.suspend to false to resume"
    )
}

/// The `Suspended` condition for this round: True while suspended; False once resumed, for a
/// relay that was ever suspended; `None` (not written) for one that never was.
pub fn suspended_condition(status: &OutboxRelayStatus, suspended: bool) -> Option<NewCondition> {
    if suspended {
        return Some(NewCondition::new(
            SUSPENDED,
            true,
            SUSPENDED_BY_SPEC,
            suspended_message(status),
        ));
    }
    conditions::find(&status.conditions, SUSPENDED).map(|_| {
        NewCondition::new(
            SUSPENDED,
            false,
            RESUMED,
            "delivery runs: spec.suspend is false",
        )
    })
}

/// How `spec.suspend` moved since the status the round started from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuspensionChange {
    Suspended,
    Resumed,
    Unchanged,
}

pub fn suspension_change(
    previous: Option<&OutboxRelayStatus>,
    suspended: bool,
) -> SuspensionChange {
    let was = previous.is_some_and(|status| conditions::is_true(&status.conditions, SUSPENDED));
    match (was, suspended) {
        (false, true) => SuspensionChange::Suspended,
        (true, false) => SuspensionChange::Resumed,
        _ => SuspensionChange::Unchanged,
    }
}

/// The `Resumed` event's note.
pub fn resumed_message(desired_replicas: i32) -> String {
    format!(
        "delivery resumed: spec.suspend is false; {desired_replicas} relay pods asked for, \
         starting from the backlog the operator measured while suspended"
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::reconcile::status::conditions::set_condition;

    fn status(replicas: i32, backlog: Option<i64>, capped: bool) -> OutboxRelayStatus {
        OutboxRelayStatus {
            replicas: Some(replicas),
            backlog,
            backlog_capped: backlog.map(|_| capped),
            oldest_age_seconds: backlog.map(|_| 42.4),
            ..Default::default()
        }
    }

    #[test]
    fn the_message_says_who_runs_and_what_waits() {
        let gone = suspended_message(&status(0, Some(1200), false));
        assert_eq!(
            gone,
            "delivery is suspended by spec.suspend: no relay pod runs; 1200 rows wait, the \
             oldest 42 s old (measured by the operator); set spec.suspend to false to resume"
        );
        let stopping = suspended_message(&status(2, Some(10_000), true));
        assert!(
            stopping.contains("2 relay pods are finishing their batches in flight"),
            "{stopping}"
        );
        assert!(stopping.contains("at least 10000 rows wait"), "{stopping}");
        let unknown = suspended_message(&status(0, None, false));
        assert!(unknown.contains("not measured yet"), "{unknown}");
    }

    #[test]
    fn the_condition_appears_with_the_first_suspension_and_stays_false_after() {
        let mut current = status(0, Some(5), false);
        assert_eq!(suspended_condition(&current, false), None);
        let on = suspended_condition(&current, true).unwrap();
        assert_eq!(
            (on.type_, on.reason.as_str()),
            (SUSPENDED, SUSPENDED_BY_SPEC)
        );
        assert_eq!(on.status, conditions::ConditionStatus::True);
        set_condition(&mut current.conditions, on, Some(1), Timestamp::UNIX_EPOCH);
        let off = suspended_condition(&current, false).unwrap();
        assert_eq!(off.status, conditions::ConditionStatus::False);
        assert_eq!(off.reason, RESUMED);
    }

    #[test]
    fn events_mark_the_suspension_and_the_resume_only() {
        let mut suspended = status(0, Some(5), false);
        let on = suspended_condition(&suspended, true).unwrap();
        set_condition(
            &mut suspended.conditions,
            on,
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        let running = status(1, Some(5), false);
        assert_eq!(suspension_change(None, true), SuspensionChange::Suspended);
        assert_eq!(
            suspension_change(Some(&running), true),
            SuspensionChange::Suspended
        );
        assert_eq!(
            suspension_change(Some(&suspended), true),
            SuspensionChange::Unchanged
        );
        assert_eq!(
            suspension_change(Some(&suspended), false),
            SuspensionChange::Resumed
        );
        assert_eq!(
            suspension_change(Some(&running), false),
            SuspensionChange::Unchanged
        );
        assert_eq!(suspension_change(None, false), SuspensionChange::Unchanged);
    }
}
