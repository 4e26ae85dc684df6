//! How the tools that judge objects read an OutboxRelay: kstatus (Helm 4's `--wait`, Flux)
//! and the Argo CD health check the project ships (`config/argocd/health.lua`), both run by
//! `object-health`, a command of the tests' Go module
//! (`tests/control-plane/cmd/object-health`) built with the control plane.

use std::process::Command;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::control_plane::ControlPlane;

/// What each tool says of one object.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// `Current`, `InProgress`, `Failed`, …
    pub kstatus: String,
    pub kstatus_message: String,
    /// `Healthy`, `Progressing`, `Degraded`, …
    pub argocd: String,
    pub argocd_message: String,
}

/// The Argo CD health check in the repository.
pub fn argocd_health_check() -> std::path::PathBuf {
    crate::repo_root().join("config/argocd/health.lua")
}

/// The verdicts on `objects`, in order.
pub fn assess(plane: &ControlPlane, objects: &[serde_json::Value]) -> anyhow::Result<Vec<Verdict>> {
    let mut input = String::new();
    for object in objects {
        input.push_str(&serde_json::to_string(object)?);
        input.push('\n');
    }
    let mut command = Command::new(plane.bin_dir().join("object-health"));
    command.arg("-argocd-health").arg(argocd_health_check());
    let output =
        crate::process::output_with_stdin(&mut command, &input).context("run object-health")?;
    if !output.status.success() {
        bail!(
            "object-health failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).context("an object-health line"))
        .collect()
}
