//! Kubeconfig files for the control plane: the admin's and the node components' (client
//! certificates) and a ServiceAccount's (bearer token), all trusting the control plane's CA.

use std::path::Path;

use serde_json::json;

use super::certs::CertFiles;

pub fn write_certificate(path: &Path, server: &str, certs: &CertFiles) -> anyhow::Result<()> {
    write_client_certificate(path, server, certs, &certs.admin_cert, &certs.admin_key)
}

/// A kubeconfig that logs in with the client certificate `cert` (and its `key`).
pub fn write_client_certificate(
    path: &Path,
    server: &str,
    certs: &CertFiles,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<()> {
    let user = json!({ "client-certificate": cert, "client-key": key });
    write(path, server, certs, user, "default")
}

pub fn write_token(
    path: &Path,
    server: &str,
    certs: &CertFiles,
    token: &str,
    namespace: &str,
) -> anyhow::Result<()> {
    write(path, server, certs, json!({ "token": token }), namespace)
}

fn write(
    path: &Path,
    server: &str,
    certs: &CertFiles,
    user: serde_json::Value,
    namespace: &str,
) -> anyhow::Result<()> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "outbox-test",
            "cluster": { "server": server, "certificate-authority": certs.ca_cert },
        }],
        "users": [{ "name": "outbox-test-user", "user": user }],
        "contexts": [{
            "name": "outbox-test",
            "context": {
                "cluster": "outbox-test",
                "user": "outbox-test-user",
                "namespace": namespace,
            },
        }],
        "current-context": "outbox-test",
    });
    // JSON is YAML: kubectl, helm and kube-rs all read it. Owner-only, as it holds a secret.
    std::fs::write(path, serde_json::to_vec_pretty(&config)?)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}
