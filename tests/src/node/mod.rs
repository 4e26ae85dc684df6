//! A real Kubernetes node for the tests' control plane: containerd running pods with runc, the
//! CNI bridge, the kubelet and kube-proxy, the programs a cluster's machines run (Debian's
//! containerd, runc and CNI plugins; the kubelet and kube-proxy built from the Kubernetes
//! release of the control plane by tests/control-plane/build.sh), and kube-scheduler placing
//! pods on it.
//!
//! The node has namespaces of its own ([`sandbox`]), its own cgroup root ([`cgroups`]) and its
//! own place on the host's network ([`network`]); its files are under the control plane's
//! directory. It stops when dropped or when the test process dies, and leaves nothing behind:
//! no process, mount, network namespace, bridge, iptables chain or cgroup.
//!
//! What the kubelet changes on the machine itself (these are not namespaced): the sysctls
//! `vm.overcommit_memory=1`, `kernel.panic=10` and `kernel.panic_on_oops=1`, as on any node.

mod cgroups;
mod cni;
mod command;
mod containerd;
mod images;
mod kube_proxy;
mod kubelet;
mod network;
mod preflight;
mod sandbox;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::control_plane::spawn::spawn_for_process_lifetime;
use crate::control_plane::{ControlPlane, Usage};
use crate::daemon::log_tail;
use crate::process;
use cgroups::CgroupRoot;
use cni::NetworkList;
use containerd::ContainerdConfig;
use kube_proxy::KubeProxyConfiguration;
use kubelet::{KubeletConfiguration, KubeletFiles};
use sandbox::Sandbox;

pub use cgroups::{remove_stale as remove_stale_cgroups, roots_of as cgroup_roots_of};
pub use network::NodeLink;

/// The one node's name (each control plane has its own node).
pub const NODE_NAME: &str = "outbox-node";

/// How long a node may take to register Ready on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

struct Component {
    name: &'static str,
    /// `nsenter`, whose child is the component inside the node.
    child: Child,
    log: PathBuf,
}

pub struct Node {
    pub name: String,
    pub link: NodeLink,
    dir: PathBuf,
    /// containerd's socket, inside the node's mount namespace.
    containerd_socket: PathBuf,
    components: Vec<Component>,
    // Dropped in this order: the namespaces (every process of the node) before the cgroups
    // those processes were in.
    sandbox: Sandbox,
    cgroups: CgroupRoot,
}

