//! A container's environment as a kubelet resolves it: literal values, Secret keys
//! (`secretKeyRef`) and the pod's own fields (`fieldRef`).

use k8s_openapi::api::core::v1::{EnvVar, Pod, Secret};
use kube::Api;

/// Why a container cannot start yet: a kubelet reports it as `CreateContainerConfigError`
/// and retries.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("secret \"{0}\" not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in Secret {namespace}/{secret}")]
    KeyNotFound {
        namespace: String,
        secret: String,
        key: String,
    },
    #[error("the value of {0} is not UTF-8")]
    NotText(String),
    #[error("unsupported env source for {0}")]
    Unsupported(String),
    #[error("reading Secret {0}: {1}")]
    Api(String, kube::Error),
}

/// The container's variables, resolved in order.
pub async fn resolve(
    vars: &[EnvVar],
    pod: &Pod,
    secrets: &Api<Secret>,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env = Vec::with_capacity(vars.len());
    for var in vars {
        env.push((var.name.clone(), resolve_var(var, pod, secrets).await?));
    }
    Ok(env)
}

async fn resolve_var(var: &EnvVar, pod: &Pod, secrets: &Api<Secret>) -> Result<String, EnvError> {
    if let Some(value) = &var.value {
        return Ok(value.clone());
    }
    let Some(from) = &var.value_from else {
        return Ok(String::new());
    };
    if let Some(secret_ref) = &from.secret_key_ref {
        let secret = match secrets.get_opt(&secret_ref.name).await {
            Ok(Some(secret)) => secret,
            Ok(None) if secret_ref.optional == Some(true) => return Ok(String::new()),
            Ok(None) => return Err(EnvError::SecretNotFound(secret_ref.name.clone())),
            Err(error) => return Err(EnvError::Api(secret_ref.name.clone(), error)),
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&secret_ref.key))
            .map(|b| b.0.clone());
        let Some(bytes) = bytes else {
            if secret_ref.optional == Some(true) {
                return Ok(String::new());
            }
            return Err(EnvError::KeyNotFound {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                secret: secret_ref.name.clone(),
                key: secret_ref.key.clone(),
            });
        };
        return String::from_utf8(bytes).map_err(|_| EnvError::NotText(var.name.clone()));
    }
    if let Some(field) = &from.field_ref {
        let value = match field.field_path.as_str() {
            "metadata.name" => pod.metadata.name.clone(),
            "metadata.namespace" => pod.metadata.namespace.clone(),
            "metadata.uid" => pod.metadata.uid.clone(),
            "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            "spec.serviceAccountName" => pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone()),
            // Every pod of this node agent shares the host's loopback network.
            "status.podIP" | "status.hostIP" => Some("127.0.0.1".to_string()),
            _ => None,
        };
        return value.ok_or_else(|| EnvError::Unsupported(var.name.clone()));
    }
    Err(EnvError::Unsupported(var.name.clone()))
}
