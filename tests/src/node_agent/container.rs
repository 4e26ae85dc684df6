//! One pod's container: a runc container of the project's image (or, where runc cannot run,
//! a local process of the binary the image path names), its declared ports mapped to free
//! loopback ports, its security context, and its readiness probe.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSecurityContext, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::process::{Child, Command};

use crate::control_plane::spawn::die_with_parent_tokio;
use crate::oci::{self, ContainerSpec, Image, Security};
use crate::process;

/// How the agent runs containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRuntime {
    /// runc containers of the project's image, under the pod's security context.
    Containers,
    /// Local processes of the binaries built next to the tests: the fallback where runc
    /// cannot run (not root, or the image tools missing).
    Processes,
}

impl PodRuntime {
    /// Containers when this machine can run them; `OUTBOX_TEST_POD_RUNTIME=processes` forces
    /// the fallback.
    pub fn detect() -> Self {
        let forced = std::env::var("OUTBOX_TEST_POD_RUNTIME").ok();
        let tools = ["runc", "umoci", "buildah"]
            .iter()
            .all(|tool| on_path(tool));
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        match forced.as_deref() {
            Some("processes") => PodRuntime::Processes,
            _ if tools && root => PodRuntime::Containers,
            _ => PodRuntime::Processes,
        }
    }
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path.split(':').chain(["/usr/sbin", "/sbin"]);
    dirs.into_iter()
        .any(|dir| std::path::Path::new(dir).join(tool).is_file())
}

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
    pub started_at: chrono::DateTime<chrono::Utc>,
    running: Running,
}

enum Running {
    Local(Child),
    Container(oci::Container),
}

impl Process {
    /// The exit code, if it has ended.
    pub fn try_exit(&mut self) -> std::io::Result<Option<i32>> {
        match &mut self.running {
            Running::Local(child) => Ok(child.try_wait()?.map(|s| s.code().unwrap_or(137))),
            Running::Container(container) => container.try_exit(),
        }
    }

    /// SIGKILL now, as the kernel's OOM killer or a node crash would.
    pub fn kill(&mut self) {
        match &mut self.running {
            Running::Local(child) => {
                let _ = child.start_kill();
            }
            Running::Container(container) => container.signal("KILL"),
        }
    }

    /// SIGTERM, then SIGKILL if it outlives `grace`; returns the exit code if any.
    pub async fn terminate(self, grace: Duration) -> Option<i32> {
        match self.running {
            Running::Local(child) => terminate(child, grace).await,
            Running::Container(mut container) => container.stop(grace).await,
        }
    }
}

/// What a container needs besides its spec: where its output goes, the pod's security
/// context, its volumes and the environment the node adds.
pub struct Launch<'a> {
    pub env: &'a [(String, String)],
    pub ports: &'a PortMap,
    pub log: &'a PathBuf,
    pub pod_security: Option<&'a PodSecurityContext>,
    /// Volumes bound into the container (containers only).
    pub mounts: Vec<oci::Mount>,
    /// The runc container's id (unique per start).
    pub id: String,
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

/// Starts the container with `runtime`.
pub fn start(
    runtime: PodRuntime,
    container: &Container,
    launch: &Launch<'_>,
) -> anyhow::Result<Process> {
    let running = match runtime {
        PodRuntime::Processes => Running::Local(start_process(container, launch)?),
        PodRuntime::Containers => Running::Container(start_container(container, launch)?),
    };
    Ok(Process {
        started_at: chrono::Utc::now(),
        running,
    })
}

/// The command line as the pod spec says, with listen addresses moved to the mapped ports.
fn command_line(container: &Container, ports: &PortMap) -> Vec<String> {
    let words = container.command.iter().flatten();
    let words = words.chain(container.args.iter().flatten());
    words.map(|word| ports.rewrite(word)).collect()
}