impl Node {
    /// The node of [`ControlPlane::shared`], started on first use. It lives as long as the
    /// test process: its namespaces die with it (a node left in a static is never dropped,
    /// and the next node's start sweeps the cgroups it leaves).
    pub fn shared() -> &'static Node {
        static SHARED: OnceLock<Node> = OnceLock::new();
        SHARED.get_or_init(|| {
            Node::start(ControlPlane::shared()).unwrap_or_else(|error| panic!("{error:#}"))
        })
    }

    /// Starts a node on `plane` (and the plane's scheduler) and waits until it is Ready.
    pub fn start(plane: &ControlPlane) -> anyhow::Result<Node> {
        preflight::check()?;
        let pause = images::pause_image()?;
        let project = images::project_image();
        let dir = plane.dir().join("node");
        std::fs::create_dir_all(&dir)?;
        let sandbox = Sandbox::create(
            &process::binary("outbox-pause"),
            NODE_NAME,
            &dir.join("init.log"),
        )?;
        let link = NodeLink::attach(&sandbox)?;
        let cgroups = CgroupRoot::create()?;
        let mut node = Node {
            name: NODE_NAME.to_string(),
            link,
            dir,
            containerd_socket: PathBuf::new(),
            components: Vec::new(),
            sandbox,
            cgroups,
        };
        let socket = node.start_containerd()?;
        node.containerd_socket = socket.clone();
        for image in [pause, project] {
            containerd::import_image(&socket, &image.archive, &image.repository)?;
        }
        node.start_kubelet(plane, &socket)?;
        node.start_kube_proxy(plane)?;
        plane.start_scheduler()?;
        node.wait_ready(plane)?;
        node.refuse_unknown_fields()?;
        Ok(node)
    }

    /// The kubelet and kube-proxy read a configuration file with a field they do not know
    /// (a misspelt name) leniently, logging it and ignoring the field; here that is an error.
    fn refuse_unknown_fields(&self) -> anyhow::Result<()> {
        for component in &self.components {
            let log = std::fs::read_to_string(&component.log).unwrap_or_default();
            if let Some(line) = log.lines().find(|l| l.contains("strict decoding error")) {
                bail!(
                    "{} ignored part of its configuration: {line}",
                    component.name
                );
            }
        }
        Ok(())
    }

    fn start_containerd(&mut self) -> anyhow::Result<PathBuf> {
        let cni_dir = self.dir.join("cni");
        let cni_conf = cni_dir.join("net.d");
        NetworkList::bridge(&self.link.pod_subnet(), &cni_dir).write(&cni_conf)?;
        let config = ContainerdConfig::new(
            &self.dir.join("containerd"),
            &cni_conf,
            &images::pause_image_name(),
        );
        let config_path = self.dir.join("containerd.toml");
        config.write(&config_path)?;
        let command = containerd::command(&self.sandbox, &config_path)?;
        self.launch("containerd", command)?;
        let socket = config.socket().to_path_buf();
        containerd::wait_ready(&socket, Duration::from_secs(30))
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs(30)))?;
        Ok(socket)
    }

    fn start_kubelet(&mut self, plane: &ControlPlane, socket: &Path) -> anyhow::Result<()> {
        let address = self.link.node_address();
        let (serving_cert, serving_key) = plane.issue_certificate(
            "kubelet-serving",
            Usage::Server {
                ips: &[address.into()],
                names: std::slice::from_ref(&self.name),
            },
        )?;
        // The Node authorizer and NodeRestriction know a kubelet by this name and group.
        let kubeconfig = plane.certificate_kubeconfig(
            "kubelet",
            &format!("system:node:{}", self.name),
            Some("system:nodes"),
        )?;
        let config_path = self.dir.join("kubelet.json");
        KubeletConfiguration::new(&KubeletFiles {
            dir: &self.dir,
            ca: &plane.certs.ca_cert,
            serving_cert: &serving_cert,
            serving_key: &serving_key,
            containerd_socket: socket,
            cgroup_root: &self.cgroups.name,
        })
        .write(&config_path)?;
        let mut command = self.sandbox.command(plane.bin_dir().join("kubelet"));
        command
            .arg(format!("--config={}", config_path.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", self.dir.join("kubelet").display()))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={address}"))
            .arg("--v=1");
        self.launch("kubelet", command)
    }

    fn start_kube_proxy(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        // The user the default RBAC binds to system:node-proxier.
        let kubeconfig = plane.certificate_kubeconfig("kube-proxy", "system:kube-proxy", None)?;
        let config_path = self.dir.join("kube-proxy.json");
        KubeProxyConfiguration::new(&kubeconfig, &self.name, &self.link.pod_subnet())
            .write(&config_path)?;
        let mut command = self.sandbox.command(plane.bin_dir().join("kube-proxy"));
        command.arg(format!("--config={}", config_path.display()));
        self.launch("kube-proxy", command)
    }

    fn launch(&mut self, name: &'static str, mut command: Command) -> anyhow::Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = spawn_for_process_lifetime(command)
            .with_context(|| format!("start {name} in the node"))?;
        self.components.push(Component { name, child, log });
        Ok(())
    }

    /// Waits for the node's Ready condition, failing early when a component exits.
    fn wait_ready(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        let started = Instant::now();
        let jsonpath = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
        loop {
            self.fail_if_exited()?;
            let ready = plane.kubectl_output(&["get", "node", &self.name, "-o", jsonpath]);
            if matches!(&ready, Ok((true, stdout, _)) if stdout.trim() == "True") {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "node {} not Ready after {READY_TIMEOUT:?}: {ready:?}\n{}",
                    self.name,
                    self.logs(40)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Fails, with the component's log, when one of the node's programs has exited.
    pub fn fail_if_exited(&mut self) -> anyhow::Result<()> {
        if !self.sandbox.alive() {
            bail!("the node's namespaces are gone\n{}", self.logs(40));
        }
        for component in &mut self.components {
            if let Some(status) = component.child.try_wait()? {
                let tail = log_tail(&component.log, 40);
                bail!("{} exited with {status}:\n{tail}", component.name);
            }
        }
        Ok(())
    }

    /// The last `lines` lines of each component's log.
    pub fn logs(&self, lines: usize) -> String {
        let mut text = String::new();
        for component in &self.components {
            text.push_str(&format!(
                "--- last {lines} lines of {} ---\n",
                component.name
            ));
            text.push_str(&log_tail(&component.log, lines));
            text.push('\n');
        }
        text
    }

    /// The node's directory (its configuration files and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubelet's cgroup root, `/outbox-node-…` in every hierarchy.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroups.name
    }

    /// What to look for once the node has stopped, to show it left nothing behind.
    pub fn leftovers_probe(&self) -> Leftovers {
        Leftovers {
            interface: self.link.host_interface.clone(),
            init_pid: self.sandbox.init_pid,
            cgroups: self.cgroups.dirs().to_vec(),
            dir: self.dir.clone(),
        }
    }

    /// Sends `signal` (`SIGSTOP`, `SIGKILL`, …) to the first process of the container whose
    /// CRI id (a pod's `containerStatuses[].containerID`, with or without `containerd://`)
    /// is `container_id`, as the runtime does: SIGSTOP freezes a relay the way a hung process
    /// looks to the kubelet (alive, but its probes time out).
    pub fn signal_container(&self, container_id: &str, signal: &str) -> anyhow::Result<()> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let socket = self.containerd_socket.to_string_lossy();
        let args = [
            "--address",
            &socket,
            "--namespace",
            containerd::CRI_NAMESPACE,
            "tasks",
            "kill",
            "--signal",
            signal,
            id,
        ];
        self.run("ctr", &args)
            .map(drop)
            .with_context(|| format!("send {signal} to container {id}"))
    }

    /// Lets the node's containerd pull from the registry at `address` (`host:port`) over plain
    /// HTTP, as a cluster's nodes are configured for a private mirror.
    pub fn trust_plain_http_registry(&self, address: &str) -> anyhow::Result<()> {
        let config = containerd::registry_config_path(&self.dir.join("containerd"));
        containerd::RegistryHosts::plain_http(address).write(&config, address)
    }

    /// `program args…` run inside the node (its network, mounts and processes), to completion.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        self.sandbox.run(program, args)
    }
}

