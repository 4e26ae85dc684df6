//! Steps 4a and 4b of the reconcile: observe the lag, then decide the replicas.
//!
//! In manual mode `spec.replicas` decides; the lag is still observed so `kubectl get obr`
//! shows the backlog. With `spec.scaling` the pure [`recommend`] decides, with the history this
//! process remembers per relay (like the HPA controller, it starts afresh after a restart).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use outbox_relay::secret_url::SecretUrl;

use crate::autoscaler::{Observation, Recommendation, ScalingConfig, ScalingHistory, recommend};
use crate::crd::OutboxRelaySpec;
use crate::lag::{LagObservation, observe_lag};
use crate::validation::RelayPlan;

/// How long reports stay valid when no scaling block says so.
const MANUAL_STALE_AFTER: Duration = Duration::from_secs(60);

/// Scaling histories of this process, per relay.
#[derive(Debug, Default)]
pub struct ScalingMemory {
    histories: Mutex<HashMap<String, ScalingHistory>>,
}

impl ScalingMemory {
    fn get(&self, relay: &str) -> ScalingHistory {
        self.lock().get(relay).cloned().unwrap_or_default()
    }

    fn put(&self, relay: &str, history: ScalingHistory) {
        self.lock().insert(relay.to_string(), history);
    }

    pub fn forget(&self, relay: &str) {
        self.lock().remove(relay);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ScalingHistory>> {
        self.histories.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the scaling step decided and saw.
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
}

impl ScalingOutcome {
    pub fn changed(&self) -> bool {
        self.replicas != self.previous
    }
}

/// Observes and decides.
pub async fn decide_scale(
    spec: &OutboxRelaySpec,
    plan: &RelayPlan,
    database_url: &SecretUrl,
    relay_name: &str,
    live: Option<&Deployment>,
    memory: &ScalingMemory,
    now: DateTime<Utc>,
) -> ScalingOutcome {
    let previous = live.and_then(|d| d.spec.replicas).unwrap_or(0).max(0);
    let stale_after = plan
        .scaling
        .as_ref()
        .map_or(MANUAL_STALE_AFTER, |s| s.stale_after);
    let (lag, lag_problem) =
        match observe_lag(database_url, plan, relay_name, previous, stale_after).await {
            Ok(lag) => (Some(lag), None),
            Err(error) => {
                tracing::warn!(relay = relay_name, %error, "lag not observed this round");
                (None, Some(error.to_string()))
            }
        };

    let (Some(scaling), Some(scaling_plan)) = (&spec.scaling, &plan.scaling) else {
        return ScalingOutcome {
            replicas: spec.replicas.max(0),
            previous,
            lag,
            lag_problem,
            recommendation: None,
            observation: None,
            last_scale_time: None,
        };
    };
    let config = ScalingConfig::new(scaling, scaling_plan);
    let observation = Observation {
        current_replicas: previous,
        backlog: lag.as_ref().and_then(|l| l.backlog),
        backlog_age: lag.as_ref().and_then(|l| l.backlog_age),
        publish_rate: lag.as_ref().map_or(0.0, |l| l.publish_rate),
        reporting_pods: lag.as_ref().map_or(0, |l| l.reporting_pods),
    };
    let history = memory.get(relay_name);
    let (recommendation, history) = recommend(&history, now, &observation, &config);
    let last_scale_time = history.last_scale_time;
    memory.put(relay_name, history);
    ScalingOutcome {
        replicas: recommendation.replicas,
        previous,
        lag,
        lag_problem,
        recommendation: Some(recommendation),
        observation: Some(observation),
        last_scale_time,
    }
}
