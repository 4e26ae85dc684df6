//! One pod: its relay process, started from the pod template, and its life cycle.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use tokio::process::{Child, Command};

use super::env::EnvSource;
use crate::process;

/// The log line after which a relay counts as ready.
const READY_LOG_LINE: &str = "relaying";

/// A pod of a Deployment, and the process running its container (if any).
pub(super) struct Pod {
    pub(super) name: String,
    pub(super) template_hash: String,
    pub(super) child: Option<Child>,
    pub(super) log: PathBuf,
    /// Length of the log when the current process started; readiness looks after it.
    pub(super) log_offset: u64,
    pub(super) ready: bool,
    pub(super) exited_at: Option<Instant>,
    pub(super) started_at: Instant,
    /// False until a process first started: a pod that never ran starts without delay.
    pub(super) ran: bool,
}

impl Pod {
    /// Whether the process should be (re)started now.
    pub(super) fn start_due(&self, restart_delay: Duration) -> bool {
        match self.exited_at {
            Some(_) if !self.ran => true,
            Some(at) => at.elapsed() >= restart_delay,
            None => false,
        }
    }
}

/// Starts (or restarts) the pod's process.
pub(super) fn restart(pod: &mut Pod, container: &Container, env: &[EnvSource]) {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&pod.log)
        .expect("open the pod log");
    pod.log_offset = log_file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut command = Command::new(program(container));
    command
        .args(local_args(container.args.as_deref().unwrap_or_default()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true);
    for source in env {
        match source {
            EnvSource::Value(name, value) => command.env(name, value),
            EnvSource::PodName(name) => command.env(name, &pod.name),
        };
    }
    match command.spawn() {
        Ok(child) => {
            pod.child = Some(child);
            pod.exited_at = None;
            pod.ready = false;
            pod.ran = true;
        }
        Err(error) => {
            tracing::warn!(pod = %pod.name, %error, "kubelet could not start the process");
            pod.exited_at = Some(Instant::now());
        }
    }
}

/// The image's relay binary is the one built next to the tests.
pub(super) fn program(container: &Container) -> PathBuf {
    let command = container
        .command
        .as_ref()
        .and_then(|c| c.first())
        .map(String::as_str)
        .unwrap_or("outbox-relay");
    let name = command.rsplit('/').next().unwrap_or(command);
    process::binary(name)
}

/// The container args, with the metrics server on an ephemeral local port so that several
/// relays share one machine.
pub fn local_args(args: &[String]) -> Vec<String> {
    let mut local = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--metrics-addr" {
            iter.next();
            local.extend(["--metrics-addr".to_string(), "127.0.0.1:0".to_string()]);
        } else if arg.starts_with("--metrics-addr=") {
            local.push("--metrics-addr=127.0.0.1:0".to_string());
        } else {
            local.push(arg.clone());
        }
    }
    local
}

/// Notices an exited process and a process that became ready.
pub(super) fn refresh(pod: &mut Pod) {
    if !alive(pod) {
        pod.ready = false;
        if pod.exited_at.is_none() {
            pod.exited_at = Some(Instant::now());
        }
        return;
    }
    if !pod.ready {
        pod.ready = std::fs::read(&pod.log).is_ok_and(|text| {
            let start = (pod.log_offset as usize).min(text.len());
            String::from_utf8_lossy(&text[start..]).contains(READY_LOG_LINE)
        });
    }
}

pub(super) fn alive(pod: &mut Pod) -> bool {
    match pod.child.as_mut() {
        Some(child) => match child.try_wait() {
            Ok(None) => true,
            Ok(Some(_)) | Err(_) => {
                pod.child = None;
                false
            }
        },
        None => false,
    }
}

/// SIGTERM, then SIGKILL if the process outlives `grace`.
pub(super) async fn terminate(mut child: Child, grace: Duration) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_address_moves_to_an_ephemeral_local_port() {
        let args: Vec<String> = ["run", "--metrics-addr", "0.0.0.0:9090", "--table", "t"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            local_args(&args),
            ["run", "--metrics-addr", "127.0.0.1:0", "--table", "t"]
        );
    }
}