impl Drop for Node {
    /// Every process of the node goes with its namespaces; the components' `nsenter`s then
    /// exit and are reaped here. The cgroups go after, with the field.
    fn drop(&mut self) {
        self.sandbox.stop();
        for component in &mut self.components {
            let _ = component.child.kill();
            let _ = component.child.wait();
        }
    }
}

/// The traces a node could leave on the machine.
pub struct Leftovers {
    interface: String,
    init_pid: u32,
    cgroups: Vec<PathBuf>,
    dir: PathBuf,
}

impl Leftovers {
    /// What is still there: the host's veth, the namespaces' first process, cgroup
    /// directories, processes or mounts that name the node's directory.
    pub fn remaining(&self) -> Vec<String> {
        let mut left = Vec::new();
        if Path::new("/sys/class/net").join(&self.interface).exists() {
            left.push(format!("interface {}", self.interface));
        }
        if Path::new(&format!("/proc/{}", self.init_pid)).exists() {
            left.push(format!("the node's first process, pid {}", self.init_pid));
        }
        for dir in self.cgroups.iter().filter(|dir| dir.exists()) {
            left.push(format!("cgroup {}", dir.display()));
        }
        let dir = self.dir.to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&dir) {
                left.push(format!(
                    "process {}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mount in mounts.lines().filter(|line| line.contains(&dir)) {
            left.push(format!("mount {mount}"));
        }
        left
    }
}
