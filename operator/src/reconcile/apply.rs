//! The write steps: server-side apply of the Deployment and of the status, each skipped when
//! the live object already carries exactly what would be written, so a settled relay causes no
//! writes at all.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::reconcile::build::{FIELD_MANAGER, spec_hash};
use crate::reconcile::context::Context;
use crate::reconcile::error::Error;
use crate::reconcile::events::{self, reasons};

/// Applies `desired` unless `live` already carries this exact build, and returns the
/// Deployment as the API server has it now. Replicas are compared too: `kubectl scale
/// deployment` changes them without touching the hash.
pub async fn apply_deployment(
    ctx: &Context,
    relay: &OutboxRelay,
    deployments: &Api<Deployment>,
    live: Option<Deployment>,
    desired: &Deployment,
) -> Result<Deployment, Error> {
    match live {
        Some(live)
            if spec_hash(&live) == spec_hash(desired)
                && live.spec.replicas == desired.spec.replicas =>
        {
            Ok(live)
        }
        live => {
            let name = desired.name_any();
            let applied = deployments
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(desired),
                )
                .await
                .map_err(Error::ApplyDeployment)?;
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
