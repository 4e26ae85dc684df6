//! The observe step: the relay's Deployment as the API server has it, and the lag as the
//! database has it.
//!
//! In manual mode the lag is still observed, so `kubectl get obr` shows the backlog. A lag that
//! cannot be read does not stop the reconcile: the autoscaler knows what to do without it (its
//! fallback), and the status says why.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use outbox_relay::database::DatabaseTarget;

use crate::reconcile::database::{LagObservation, LagQuery, RelayDatabase};
use crate::reconcile::error::Error;
use crate::reconcile::validate::RelayPlan;

/// How long reports stay valid when no scaling block says so.
const MANUAL_STALE_AFTER: Duration = Duration::from_secs(60);

/// What the observe step saw.
#[derive(Debug, Clone)]
pub struct Observed {
    pub live: Option<Deployment>,
    /// Replicas the Deployment asked for before this round (0 when it does not exist).
    pub previous_replicas: i32,
    /// The lag, or why it could not be read (already redacted).
    pub lag: Result<LagObservation, String>,
}

/// Reads the Deployment `name`, then the lag of `relay_name`.
pub async fn observe(
    deployments: &Api<Deployment>,
    name: &str,
    database: &dyn RelayDatabase,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    relay_name: &str,
) -> Result<Observed, Error> {
    let live = deployments
        .get_opt(name)
        .await
        .map_err(Error::ObserveDeployment)?;
    let previous_replicas = live
        .as_ref()
        .and_then(|d| d.spec.replicas)
        .unwrap_or(0)
        .max(0);
    let query = LagQuery {
        relay_name: relay_name.to_string(),
        running: previous_replicas,
        stale_after: plan
            .scaling
            .as_ref()
            .map_or(MANUAL_STALE_AFTER, |s| s.stale_after),
    };
    let lag = database
        .observe_lag(target, plan, query)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "lag not observed this round");
            error.to_string()
        });
    Ok(Observed {
        live,
        previous_replicas,
        lag,
    })
}
