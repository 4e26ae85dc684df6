//! A container's volumes as a kubelet materializes them, as files in a folder per pod that the
//! container gets as bind mounts: Secret and ConfigMap volumes, emptyDir, and projected volumes
//! (the ServiceAccount admission plugin's `kube-api-access-*`: a token from the TokenRequest
//! API bound to the pod, the cluster CA from `kube-root-ca.crt`, the namespace).
//!
//! Files are written once, when the container first starts. The token is requested with the
//! admission plugin's 3607 s, which the API server extends to a year for pod-bound tokens
//! (`--service-account-extend-token-expiration`, on by default), so it is never refreshed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount,
    VolumeProjection,
};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::oci::Mount;

/// Writes every volume `container` mounts under `dir` and returns the mounts.
pub async fn materialize(
    client: &Client,
    pod: &Pod,
    container: &Container,
    dir: &Path,
) -> anyhow::Result<Vec<Mount>> {
    let namespace = pod.namespace().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone());
    let volumes = volumes.unwrap_or_default();
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .ok_or_else(|| anyhow::anyhow!("volume {} is not defined", mount.name))?;
        let folder = dir.join(&volume.name);
        let mut read_only = true;
        if !folder.exists() {
            std::fs::create_dir_all(&folder)?;
            let files = if let Some(secret) = &volume.secret {
                let name = secret.secret_name.clone().unwrap_or_default();
                secret_files(client, &namespace, &name, secret.items.as_deref()).await?
            } else if let Some(config_map) = &volume.config_map {
                let items = config_map.items.as_deref();
                config_map_files(client, &namespace, &config_map.name, items).await?
            } else if let Some(projected) = &volume.projected {
                let sources = projected.sources.iter().flatten();
                let mut files = BTreeMap::new();
                for source in sources {
                    files.extend(projection_files(client, pod, source).await?);
                }
                files
            } else if volume.empty_dir.is_some() {
                BTreeMap::new()
            } else {
                anyhow::bail!(
                    "volume {} is of a kind this node agent does not run",
                    volume.name
                );
            };
            write_files(&folder, &files)?;
        }
        if volume.empty_dir.is_some() {
            read_only = mount.read_only.unwrap_or(false);
            make_writable_by_anyone(&folder)?;
        }
        mounts.push(Mount {
            source: folder,
            destination: mount.mount_path.clone(),
            read_only,
        });
    }
    Ok(mounts)
}

async fn projection_files(
    client: &Client,
    pod: &Pod,
    source: &VolumeProjection,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let namespace = pod.namespace().unwrap_or_default();
    if let Some(token) = &source.service_account_token {
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone());
        let account = account.unwrap_or_else(|| "default".into());
        // Built from JSON: the generated types of TokenRequest change shape between releases.
        let audiences: Vec<&String> = token.audience.iter().collect();
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {
                "audiences": audiences,
                "expirationSeconds": token.expiration_seconds.unwrap_or(3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()},
            },
        }))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        let issued = accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await?;
        let token_text = issued.status.and_then(|s| s.token).unwrap_or_default();
        return Ok(BTreeMap::from([(
            token.path.clone(),
            token_text.into_bytes(),
        )]));
    }
    if let Some(config_map) = &source.config_map {
        let items = config_map.items.as_deref();
        return config_map_files(client, &namespace, &config_map.name, items).await;
    }
    if let Some(secret) = &source.secret {
        return secret_files(client, &namespace, &secret.name, secret.items.as_deref()).await;
    }
    if let Some(downward) = &source.downward_api {
        let items = downward.items.iter().flatten();
        return items.map(|item| downward_file(pod, item)).collect();
    }
    anyhow::bail!("a projected source this node agent does not run")
}

fn downward_file(pod: &Pod, item: &DownwardAPIVolumeFile) -> anyhow::Result<(String, Vec<u8>)> {
    let field = item.field_ref.as_ref().map(|f| f.field_path.as_str());
    let value = match field {
        Some("metadata.namespace") => pod.namespace().unwrap_or_default(),
        Some("metadata.name") => pod.name_any(),
        Some("metadata.uid") => pod.uid().unwrap_or_default(),
        other => anyhow::bail!("downward API field {other:?} is not supported here"),
    };
    Ok((item.path.clone(), value.into_bytes()))
}

async fn config_map_files(
    client: &Client,
    namespace: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let found = config_maps.get(name).await?;
    let data = found.data.unwrap_or_default();
    let data = data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
    Ok(select(data, items))
}

async fn secret_files(
    client: &Client,
    namespace: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = secrets.get(name).await?;
    let data = found.data.unwrap_or_default();
    let data = data.into_iter().map(|(k, v)| (k, v.0)).collect();
    Ok(select(data, items))
}

/// Every key as a file of its own name, or only the listed keys at their paths.
fn select(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
) -> BTreeMap<String, Vec<u8>> {
    match items {
        None => data,
        Some(items) => items
            .iter()
            .filter_map(|item| Some((item.path.clone(), data.get(&item.key)?.clone())))
            .collect(),
    }
}

fn write_files(folder: &Path, files: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    for (path, bytes) in files {
        let file: PathBuf = folder.join(path);
        anyhow::ensure!(
            file.starts_with(folder) && !path.contains(".."),
            "volume path {path} leaves its volume"
        );
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
        // Readable by the container's non-root user, as a kubelet's 0644 default mode.
        set_mode(&file, 0o644)?;
    }
    set_mode(folder, 0o755)
}

fn make_writable_by_anyone(folder: &Path) -> anyhow::Result<()> {
    set_mode(folder, 0o1777)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}
