//! The container's environment as the kubelet resolves it: values, Secret keys and the pod's
//! own name.

use k8s_openapi::api::core::v1::{EnvVar, Secret};
use kube::Api;

/// An environment variable as the kubelet hands it to the process.
#[derive(Debug, Clone)]
pub(super) enum EnvSource {
    Value(String, String),
    /// `fieldRef: metadata.name`: the pod's own name.
    PodName(String),
}

pub(super) async fn resolve_var(var: &EnvVar, secrets: &Api<Secret>) -> anyhow::Result<EnvSource> {
    if let Some(value) = &var.value {
        return Ok(EnvSource::Value(var.name.clone(), value.clone()));
    }
    let Some(from) = &var.value_from else {
        return Ok(EnvSource::Value(var.name.clone(), String::new()));
    };
    if let Some(secret_ref) = &from.secret_key_ref {
        let secret = secrets.get(&secret_ref.name).await?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&secret_ref.key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&secret_ref.key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "key {} missing in Secret {}",
                    secret_ref.key,
                    secret_ref.name
                )
            })?;
        return Ok(EnvSource::Value(
            var.name.clone(),
            String::from_utf8(bytes)?,
        ));
    }
    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
        Some("metadata.name") => Ok(EnvSource::PodName(var.name.clone())),
        other => anyhow::bail!("unsupported env source {other:?} for {}", var.name),
    }
}
