//! Running the machine's tools (ip, ctr, buildah, nsenter) to completion.

use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// Runs `command` to completion and returns its stdout; on failure, an error that names it
/// (`what`, e.g. "ip route add …") and quotes its stderr. `hint` says where the program comes
/// from when it cannot be started at all.
pub fn output_of(command: &mut Command, what: &str, hint: &str) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {what} ({hint})"))?;
    if !output.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
