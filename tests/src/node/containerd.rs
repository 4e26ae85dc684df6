//! containerd, the node's container runtime (Debian's package), with its CRI plugin, which the
//! kubelet talks to. Everything it keeps is under the node's directory: its root, state and
//! socket here, its shims' sockets under /run/containerd, which is a tmpfs private to the node's
//! mount namespace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use super::command::output_of;
use super::sandbox::Sandbox;

/// containerd's configuration file, version 2 (containerd 1.6 and 1.7). Only what differs from
/// containerd's defaults is written.
#[derive(Debug, Serialize)]
pub struct ContainerdConfig {
    pub version: u32,
    pub root: PathBuf,
    pub state: PathBuf,
    pub grpc: Grpc,
    pub plugins: Plugins,
}

#[derive(Debug, Serialize)]
pub struct Grpc {
    pub address: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Plugins {
    #[serde(rename = "io.containerd.grpc.v1.cri")]
    pub cri: Cri,
}

#[derive(Debug, Serialize)]
pub struct Cri {
    /// Required here: root lacks CAP_SYS_RESOURCE, so runc cannot lower a container's
    /// oom_score_adj below its own unless told to keep it at least as high.
    pub restrict_oom_score_adj: bool,
    /// The pod sandbox image, imported beforehand (nothing can be pulled).
    pub sandbox_image: String,
    pub cni: Cni,
    pub containerd: CriContainerd,
    pub registry: CriRegistry,
}

/// Where the CRI plugin looks for a registry's settings: `<config_path>/<host:port>/hosts.toml`,
/// read at each pull, so a test can add a registry to a running node.
#[derive(Debug, Serialize)]
pub struct CriRegistry {
    pub config_path: PathBuf,
}

/// One registry's `hosts.toml`: pull from it over plain HTTP (containerd 1.6 would try HTTPS).
#[derive(Debug, Serialize)]
pub struct RegistryHosts {
    pub server: String,
    pub host: BTreeMap<String, RegistryHost>,
}

#[derive(Debug, Serialize)]
pub struct RegistryHost {
    pub capabilities: Vec<String>,
}

impl RegistryHosts {
    /// The registry at `address` (`host:port`) over plain HTTP, for pulls only.
    pub fn plain_http(address: &str) -> RegistryHosts {
        let server = format!("http://{address}");
        RegistryHosts {
            host: BTreeMap::from([(
                server.clone(),
                RegistryHost {
                    capabilities: vec!["pull".into(), "resolve".into()],
                },
            )]),
            server,
        }
    }

    /// Writes it where the CRI plugin of `config` looks for `address`.
    pub fn write(&self, config: &Path, address: &str) -> anyhow::Result<()> {
        let dir = config.join(address);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("hosts.toml"), toml::to_string(self)?)?;
        Ok(())
    }
}

#[derive(Debug, Serialize)]
pub struct Cni {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct CriContainerd {
    pub snapshotter: String,
    pub default_runtime_name: String,
    pub runtimes: BTreeMap<String, Runtime>,
}

#[derive(Debug, Serialize)]
pub struct Runtime {
    pub runtime_type: String,
}

/// The registries' settings of the containerd under `dir`.
pub fn registry_config_path(dir: &Path) -> PathBuf {
    dir.join("certs.d")
}

/// The CNI plugins of Debian's containernetworking-plugins package.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The namespace the CRI plugin keeps the kubelet's images in.
pub const CRI_NAMESPACE: &str = "k8s.io";

impl ContainerdConfig {
    /// containerd under `dir`, running pods with runc and the CNI configuration in `cni_conf`.
    pub fn new(dir: &Path, cni_conf: &Path, sandbox_image: &str) -> ContainerdConfig {
        ContainerdConfig {
            version: 2,
            root: dir.join("root"),
            state: dir.join("state"),
            grpc: Grpc {
                address: dir.join("containerd.sock"),
            },
            plugins: Plugins {
                cri: Cri {
                    restrict_oom_score_adj: true,
                    sandbox_image: sandbox_image.to_string(),
                    cni: Cni {
                        bin_dir: CNI_BIN_DIR.into(),
                        conf_dir: cni_conf.to_path_buf(),
                    },
                    containerd: CriContainerd {
                        snapshotter: "overlayfs".into(),
                        default_runtime_name: "runc".into(),
                        runtimes: BTreeMap::from([(
                            "runc".to_string(),
                            Runtime {
                                runtime_type: "io.containerd.runc.v2".into(),
                            },
                        )]),
                    },
                    registry: CriRegistry {
                        config_path: registry_config_path(dir),
                    },
                },
            },
        }
    }

    pub fn socket(&self) -> &Path {
        &self.grpc.address
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, toml::to_string(self)?)?;
        Ok(())
    }
}

/// Makes /run/containerd a tmpfs of the node's own (containerd puts its shims' sockets there
/// whatever its state directory is), then starts containerd with the configuration at `config`.
pub fn command(sandbox: &Sandbox, config: &Path) -> anyhow::Result<std::process::Command> {
    sandbox.run("mkdir", &["-p", "/run/containerd"])?;
    sandbox.run(
        "mount",
        &["-t", "tmpfs", "-o", "mode=0711", "tmpfs", "/run/containerd"],
    )?;
    let mut command = sandbox.command("containerd");
    command.arg("--config").arg(config);
    Ok(command)
}

/// Waits until containerd answers on its socket.
pub fn wait_ready(socket: &Path, timeout: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answered = ctr(socket)
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if answered {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!(
                "containerd did not answer on {} in {timeout:?}",
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Imports the OCI archive at `archive` into the kubelet's image namespace: its image tagged
/// `T` in the archive becomes `repository:T`.
pub fn import_image(socket: &Path, archive: &Path, repository: &str) -> anyhow::Result<()> {
    let mut command = ctr(socket);
    command
        .args(["--namespace", CRI_NAMESPACE, "images", "import"])
        .args(["--base-name", repository])
        .arg(archive);
    let what = format!("ctr images import {}", archive.display());
    output_of(&mut command, &what, "Debian's containerd package")?;
    Ok(())
}

fn ctr(socket: &Path) -> std::process::Command {
    let mut command = std::process::Command::new("ctr");
    command.arg("--address").arg(socket);
    command
}
