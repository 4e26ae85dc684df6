//! A real OCI registry of one test's own (Debian's docker-registry, plain HTTP on loopback or
//! on the services address: [`server`]), `make dist` run into it, and the cosign binary
//! `scripts/cosign.sh` fetches once. The registry stops when the handle drops.

mod server;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use anyhow::{Context as _, bail};

use crate::services::{self, SERVICES_ADDRESS};
use crate::{process, repo_root};

pub struct Registry {
    dir: PathBuf,
    /// `HOST:PORT`.
    pub address: String,
}

impl Registry {
    /// Starts a registry storing under `dir` on a free loopback port.
    pub fn start(dir: &Path) -> anyhow::Result<Registry> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port();
        Registry::start_at(dir, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Starts a registry storing under `dir` on a free port of [`SERVICES_ADDRESS`], where the
    /// tests' node (its containerd) reaches it.
    pub fn start_for_node(dir: &Path) -> anyhow::Result<Registry> {
        Registry::start_at(
            dir,
            SocketAddr::new(IpAddr::V4(SERVICES_ADDRESS), services::free_port()?),
        )
    }

    fn start_at(dir: &Path, at: SocketAddr) -> anyhow::Result<Registry> {
        let registry = Registry {
            dir: dir.to_path_buf(),
            address: at.to_string(),
        };
        server::start(dir, at).map_err(|e| anyhow::anyhow!("the registry: {e}"))?;
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        server::stop(&self.dir);
    }
}

/// `make dist`'s own registry, when it is given none (`bin/outbox-registry.rs`): storing in the
/// cache, on 127.0.0.1:`REGISTRY_PORT`, and left running for the next `make dist`.
pub mod machine {
    use std::net::SocketAddr;
    use std::path::PathBuf;

    pub fn dir() -> PathBuf {
        crate::cache_dir().join("registry")
    }

    pub fn address() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], crate::ports::REGISTRY_PORT))
    }

    /// Starts it, or finds it up.
    pub fn start() -> Result<(), String> {
        super::server::start(&dir(), address())
    }

    /// Stops it, keeping what it stores.
    pub fn stop() {
        super::server::stop(&dir());
    }
}

/// The cosign v2 binary (built once, cached under `$HOME/.cache/outbox-relay`).
pub fn cosign_path() -> anyhow::Result<PathBuf> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        process::path_printed_by(
            &repo_root().join("scripts/cosign.sh"),
            &[],
            "cosign could not be built (it needs Go 1.24 or newer)",
        )
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// `cosign args…` with `COSIGN_PASSWORD` set; the output whatever the exit status.
pub fn cosign<I, S>(args: I, password: &str) -> anyhow::Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(cosign_path()?)
        .args(args)
        .env("COSIGN_PASSWORD", password)
        .stdin(Stdio::null())
        .output()
        .context("run cosign")
}

/// A key pair `cosign generate-key-pair` writes into `dir` as `PREFIX.key` and `PREFIX.pub`.
pub struct KeyPair {
    pub private: PathBuf,
    pub public: PathBuf,
    pub password: String,
}

impl KeyPair {
    pub fn generate(dir: &Path, prefix: &str) -> anyhow::Result<KeyPair> {
        let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
        let output = Command::new(cosign_path()?)
            .current_dir(dir)
            .args(["generate-key-pair", "--output-key-prefix", prefix])
            .env("COSIGN_PASSWORD", &password)
            .stdin(Stdio::null())
            .output()
            .context("run cosign generate-key-pair")?;
        if !output.status.success() {
            bail!(
                "cosign generate-key-pair failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(KeyPair {
            private: dir.join(format!("{prefix}.key")),
            public: dir.join(format!("{prefix}.pub")),
            password,
        })
    }
}

/// What `scripts/dist.sh` printed and the `dist.env` it wrote.
pub struct Dist {
    pub env: BTreeMap<String, String>,
    /// Its stdout and stderr, together.
    pub log: String,
}

impl Dist {
    pub fn get(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("dist.env has no {key}: {:?}", self.env))
    }
}

/// Runs `scripts/dist.sh` into `registry` with this build's binaries, writing under `out`;
/// with `key`, signed with it.
pub fn run_dist(registry: &Registry, out: &Path, key: Option<&KeyPair>) -> anyhow::Result<Dist> {
    let script = repo_root().join("scripts/dist.sh");
    let mut command = Command::new(&script);
    command
        .env("DIST_REGISTRY", &registry.address)
        // Both addresses it may listen on are this machine's own, never routed off it.
        .env("DIST_PLAIN_HTTP", "1")
        .env("DIST_OUT", out)
        .env("BIN_DIR", process::target_dir())
        .env("CONTAINER_ENGINE", "buildah")
        .env_remove("COSIGN_KEY")
        .env_remove("COSIGN_PASSWORD")
        .env_remove("COSIGN_PUBLIC_KEY")
        .stdin(Stdio::null());
    if let Some(key) = key {
        command
            .env("COSIGN_KEY", &key.private)
            .env("COSIGN_PASSWORD", &key.password);
    }
    let output = command
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!("{} failed:\n{log}", script.display());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let env_path = stdout.lines().last().context("dist.sh printed nothing")?;
    let env = std::fs::read_to_string(env_path)
        .with_context(|| format!("read {env_path}"))?
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Ok(Dist { env, log })
}
