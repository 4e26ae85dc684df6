//! The recommend step, pure: the replicas for this round from what was observed.
//!
//! In manual mode `spec.replicas` decides. With `spec.scaling` the [`autoscaler`] decides,
//! with the history this process remembers per relay (like the HPA controller, it starts
//! afresh after a restart). `spec.suspend` outranks both: zero pods, and the autoscaler is not
//! asked (its history is kept as it was, and on resume it starts from the zero pods it finds,
//! as when it wakes a relay scaled to zero).
//!
//! One exception on resume: `scaling.paused` keeps the count it finds, which after a
//! suspension is zero, so a paused relay would never deliver again. While suspended, the
//! Deployment carries the count it ran with before (an annotation, on the cluster so an
//! operator restart keeps it), and a paused relay resumes with that count.
//!
//! [`autoscaler`]: crate::reconcile::scaling::autoscaler

use chrono::{DateTime, Utc};

use crate::crd::OutboxRelaySpec;
use crate::reconcile::database::LagObservation;
use crate::reconcile::driver::memory::RelayMemory;
use crate::reconcile::input::validate::RelayPlan;
use crate::reconcile::observe::Observed;
use crate::reconcile::scaling::autoscaler::{
    Observation, RateLimitSeen, Recommendation, ScalingConfig, ScalingHistory, recommend,
};

/// The autoscaler's histories of this process, per relay.
pub type ScalingMemory = RelayMemory<ScalingHistory>;

/// What the recommend step decided and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingOutcome {
    pub replicas: i32,
    /// Replicas the Deployment asked for before this round (0 when it does not exist).
    pub previous: i32,
    pub lag: Option<LagObservation>,
    /// Why the lag could not be observed (already redacted).
    pub lag_problem: Option<String>,
    /// `None` in manual mode.
    pub recommendation: Option<Recommendation>,
    /// The autoscaler's observation, for messages.
    pub observation: Option<Observation>,
    pub last_scale_time: Option<DateTime<Utc>>,
    /// `spec.suspend`: zero pods whatever the backlog; nothing was recommended.
    pub suspended: bool,
    /// While suspended, the replicas it ran with before, for the Deployment to keep (`None`
    /// when it ran none).
    pub replicas_before_suspend: Option<i32>,
}

impl ScalingOutcome {
    pub fn changed(&self) -> bool {
        self.replicas != self.previous
    }
}

/// The replicas for this round, and the history to remember (`None` in manual mode).
pub fn recommend_replicas(
    spec: &OutboxRelaySpec,
    plan: &RelayPlan,
    observed: &Observed,
    history: Option<ScalingHistory>,
    now: DateTime<Utc>,
) -> (ScalingOutcome, Option<ScalingHistory>) {
    let previous = observed.previous_replicas;
    let (lag, lag_problem) = match &observed.lag {
        Ok(lag) => (Some(lag.clone()), None),
        Err(problem) => (None, Some(problem.clone())),
    };
    if plan.suspended {
        let outcome = ScalingOutcome {
            replicas: 0,
            previous,
            lag,
            lag_problem,
            recommendation: None,
            observation: None,
            last_scale_time: history.and_then(|h| h.last_scale_time),
            suspended: true,
            // The first suspended round sees the pods still asked for; later rounds see zero
            // and keep what the first one wrote (a `kubectl scale` meanwhile changes nothing).
            replicas_before_suspend: observed
                .replicas_before_suspend
                .or((previous > 0).then_some(previous)),
        };
        return (outcome, None);
    }
    let (Some(scaling), Some(scaling_plan)) = (&spec.scaling, &plan.scaling) else {
        let outcome = ScalingOutcome {
            replicas: spec.replicas.max(0),
            previous,
            lag,
            lag_problem,
            recommendation: None,
            observation: None,
            last_scale_time: None,
            suspended: false,
            replicas_before_suspend: None,
        };
        return (outcome, None);
    };
    let config = ScalingConfig::new(scaling, scaling_plan);
    // Paused, the autoscaler keeps the count it is given: on resume, the one before the
    // suspension rather than its zero. The annotation is there only in the resume's round.
    let current = match observed.replicas_before_suspend {
        Some(before) if config.paused => before,
        _ => previous,
    };
    let observation = Observation {
        current_replicas: current,
        backlog: lag.as_ref().and_then(|l| l.backlog),
        backlog_age: lag.as_ref().and_then(|l| l.backlog_age),
        publish_rate: lag.as_ref().map_or(0.0, |l| l.publish_rate),
        reporting_pods: lag.as_ref().map_or(0, |l| l.reporting_pods),
        rate_limit: spec.relay.max_rate.map(|max_rate| RateLimitSeen {
            max_rate,
            held_back: lag.as_ref().is_some_and(|l| l.held_back_by_rate_limit()),
        }),
    };
    let (recommendation, history) =
        recommend(&history.unwrap_or_default(), now, &observation, &config);
    let outcome = ScalingOutcome {
        replicas: recommendation.replicas,
        previous,
        lag,
        lag_problem,
        recommendation: Some(recommendation),
        observation: Some(observation),
        last_scale_time: history.last_scale_time,
        suspended: false,
        replicas_before_suspend: None,
    };
    (outcome, Some(history))
}
