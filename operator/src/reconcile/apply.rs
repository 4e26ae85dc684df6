//! The write steps: server-side apply of the Deployment (with the relay pods'
//! PodDisruptionBudget) and of the status, each skipped when the live object already carries
//! exactly what would be written, so a settled relay causes no writes at all.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::reconcile::build::{FIELD_MANAGER, replicas_before_suspend, spec_hash};
use crate::reconcile::driver::context::Context;
use crate::reconcile::driver::error::Error;
use crate::reconcile::status::events::{self, reasons};

/// Applies `desired` (and the disruption `budget`, whose content the Deployment's hash covers)
/// unless `live` already carries this exact build, and returns the Deployment as the API
/// server has it now. Replicas are compared too: `kubectl scale deployment` changes them
/// without touching the hash, and so is the count remembered while suspended (outside the
/// hash), so a resume that keeps zero pods still drops it.
pub async fn apply_deployment(
    ctx: &Context,
    relay: &OutboxRelay,
    deployments: &Api<Deployment>,
    live: Option<Deployment>,
    desired: &Deployment,
    budget: Option<&PodDisruptionBudget>,
) -> Result<Deployment, Error> {
    let name = desired.name_any();
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let budgets = Api::namespaced(ctx.client.clone(), &namespace);
    match live {
        Some(live)
            if spec_hash(&live) == spec_hash(desired)
                && live.spec.replicas == desired.spec.replicas
                && replicas_before_suspend(&live) == replicas_before_suspend(desired) =>
        {
            restore_disruption_budget(&budgets, &name, budget).await?;
            Ok(live)
        }
        live => {
            let applied = deployments
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(desired),
                )
                .await
                .map_err(Error::ApplyDeployment)?;
            apply_disruption_budget(&budgets, &name, budget).await?;
            let (reason, verb) = if live.is_some() {
                (reasons::DEPLOYMENT_UPDATED, "updated")
            } else {
                (reasons::DEPLOYMENT_CREATED, "created")
            };
            let replicas = desired.spec.replicas.unwrap_or(0);
            events::publish(
                &ctx.recorder,
                relay,
                EventType::Normal,
                reason,
                "ApplyDeployment",
                format!("{verb} Deployment {name} with {replicas} replicas"),
            )
            .await;
            Ok(applied)
        }
    }
}

/// Puts back a budget the spec wants but someone deleted: the Deployment's hash says the
/// budget was applied, not that it is still there. One read per round, and no write while it
/// exists (a budget edited by hand is set right at the next change of the Deployment).
async fn restore_disruption_budget(
    budgets: &Api<PodDisruptionBudget>,
    name: &str,
    budget: Option<&PodDisruptionBudget>,
) -> Result<(), Error> {
    let Some(budget) = budget else {
        return Ok(());
    };
    let live = budgets
        .get_opt(name)
        .await
        .map_err(Error::ApplyDisruptionBudget)?;
    match live {
        Some(_) => Ok(()),
        None => apply_disruption_budget(budgets, name, Some(budget)).await,
    }
}

/// Applies the relay pods' PodDisruptionBudget, or deletes the one called `name` when the
/// spec turned it off (nothing to do when there is none).
async fn apply_disruption_budget(
    budgets: &Api<PodDisruptionBudget>,
    name: &str,
    budget: Option<&PodDisruptionBudget>,
) -> Result<(), Error> {
    let result = match budget {
        Some(budget) => budgets
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(budget),
            )
            .await
            .map(drop),
        None => match budgets.delete(name, &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            other => other.map(drop),
        },
    };
    result.map_err(Error::ApplyDisruptionBudget)
}

/// Writes `status` with server-side apply, unless it equals what the object already has.
pub async fn write_status(
    ctx: &Context,
    relay: &OutboxRelay,
    status: &OutboxRelayStatus,
) -> Result<(), Error> {
    if relay.status.as_ref() == Some(status) {
        return Ok(());
    }
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let relays: Api<OutboxRelay> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": OutboxRelay::api_version(&()),
        "kind": OutboxRelay::kind(&()),
        "status": status,
    });
    relays
        .patch_status(
            &relay.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::PatchStatus)?;
    Ok(())
}