fn start_container(container: &Container, launch: &Launch<'_>) -> anyhow::Result<oci::Container> {
    let args = command_line(container, launch.ports);
    anyhow::ensure!(
        !args.is_empty(),
        "container {} names no command",
        container.name
    );
    let env = launch.env.iter();
    let spec = ContainerSpec {
        args,
        env: env
            .map(|(k, v)| (k.clone(), launch.ports.rewrite(v)))
            .collect(),
        mounts: launch.mounts.clone(),
        security: security(container, launch.pod_security)?,
    };
    oci::Container::start_logging_to(Image::shared(), &launch.id, &spec, launch.log)
}

fn start_process(container: &Container, launch: &Launch<'_>) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.log)?;
    let mut command = Command::new(program(container)?);
    command
        .args(command_line(container, launch.ports).iter().skip(1))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(launch.env.iter().map(|(k, v)| (k, launch.ports.rewrite(v))))
        .stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .kill_on_drop(true);
    die_with_parent_tokio(&mut command);
    Ok(command.spawn()?)
}

/// The capabilities a container runtime keeps by default (containerd's and CRI-O's list).
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// The container's security context over the pod's, as a kubelet resolves it: user and group
/// (the image's 65532 when unset), runAsNonRoot enforced, read-only root, no new privileges,
/// and the capabilities after drop and add.
pub fn security(
    container: &Container,
    pod: Option<&PodSecurityContext>,
) -> anyhow::Result<Security> {
    let own = container.security_context.clone().unwrap_or_default();
    let pod = pod.cloned().unwrap_or_default();
    let uid = own
        .run_as_user
        .or(pod.run_as_user)
        .unwrap_or(oci::NON_ROOT.into());
    let gid = own
        .run_as_group
        .or(pod.run_as_group)
        .unwrap_or(oci::NON_ROOT.into());
    if own.run_as_non_root.or(pod.run_as_non_root) == Some(true) && uid == 0 {
        anyhow::bail!("container has runAsNonRoot and image will run as root");
    }
    let caps = own.capabilities.unwrap_or_default();
    let dropped = caps.drop.unwrap_or_default();
    let mut kept: Vec<String> = if dropped.iter().any(|c| c == "ALL") {
        Vec::new()
    } else {
        let defaults = DEFAULT_CAPABILITIES.iter().map(|c| c.to_string());
        defaults.filter(|c| !dropped.contains(c)).collect()
    };
    kept.extend(caps.add.unwrap_or_default());
    Ok(Security {
        uid: u32::try_from(uid)?,
        gid: u32::try_from(gid)?,
        read_only_root: own.read_only_root_filesystem.unwrap_or(false),
        no_new_privileges: own.allow_privilege_escalation == Some(false),
        capabilities: kept.iter().map(|c| format!("CAP_{c}")).collect(),
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
async fn terminate(mut child: Child, grace: Duration) -> Option<i32> {
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
    fn the_security_context_is_resolved_as_a_kubelet_does() {
        let hardened: Container = serde_json::from_value(serde_json::json!({
            "name": "relay",
            "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}, "runAsUser": 1000},
        }))
        .unwrap();
        let pod: PodSecurityContext =
            serde_json::from_value(serde_json::json!({"runAsNonRoot": true, "runAsUser": 2000}))
                .unwrap();
        let got = security(&hardened, Some(&pod)).unwrap();
        assert_eq!((got.uid, got.gid), (1000, oci::NON_ROOT));
        assert!(got.read_only_root && got.no_new_privileges);
        assert!(got.capabilities.is_empty());

        let plain: Container = serde_json::from_value(serde_json::json!({"name": "x",
            "securityContext": {"capabilities": {"drop": ["NET_RAW"], "add": ["NET_ADMIN"]}}}))
        .unwrap();
        let got = security(&plain, None).unwrap();
        assert!(!got.read_only_root && !got.no_new_privileges);
        assert!(got.capabilities.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(got.capabilities.contains(&"CAP_CHOWN".to_string()));
        assert!(!got.capabilities.contains(&"CAP_NET_RAW".to_string()));

        let root: Container = serde_json::from_value(serde_json::json!({"name": "x",
            "securityContext": {"runAsUser": 0, "runAsNonRoot": true}}))
        .unwrap();
        let error = security(&root, None).unwrap_err().to_string();
        assert!(error.contains("runAsNonRoot"), "{error}");
    }

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
