//! metav1.Condition bookkeeping, the way Go's `meta.SetStatusCondition` does it: a condition is
//! replaced in place by type, and its lastTransitionTime moves only when its status flips, so
//! `kubectl get -o yaml` tells how long a relay has been (not) ready.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition types of an OutboxRelay.
pub const READY: &str = "Ready";
pub const INDEX_READY: &str = "IndexReady";
pub const DEGRADED: &str = "Degraded";
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const SCALING_LIMITED: &str = "ScalingLimited";
/// kstatus' conventions (see `progress`): still working towards the spec, or stuck.
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// `spec.suspend` is in force (present from the first suspension on; False once resumed).
pub const SUSPENDED: &str = "Suspended";

/// The three values Kubernetes allows for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

/// A condition as the reconciler decides it, before timestamps are settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCondition {
    pub type_: &'static str,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

impl NewCondition {
    pub fn new(
        type_: &'static str,
        status: impl Into<ConditionStatus>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Puts `new` into `conditions`: adds it when its type is absent; otherwise updates reason,
/// message and observedGeneration, and moves lastTransitionTime to `now` only when the status
/// changed. Returns true when anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    new: NewCondition,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = new.status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(Condition {
                type_: new.type_.to_string(),
                status: status.to_string(),
                reason: new.reason,
                message: new.message,
                observed_generation,
                last_transition_time: Time(now),
            });
            true
        }
        Some(existing) => {
            let mut changed = false;
            if existing.status != status {
                existing.status = status.to_string();
                existing.last_transition_time = Time(now);
                changed = true;
            }
            if existing.reason != new.reason {
                existing.reason = new.reason;
                changed = true;
            }
            if existing.message != new.message {
                existing.message = new.message;
                changed = true;
            }
            if existing.observed_generation != observed_generation {
                existing.observed_generation = observed_generation;
                changed = true;
            }
            changed
        }
    }
}

/// The condition of a type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of this type is present with status "True".
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn adding_a_condition_stamps_it_now() {
        let mut conditions = Vec::new();
        let changed = set_condition(
            &mut conditions,
            NewCondition::new(READY, false, "Progressing", "0 of 1 pods ready"),
            Some(3),
            at(100),
        );
        assert!(changed);
        assert_eq!(conditions.len(), 1);
        let ready = &conditions[0];
        assert_eq!(ready.type_, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "Progressing");
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(ready.last_transition_time, Time(at(100)));
    }

    #[test]
    fn same_status_keeps_the_transition_time_but_takes_reason_and_message() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            NewCondition::new(READY, false, "Progressing", "0 of 2 pods ready"),
            Some(1),
            at(100),
        );
        let changed = set_condition(
            &mut conditions,
            NewCondition::new(READY, false, "SecretNotFound", "Secret db not found"),
            Some(2),
            at(200),
        );
        assert!(changed);
        let ready = find(&conditions, READY).unwrap();
        assert_eq!(ready.last_transition_time, Time(at(100)));
        assert_eq!(ready.reason, "SecretNotFound");
        assert_eq!(ready.message, "Secret db not found");
        assert_eq!(ready.observed_generation, Some(2));
    }

    #[test]
    fn a_status_flip_moves_the_transition_time() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            NewCondition::new(READY, false, "Progressing", ""),
            Some(1),
            at(100),
        );
        set_condition(
            &mut conditions,
            NewCondition::new(READY, true, "Available", ""),
            Some(1),
            at(300),
        );
        let ready = find(&conditions, READY).unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(ready.last_transition_time, Time(at(300)));
        assert!(is_true(&conditions, READY));
    }

    #[test]
    fn setting_the_same_condition_again_changes_nothing() {
        let mut conditions = Vec::new();
        let condition = NewCondition::new(INDEX_READY, true, "IndexCreated", "created");
        set_condition(&mut conditions, condition.clone(), Some(1), at(100));
        let before = conditions.clone();
        assert!(!set_condition(&mut conditions, condition, Some(1), at(500)));
        assert_eq!(conditions, before);
    }

    #[test]
    fn conditions_of_other_types_are_left_alone() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            NewCondition::new(READY, true, "Available", ""),
            Some(1),
            at(100),
        );
        set_condition(
            &mut conditions,
            NewCondition::new(DEGRADED, ConditionStatus::Unknown, "Checking", ""),
            Some(1),
            at(200),
        );
        assert_eq!(conditions.len(), 2);
        assert_eq!(find(&conditions, READY).unwrap().status, "True");
        assert_eq!(find(&conditions, DEGRADED).unwrap().status, "Unknown");
        assert!(!is_true(&conditions, DEGRADED));
        assert!(!is_true(&conditions, SCALING_ACTIVE));
    }
}
