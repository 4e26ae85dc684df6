//! Rewrites every stored object of a CRD at its storage version, then brings the CRD's
//! `status.storedVersions` down to that version alone: what lets a later release stop
//! serving an old version. The API server refuses a CRD whose `storedVersions` names a version
//! it no longer lists ("status.storedVersions[0]: Invalid value: \"v1alpha1\": must appear in
//! spec.versions"), and it never lowers `storedVersions` itself, because it cannot know that
//! no object in etcd is still encoded at the old version. kube-rs ships no migrator (Kubernetes
//! has kube-storage-version-migrator, a separate install), so the operator does it, as the
//! leader, after applying its CRD; `outbox-operator migrate-storage` does the same by hand.
//!
//! How an object is rewritten: read it through the storage version and `PUT` it back
//! unchanged. The API server skips a write only when the new encoding equals the stored bytes;
//! an object stored at an older version was encoded with that version's `apiVersion`, so its
//! bytes differ and it is written again, at the storage version. Its `generation` stays
//! (the spec did not change), so no reconcile redoes anything; its status is kept (a write to
//! the main resource carries the stored status along).
//!
//! Generic over the CRD (its name is a parameter), so the tests run it on CRDs of their own.

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

/// Objects listed per request.
const PAGE: u32 = 200;
/// Attempts at rewriting one object that keeps being changed under us.
const ATTEMPTS: usize = 5;

/// Where the migration looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace: afterwards no object can be at an old version, so `storedVersions` is
    /// brought down.
    Cluster,
    /// These namespaces only (an operator restricted to them may list nothing else): their
    /// objects are rewritten, but `storedVersions` is left alone, since other namespaces may
    /// still hold old objects. `outbox-operator migrate-storage` finishes the job.
    Namespaces(Vec<String>),
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The storage version every object is now at.
    pub storage_version: String,
    /// `status.storedVersions` as found.
    pub stored_before: Vec<String>,
    /// Objects written again.
    pub rewritten: usize,
    /// Whether `storedVersions` is now the storage version alone.
    pub stored_versions_updated: bool,
}

/// Migrates the objects of CRD `crd_name` in `scope`. Does nothing when `storedVersions` is
/// already the storage version alone.
pub async fn migrate_storage(
    client: &Client,
    crd_name: &str,
    scope: &Scope,
) -> anyhow::Result<Outcome> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get(crd_name)
        .await
        .with_context(|| format!("read the CRD {crd_name}"))?;
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .with_context(|| format!("the CRD {crd_name} has no storage version"))?
        .name
        .clone();
    let stored_before = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let mut outcome = Outcome {
        storage_version: storage.clone(),
        stored_before: stored_before.clone(),
        rewritten: 0,
        stored_versions_updated: false,
    };
    if stored_before == [storage.clone()] {
        return Ok(outcome);
    }
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &storage, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let apis: Vec<Api<DynamicObject>> = match scope {
        Scope::Cluster => vec![Api::all_with(client.clone(), &resource)],
        Scope::Namespaces(namespaces) => namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, &resource))
            .collect(),
    };
    for api in &apis {
        outcome.rewritten += rewrite_all(client, api, &resource).await?;
    }
    if *scope == Scope::Cluster {
        set_stored_versions(&crds, crd, &storage).await?;
        outcome.stored_versions_updated = true;
    }
    Ok(outcome)
}

/// Sets `status.storedVersions` to `[storage]`. A merge patch replaces the list; the
/// resourceVersion makes it conditional. On a conflict (the API server's own controllers write
/// the CRD's status conditions too) the CRD is read again, and the patch only retried while
/// `storage` is still its storage version: under a newer one, objects may have been written at
/// it meanwhile, and the next start migrates again.
async fn set_stored_versions(
    crds: &Api<CustomResourceDefinition>,
    mut crd: CustomResourceDefinition,
    storage: &str,
) -> anyhow::Result<()> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    for _ in 0..ATTEMPTS {
        let patch = json!({
            "metadata": {"resourceVersion": crd.metadata.resource_version},
            "status": {"storedVersions": [storage]},
        });
        match crds
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                crd = crds.get(&name).await?;
                if !crd
                    .spec
                    .versions
                    .iter()
                    .any(|v| v.storage && v.name == storage)
                {
                    bail!(
                        "the storage version of the CRD {name} changed from {storage} during                          the migration; the next start of the operator migrates again"
                    );
                }
            }
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("set status.storedVersions of the CRD {name}"));
            }
        }
    }
    bail!("the CRD {name} changed under every one of {ATTEMPTS} updates of its storedVersions")
}

/// Rewrites every object `api` lists, page by page; returns how many.
async fn rewrite_all(
    client: &Client,
    api: &Api<DynamicObject>,
    resource: &ApiResource,
) -> anyhow::Result<usize> {
    let mut rewritten = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("list {} to rewrite them", resource.plural))?;
        for object in &page.items {
            if rewrite_one(client, resource, object).await? {
                rewritten += 1;
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(rewritten),
        }
    }
}

/// `PUT`s `object` back unchanged; on a conflict (someone wrote it meanwhile), reads it again
/// and retries. False when it was deleted meanwhile.
async fn rewrite_one(
    client: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
) -> anyhow::Result<bool> {
    let name = object
        .metadata
        .name
        .clone()
        .context("a listed object has no name")?;
    let api: Api<DynamicObject> = match &object.metadata.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let mut current = object.clone();
    for _ in 0..ATTEMPTS {
        match api.replace(&name, &PostParams::default(), &current).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match api.get_opt(&name).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(false),
                }
            }
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("rewrite {} {name} at its storage version", resource.kind)
                });
            }
        }
    }
    bail!(
        "{} {name} changed under every one of {ATTEMPTS} rewrites; the next start of the \
         operator tries again",
        resource.kind
    )
}
