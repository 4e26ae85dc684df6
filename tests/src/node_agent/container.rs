//! One pod's container as a local process: the image's binary mapped to the build next to the
//! tests, its declared ports mapped to free loopback ports, and its readiness probe.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::process::{Child, Command};

use crate::control_plane::spawn::die_with_parent_tokio;
use crate::process;

/// A container's declared ports, each mapped to a free loopback port: pods share the host's
/// network here, so two pods of one Deployment cannot both listen on 9090.
#[derive(Debug, Clone, Default)]
pub struct PortMap {
    /// containerPort → host port.
    pub by_number: BTreeMap<i32, u16>,
    /// port name → containerPort.
    pub by_name: BTreeMap<String, i32>,
}

impl PortMap {
    pub fn allocate(container: &Container) -> anyhow::Result<Self> {
        let mut map = PortMap::default();
        for port in container.ports.iter().flatten() {
            let host = crate::control_plane::free_port()?;
            map.by_number.insert(port.container_port, host);
            if let Some(name) = &port.name {
                map.by_name.insert(name.clone(), port.container_port);
            }
        }
        Ok(map)
    }

    /// The host port a probe's `port` (number or name) reaches.
    pub fn host_port(&self, port: &IntOrString) -> Option<u16> {
        let number = match port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => *self.by_name.get(name)?,
        };
        self.by_number.get(&number).copied()
    }

    /// `value` with a listen address on a declared port (`0.0.0.0:9090`, `:9090`,
    /// `127.0.0.1:9090`) moved to that port's loopback host port.
    pub fn rewrite(&self, value: &str) -> String {
        for (container_port, host_port) in &self.by_number {
            for host in ["0.0.0.0", "127.0.0.1", "[::]", ""] {
                if value == format!("{host}:{container_port}") {
                    return format!("127.0.0.1:{host_port}");
                }
                if let Some(flag) = value.strip_suffix(&format!("={host}:{container_port}")) {
                    return format!("{flag}=127.0.0.1:{host_port}");
                }
            }
        }
        value.to_string()
    }
}

/// The running (or last) process of a container.
pub struct Process {
    pub child: Child,
    pub started_at: chrono::DateTime<chrono::Utc>,
}

/// The binary an image path such as `/usr/local/bin/outbox-relay` names: the one built next
/// to the tests.
pub fn program(container: &Container) -> anyhow::Result<PathBuf> {
    let command = container
        .command
        .as_ref()
        .and_then(|c| c.first())
        .ok_or_else(|| anyhow::anyhow!("container {} names no command", container.name))?;
    let name = command.rsplit('/').next().unwrap_or(command);
    Ok(process::binary(name))
}

/// Starts the container's process with `env`, its ports mapped, stderr and stdout to `log`.
pub fn start(
    container: &Container,
    env: &[(String, String)],
    ports: &PortMap,
    log: &PathBuf,
) -> anyhow::Result<Process> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut command = Command::new(program(container)?);
    let args = container
        .command
        .iter()
        .flatten()
        .skip(1)
        .chain(container.args.iter().flatten());
    command
        .args(args.map(|a| ports.rewrite(a)))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, ports.rewrite(v))))
        .stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .kill_on_drop(true);
    die_with_parent_tokio(&mut command);
    let child = command.spawn()?;
    Ok(Process {
        child,
        started_at: chrono::Utc::now(),
    })
}

/// Runs one `httpGet` readiness probe: ready when the answer is 2xx or 3xx. A container with
/// no probe is ready once it runs; a probe kind other than httpGet counts as not ready.
pub async fn probe(probe: Option<&Probe>, ports: &PortMap) -> bool {
    let Some(probe) = probe else {
        return true;
    };
    let Some(get) = &probe.http_get else {
        return false;
    };
    let Some(port) = ports.host_port(&get.port) else {
        return false;
    };
    let path = get.path.as_deref().unwrap_or("/");
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let addr = format!("127.0.0.1:{port}");
    match tokio::time::timeout(timeout, http_status(&addr, path)).await {
        Ok(Some(code)) => (200..400).contains(&code),
        _ => false,
    }
}

async fn http_status(addr: &str, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).await.ok()?;
    let text = std::str::from_utf8(&head[..n]).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// SIGTERM, then SIGKILL if the process outlives `grace`; returns the exit code if any.
pub async fn terminate(mut child: Child, grace: Duration) -> Option<i32> {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => status.code(),
        _ => {
            let _ = child.kill().await;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_on_declared_ports_move_to_their_host_ports() {
        let ports = PortMap {
            by_number: BTreeMap::from([(9090, 40001)]),
            by_name: BTreeMap::from([("metrics".to_string(), 9090)]),
        };
        assert_eq!(ports.rewrite("0.0.0.0:9090"), "127.0.0.1:40001");
        assert_eq!(ports.rewrite(":9090"), "127.0.0.1:40001");
        assert_eq!(
            ports.rewrite("--metrics-addr=0.0.0.0:9090"),
            "--metrics-addr=127.0.0.1:40001"
        );
        assert_eq!(ports.rewrite("0.0.0.0:9091"), "0.0.0.0:9091");
        assert_eq!(ports.rewrite("run"), "run");
        assert_eq!(
            ports.host_port(&IntOrString::String("metrics".into())),
            Some(40001)
        );
        assert_eq!(ports.host_port(&IntOrString::Int(9090)), Some(40001));
        assert_eq!(ports.host_port(&IntOrString::Int(80)), None);
    }
}
