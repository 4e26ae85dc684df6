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

#[cfg(test)]
mod tests {
    //! The request sequences the real API server rarely produces: conflicts, deletions between
    //! the list and the write, a second page, a CRD whose status changed under the patch.

    use http::{Method, StatusCode};
    use serde_json::{Value, json};

    use super::*;
    use crate::crd::CRD_NAME;
    use crate::test_support::api_server::{Reply, Step, finish, serve};
    use crate::test_support::mock_service;

    const CRD_PATH: &str =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/outboxrelays.outboxrelay.io";
    const LIST: &str = "/apis/outboxrelay.io/v1beta1/outboxrelays";

    fn crd(stored: &[&str], resource_version: &str) -> Value {
        let mut crd = serde_json::to_value(crate::crd::crd()).unwrap();
        crd["metadata"]["resourceVersion"] = json!(resource_version);
        crd["status"] = json!({"storedVersions": stored});
        crd
    }

    fn relay(namespace: &str, name: &str, resource_version: &str) -> Value {
        json!({
            "apiVersion": "outboxrelay.io/v1beta1", "kind": "OutboxRelay",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "spec": {"database": {"urlSecretRef": {"name": "db"}}, "broker": {"urlSecretRef": {"name": "amqp"}}},
        })
    }

    fn page(items: Vec<Value>, next: &str) -> Reply {
        Reply::ok(json!({
            "apiVersion": "outboxrelay.io/v1beta1", "kind": "OutboxRelayList",
            "metadata": {"continue": next, "resourceVersion": "1"}, "items": items,
        }))
    }

    fn status(code: u16, reason: &str) -> Reply {
        Reply {
            status: StatusCode::from_u16(code).unwrap(),
            body: json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": reason, "reason": reason, "code": code,
            }),
        }
    }

    fn client() -> (Client, mock_service::Handle) {
        let (service, handle) = mock_service::pair();
        (Client::new(service, "default"), handle)
    }

    #[tokio::test]
    async fn conflicts_are_read_again_deleted_objects_skipped_and_every_page_listed() {
        let (client, handle) = client();
        let server = serve(
            handle,
            vec![
                Step::get(CRD_PATH, Reply::ok(crd(&["v1alpha1", "v1beta1"], "10"))),
                Step::get(LIST, page(vec![relay("x", "a", "1")], "next-page")),
                // Someone wrote `a` between the list and the rewrite: read it again.
                Step::new(
                    Method::PUT,
                    "/apis/outboxrelay.io/v1beta1/namespaces/x/outboxrelays/a",
                    |_| status(409, "Conflict"),
                ),
                Step::get(
                    "/apis/outboxrelay.io/v1beta1/namespaces/x/outboxrelays/a",
                    Reply::ok(relay("x", "a", "2")),
                ),
                Step::write(
                    Method::PUT,
                    "/apis/outboxrelay.io/v1beta1/namespaces/x/outboxrelays/a",
                    |body| assert_eq!(body["metadata"]["resourceVersion"], "2"),
                ),
                Step::get(LIST, page(vec![relay("y", "b", "1")], "")),
                // Deleted between the list and the rewrite: nothing to migrate.
                Step::new(
                    Method::PUT,
                    "/apis/outboxrelay.io/v1beta1/namespaces/y/outboxrelays/b",
                    |_| status(404, "NotFound"),
                ),
                // The API server's own controllers wrote the CRD's status meanwhile.
                Step::new(Method::PATCH, format!("{CRD_PATH}/status"), |_| {
                    status(409, "Conflict")
                }),
                Step::get(CRD_PATH, Reply::ok(crd(&["v1alpha1", "v1beta1"], "11"))),
                Step::write(Method::PATCH, format!("{CRD_PATH}/status"), |body| {
                    assert_eq!(body["status"]["storedVersions"], json!(["v1beta1"]));
                    assert_eq!(body["metadata"]["resourceVersion"], "11");
                }),
            ],
        );
        let outcome = migrate_storage(&client, CRD_NAME, &Scope::Cluster)
            .await
            .unwrap();
        drop(client);
        let seen = finish(server).await;
        assert_eq!(
            outcome,
            Outcome {
                storage_version: "v1beta1".into(),
                stored_before: vec!["v1alpha1".into(), "v1beta1".into()],
                rewritten: 1,
                stored_versions_updated: true,
            }
        );
        assert!(seen[1].uri.contains("limit=200"), "{}", seen[1].uri);
        assert!(
            seen[5].uri.contains("continue=next-page"),
            "{}",
            seen[5].uri
        );
    }

    #[tokio::test]
    async fn watched_namespaces_are_rewritten_but_stored_versions_left_alone() {
        let (client, handle) = client();
        let server = serve(
            handle,
            vec![
                Step::get(CRD_PATH, Reply::ok(crd(&["v1alpha1", "v1beta1"], "10"))),
                Step::get(
                    "/apis/outboxrelay.io/v1beta1/namespaces/team/outboxrelays",
                    page(vec![relay("team", "a", "1")], ""),
                ),
                Step::write(
                    Method::PUT,
                    "/apis/outboxrelay.io/v1beta1/namespaces/team/outboxrelays/a",
                    |_| {},
                ),
            ],
        );
        let scope = Scope::Namespaces(vec!["team".into()]);
        let outcome = migrate_storage(&client, CRD_NAME, &scope).await.unwrap();
        drop(client);
        finish(server).await;
        assert_eq!(outcome.rewritten, 1);
        assert!(!outcome.stored_versions_updated);
    }

    #[tokio::test]
    async fn nothing_is_listed_when_only_the_storage_version_is_stored() {
        let (client, handle) = client();
        let server = serve(
            handle,
            vec![Step::get(CRD_PATH, Reply::ok(crd(&["v1beta1"], "10")))],
        );
        let outcome = migrate_storage(&client, CRD_NAME, &Scope::Cluster)
            .await
            .unwrap();
        drop(client);
        finish(server).await;
        assert_eq!(outcome.rewritten, 0);
    }

    #[tokio::test]
    async fn a_new_storage_version_during_the_migration_stops_it() {
        let (client, handle) = client();
        let mut moved = crd(&["v1alpha1", "v1beta1"], "11");
        for version in moved["spec"]["versions"].as_array_mut().unwrap() {
            version["storage"] = json!(version["name"] == "v1alpha1");
        }
        let server = serve(
            handle,
            vec![
                Step::get(CRD_PATH, Reply::ok(crd(&["v1alpha1", "v1beta1"], "10"))),
                Step::get(LIST, page(vec![], "")),
                Step::new(Method::PATCH, format!("{CRD_PATH}/status"), |_| {
                    status(409, "Conflict")
                }),
                Step::get(CRD_PATH, Reply::ok(moved)),
            ],
        );
        let error = migrate_storage(&client, CRD_NAME, &Scope::Cluster)
            .await
            .unwrap_err();
        drop(client);
        finish(server).await;
        assert!(
            format!("{error:#}").contains("storage version of the CRD"),
            "{error:#}"
        );
    }
}
