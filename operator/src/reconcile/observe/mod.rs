//! The observe step: the relay's Deployment and its pods as the API server has them, and the
//! lag as the database has it.
//!
//! In manual mode, and while suspended, the lag is still observed, so `kubectl get obr` shows
//! the backlog. A lag that
//! cannot be read does not stop the reconcile: the autoscaler knows what to do without it (its
//! fallback), and the status says why. Two answers do stop it: the table claimed by another
//! relay, and a database that is a read-only standby.
//!
//! The pods' side, their OOM kills read from the container statuses, is in [`pods`].

pub mod pods;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use outbox_relay::database::DatabaseTarget;

use crate::reconcile::build::replicas_before_suspend;
use crate::reconcile::database::{LagObservation, LagQuery, RelayDatabase};
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::validate::RelayPlan;
use crate::reconcile::observe::pods::{OomKill, observe_oom_kills};

/// How long reports stay valid when no scaling block says so.
const MANUAL_STALE_AFTER: Duration = Duration::from_secs(60);

/// What the observe step saw.
#[derive(Debug, Clone)]
pub struct Observed {
    pub live: Option<Deployment>,
    /// Replicas the Deployment asked for before this round (0 when it does not exist).
    pub previous_replicas: i32,
    /// The replicas before `spec.suspend` scaled it to zero, as its annotation says.
    pub replicas_before_suspend: Option<i32>,
    /// The lag, or why it could not be read (already redacted).
    pub lag: Result<LagObservation, String>,
    /// Relay pods the kernel killed for exceeding their memory limit.
    pub oom_kills: Vec<OomKill>,
}

/// Where the relay's objects are on the API server.
pub struct RelayObjects<'a> {
    pub deployments: &'a Api<Deployment>,
    pub pods: &'a Api<Pod>,
    /// The Deployment's name.
    pub name: &'a str,
    /// The label selector of its pods.
    pub selector: &'a str,
}

/// Reads the Deployment and its pods, then the lag of `relay_name`.
pub async fn observe(
    objects: RelayObjects<'_>,
    database: &dyn RelayDatabase,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    relay_name: &str,
) -> Result<Observed, Error> {
    let live = objects
        .deployments
        .get_opt(objects.name)
        .await
        .map_err(Error::ObserveDeployment)?;
    let oom_kills = observe_oom_kills(objects.pods, objects.selector).await;
    let previous_replicas = live
        .as_ref()
        .and_then(|d| d.spec.replicas)
        .unwrap_or(0)
        .max(0);
    let before_suspend = live.as_ref().and_then(replicas_before_suspend);
    let query = LagQuery {
        relay_name: relay_name.to_string(),
        // Suspended, the pods are going or gone: the operator counts from the first round on.
        running: if plan.suspended { 0 } else { previous_replicas },
        stale_after: plan
            .scaling
            .as_ref()
            .map_or(MANUAL_STALE_AFTER, |s| s.stale_after),
    };
    let lag = match database.observe_lag(target, plan, query).await {
        // Another relay holds the table: this one must stop here, before it runs pods.
        Err(error @ Error::TableClaimed { .. }) => return Err(error),
        // Only a read-only standby answers (a failover under way): no pod can settle a row
        // either, so the reason outranks how far their rollout got. The round stops here,
        // leaving the Deployment as it is, and is retried with backoff until a primary answers.
        Err(error @ Error::DatabaseReadOnly(_)) => return Err(error),
        Err(error) => {
            tracing::warn!(%error, "lag not observed this round");
            Err(error.to_string())
        }
        Ok(lag) => Ok(lag),
    };
    Ok(Observed {
        live,
        previous_replicas,
        replicas_before_suspend: before_suspend,
        lag,
        oom_kills,
    })
}
