//! kstatus' two conditions, decided next to Ready: `Reconciling` while the operator is still
//! working towards what the spec asks (a rollout, a migration, a retry after a passing
//! failure), `Stalled` when it cannot get there without a person (a missing Secret, an invalid
//! spec, pods that cannot relay, a failure that has lasted [`STALL_AFTER`]). Tools that read
//! kstatus' conventions (Helm 4's `--wait`, Flux, an Argo CD health check) then say
//! InProgress, Failed or Current instead of waiting for a timeout. Both are always written,
//! `False` when they do not hold, so a script can tell "not stalled" from "not there yet".

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::reconcile::status::conditions::{NewCondition, RECONCILING, STALLED};

/// How long a failure the operator retries on its own (the database unreachable, the lag
/// reports unreadable) may last before the relay counts as Stalled: a restart or failover of
/// the database is over well within it; a wrong host name is not.
pub const STALL_AFTER: Duration = Duration::from_secs(5 * 60);

/// Where a reconcile left the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// What the spec asks for is in place.
    Done,
    /// Still on the way; `reason` and `message` say what is awaited.
    Working { reason: String, message: String },
    /// Not getting there without a person; `reason` and `message` say why.
    Stuck { reason: String, message: String },
}

impl Progress {
    pub fn working(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Progress::Working {
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn stuck(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Progress::Stuck {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A failure the operator retries by itself: working on it until it has lasted
    /// [`STALL_AFTER`] since the relay stopped being ready (`not_ready_since`), stuck after.
    pub fn retrying(
        reason: &str,
        message: &str,
        not_ready_since: Option<Timestamp>,
        now: Timestamp,
    ) -> Self {
        let lasted = not_ready_since
            .and_then(|since| now.duration_since(since).try_into().ok())
            .unwrap_or(Duration::ZERO);
        if lasted >= STALL_AFTER {
            Progress::stuck(
                reason,
                format!("{message} (for {} minutes)", lasted.as_secs() / 60),
            )
        } else {
            Progress::working(reason, message)
        }
    }

    /// The Reconciling and Stalled conditions this progress stands for.
    pub fn conditions(&self) -> [NewCondition; 2] {
        match self {
            Progress::Done => [
                NewCondition::new(RECONCILING, false, "Reconciled", "the spec is in place"),
                NewCondition::new(STALLED, false, "Reconciled", "the spec is in place"),
            ],
            Progress::Working { reason, message } => [
                NewCondition::new(RECONCILING, true, reason, message),
                NewCondition::new(STALLED, false, reason, "the operator is working on it"),
            ],
            Progress::Stuck { reason, message } => [
                NewCondition::new(RECONCILING, false, reason, "waiting for a fix"),
                NewCondition::new(STALLED, true, reason, message),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::status::conditions::ConditionStatus;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn done_working_and_stuck_set_exactly_one_condition_true_at_most() {
        let statuses = |progress: Progress| {
            let [reconciling, stalled] = progress.conditions();
            (reconciling.status, stalled.status)
        };
        use ConditionStatus::{False, True};
        assert_eq!(statuses(Progress::Done), (False, False));
        assert_eq!(
            statuses(Progress::working("Progressing", "")),
            (True, False)
        );
        assert_eq!(
            statuses(Progress::stuck("SecretNotFound", "")),
            (False, True)
        );
    }

    #[test]
    fn a_retried_failure_stalls_once_it_has_lasted_long_enough() {
        let since = Some(at(1_000));
        let early = Progress::retrying("DatabaseUnreachable", "refused", since, at(1_060));
        assert_eq!(early, Progress::working("DatabaseUnreachable", "refused"));
        let late = Progress::retrying("DatabaseUnreachable", "refused", since, at(1_000 + 301));
        assert_eq!(
            late,
            Progress::stuck("DatabaseUnreachable", "refused (for 5 minutes)")
        );
        // Without a transition time (a first failure) it is a fresh one.
        let first = Progress::retrying("DatabaseUnreachable", "refused", None, at(5_000));
        assert!(matches!(first, Progress::Working { .. }));
    }
}
