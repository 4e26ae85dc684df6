//! The operator brings its own CustomResourceDefinition to the cluster at start, with
//! server-side apply, because Helm never does after the first install: it installs `crds/`
//! once and never upgrades them (helm #8668), and a CRD moved into `templates/` is deleted,
//! with every OutboxRelay, on the upgrade that moves it (helm #8163). So a `helm upgrade`
//! rolls the operator, and the new operator, once leader, applies the CRD it was built with;
//! `helm uninstall` never touches the CRD (nothing of the release owns it) nor the relays.
//!
//! `--manage-crd=false` (chart value `crd.manage: false`) turns this off for clusters where
//! the operator may not write CRDs: an administrator applies `outbox-operator crd` instead,
//! and the operator only checks at start that the cluster serves the version it works on.

use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::crd::{CRD_NAME, GROUP, STORAGE_VERSION};

/// The field manager of the operator's CRD writes (`kubectl get crd -o yaml
/// --show-managed-fields` names it).
pub const FIELD_MANAGER: &str = "outbox-operator";

/// How long a CRD just applied may take until the API server serves its versions.
const SERVED_WITHIN: Duration = Duration::from_secs(60);

/// Server-side applies `crd` (forcing ownership of its fields, so the CRD an earlier install
/// created with `kubectl` or Helm is taken over) and waits until every version it serves is
/// in the API server's discovery.
///
/// Server-side apply removes only what this field manager owned: a field or version that a
/// later release drops, but that another manager also set (Helm's first install of
/// `crds/`), would stay. No release drops one yet; the one that stops serving v1alpha1 must
/// check the result, or replace the CRD's spec with an update instead.
pub async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let name = crd
        .metadata
        .name
        .as_deref()
        .context("the generated CRD has no name")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    if let Err(error) = crds.patch(name, &params, &Patch::Apply(crd)).await {
        return Err(explain(error, name));
    }
    let versions: Vec<&str> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    for version in versions {
        wait_served(client, &crd.spec.group, version, &crd.spec.names.plural).await?;
    }
    Ok(())
}

/// Fails, saying what to do, unless the cluster serves the OutboxRelay version this operator
/// works on: the check made instead of [`apply_crd`] when the operator does not manage its CRD.
pub async fn check_served(client: &Client) -> anyhow::Result<()> {
    if served(client, GROUP, STORAGE_VERSION, "outboxrelays").await? {
        return Ok(());
    }
    bail!(
        "the cluster does not serve {GROUP}/{STORAGE_VERSION} outboxrelays: apply this release's \
         CRD (`outbox-operator crd | kubectl apply --server-side --force-conflicts -f -`), or \
         let the operator apply it (--manage-crd=true, chart value crd.manage=true)"
    )
}

/// Polls the API server's discovery until `group/version` lists `plural`.
async fn wait_served(
    client: &Client,
    group: &str,
    version: &str,
    plural: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + SERVED_WITHIN;
    loop {
        if served(client, group, version, plural).await? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the API server does not serve {group}/{version} {plural} {}s after the CRD \
                 {CRD_NAME} was applied: see `kubectl get crd {CRD_NAME} -o yaml` (its status \
                 conditions)",
                SERVED_WITHIN.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether discovery lists `plural` under `group/version` (a version not served yet is a 404).
async fn served(client: &Client, group: &str, version: &str, plural: &str) -> anyhow::Result<bool> {
    match client
        .list_api_group_resources(&format!("{group}/{version}"))
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error)
            .with_context(|| format!("read the API server's discovery of {group}/{version}")),
    }
}

/// The apply's error, with the fix when it is a permission.
fn explain(error: kube::Error, name: &str) -> anyhow::Error {
    match &error {
        kube::Error::Api(status) if status.code == 403 => anyhow::anyhow!(
            "the operator may not apply its CRD {name} ({}): grant it get and patch on \
             customresourcedefinitions named {name} (the chart does with crd.manage=true), \
             or turn this off with --manage-crd=false and apply the CRD yourself \
             (`outbox-operator crd | kubectl apply --server-side --force-conflicts -f -`)",
            status.message
        ),
        kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(
            "the CRD {name} is not installed and the operator may not create it (create \
             cannot be limited to one name): install it with the chart, or \
             `outbox-operator crd | kubectl apply --server-side -f -`"
        ),
        _ => anyhow::Error::new(error).context(format!("apply the CRD {name}")),
    }
}

#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use serde_json::{Value, json};

    use super::*;
    use crate::test_support::api_server::{Reply, Step, finish, serve};
    use crate::test_support::mock_service;

    const CRD_PATH: &str =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/outboxrelays.outboxrelay.io";

    fn discovery(version: &str) -> Reply {
        Reply::ok(json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("outboxrelay.io/{version}"),
            "resources": [{"name": "outboxrelays", "singularName": "outboxrelay", "namespaced": true,
                           "kind": "OutboxRelay", "verbs": ["get", "list"]}],
        }))
    }

    fn refusal(code: u16) -> Reply {
        Reply {
            status: StatusCode::from_u16(code).unwrap(),
            body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": "customresourcedefinitions is forbidden", "code": code}),
        }
    }

    #[tokio::test]
    async fn applies_the_whole_crd_by_force_and_waits_until_each_version_is_served() {
        let (service, handle) = mock_service::pair();
        let client = Client::new(service, "default");
        let server = serve(
            handle,
            vec![
                Step::write(Method::PATCH, CRD_PATH, |body: &Value| {
                    let names: Vec<&str> = body["spec"]["versions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v["name"].as_str().unwrap())
                        .collect();
                    assert_eq!(names, ["v1beta1", "v1alpha1"]);
                    assert_eq!(body["kind"], "CustomResourceDefinition");
                }),
                // The API server takes a moment to serve a new version.
                Step::get("/apis/outboxrelay.io/v1beta1", Reply::not_found("", "")),
                Step::get("/apis/outboxrelay.io/v1beta1", discovery("v1beta1")),
                Step::get("/apis/outboxrelay.io/v1alpha1", discovery("v1alpha1")),
            ],
        );
        apply_crd(&client, &crate::crd::crd()).await.unwrap();
        drop(client);
        let seen = finish(server).await;
        assert!(
            seen[0].uri.contains("fieldManager=outbox-operator")
                && seen[0].uri.contains("force=true"),
            "{}",
            seen[0].uri
        );
    }

    #[tokio::test]
    async fn a_forbidden_apply_says_which_right_or_flag_fixes_it() {
        let (service, handle) = mock_service::pair();
        let client = Client::new(service, "default");
        let server = serve(
            handle,
            vec![Step::new(Method::PATCH, CRD_PATH, |_| refusal(403))],
        );
        let error = apply_crd(&client, &crate::crd::crd()).await.unwrap_err();
        drop(client);
        finish(server).await;
        let message = format!("{error:#}");
        for part in [
            "get and patch",
            "crd.manage",
            "--manage-crd=false",
            "outbox-operator crd",
        ] {
            assert!(message.contains(part), "{part} missing: {message}");
        }
    }

    #[tokio::test]
    async fn without_managing_the_crd_an_old_one_stops_the_start_with_the_command_to_run() {
        let (service, handle) = mock_service::pair();
        let client = Client::new(service, "default");
        let server = serve(
            handle,
            vec![Step::get(
                "/apis/outboxrelay.io/v1beta1",
                Reply::not_found("", ""),
            )],
        );
        let error = check_served(&client).await.unwrap_err();
        drop(client);
        finish(server).await;
        assert!(
            format!("{error:#}").contains("outbox-operator crd | kubectl apply"),
            "{error:#}"
        );
    }
}
