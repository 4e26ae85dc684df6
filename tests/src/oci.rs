//! The project's container image, built from this build's binaries, and containers of it run by
//! runc: the image users get, under the security context a pod spec asks for (by default the
//! one the operator and the chart give: non-root 65532, read-only root filesystem, no
//! capabilities, no privilege escalation).
//!
//! Containers share the host's network namespace, so they reach the local PostgreSQL and
//! RabbitMQ on 127.0.0.1 as pods reach their Services; everything else is their own (mount,
//! pid, ipc, uts namespaces). The image is built once per build of the binaries: every test
//! binary (and `make cluster`) shares it, under a lock.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::process;

/// The uid and gid the image's passwd names and every pod spec here asks for.
pub const NON_ROOT: u32 = 65532;

/// Marks the containers of this project's tests, with the pid of the process that owns them.
const OWNER_ANNOTATION: &str = "io.outbox-relay.tests.owner-pid";

/// The image as an OCI layout, and its root filesystem unpacked once for every container.
pub struct Image {
    /// `DIR:TAG` of the OCI layout.
    pub layout: String,
    /// umoci's bundle: `rootfs/` and the `config.json` the image implies.
    pub bundle: PathBuf,
}

impl Image {
    /// The image of this build's binaries: built (or found built) once per process.
    pub fn shared() -> &'static Image {
        static IMAGE: OnceLock<Image> = OnceLock::new();
        IMAGE.get_or_init(|| Image::build(&process::target_dir().join("oci-image")))
    }

    /// Builds into `out` with scripts/image.sh and unpacks it with umoci, unless `out` holds
    /// the image of exactly these binaries already. Other processes wait on a lock meanwhile.
    pub fn build(out: &Path) -> Image {
        std::fs::create_dir_all(out).unwrap();
        let _lock = FileLock::take(&out.join("lock"));
        let bundle = out.join("bundle");
        let stamp_path = out.join("stamp");
        let stamp = inputs_stamp();
        let layout_path = out.join("layout");
        let built = std::fs::read_to_string(&stamp_path).ok() == Some(stamp.clone())
            && bundle.join("rootfs").is_dir();
        if !built {
            let layout = run_image_script(out);
            let _ = std::fs::remove_dir_all(&bundle);
            let status = std::process::Command::new("umoci")
                .args(["unpack", "--image", &layout])
                .arg(&bundle)
                .stdout(Stdio::null())
                .status()
                .expect("umoci is installed (make image-tools)");
            assert!(status.success(), "umoci unpack {layout} failed");
            std::fs::write(&layout_path, &layout).unwrap();
            std::fs::write(&stamp_path, &stamp).unwrap();
        }
        Image {
            layout: std::fs::read_to_string(&layout_path).unwrap(),
            bundle,
        }
    }

    pub fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    /// The runtime configuration umoci derived from the image (user, entrypoint, env).
    pub fn runtime_config(&self) -> Value {
        let text = std::fs::read_to_string(self.bundle.join("config.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The image's OCI config (labels, user, entrypoint), read from the layout.
    pub fn image_config(&self) -> Value {
        let dir = self.layout_dir();
        let read_json = |path: PathBuf| -> Value {
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
        };
        let blob = |digest: &Value| {
            let hex = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
            read_json(dir.join("blobs/sha256").join(hex))
        };
        let index = read_json(dir.join("index.json"));
        let manifest = blob(&index["manifests"][0]["digest"]);
        blob(&manifest["config"]["digest"])
    }

    /// Bytes of the OCI layout on disk: compressed layers, config, manifest, index.
    pub fn layout_bytes(&self) -> u64 {
        dir_bytes(&self.layout_dir())
    }

    fn layout_dir(&self) -> PathBuf {
        let (dir, _tag) = self.layout.rsplit_once(':').unwrap();
        PathBuf::from(dir)
    }

    /// The image's tag: the workspace's version.
    pub fn tag(&self) -> &str {
        self.layout.rsplit_once(':').unwrap().1
    }

    /// The OCI archive scripts/image.sh writes beside the layout (what `ctr images import`
    /// and `podman load` read).
    pub fn archive(&self) -> PathBuf {
        let out = self.layout_dir().parent().unwrap().to_path_buf();
        out.join(format!("outbox-relay-{}.oci.tar", self.tag()))
    }
}

/// scripts/image.sh's default reference, less the tag; the chart's `image.repository`.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/outbox-relay/outbox-relay";

/// What the image is built from: the two binaries (size and modification time) and the
/// files that shape the image.
fn inputs_stamp() -> String {
    let mut parts = Vec::new();
    for bin in ["outbox-relay", "outbox-operator"] {
        let meta = std::fs::metadata(process::binary(bin)).unwrap();
        let modified = meta.modified().unwrap();
        parts.push(format!("{bin} {} {modified:?}", meta.len()));
    }
    for file in ["Containerfile", "scripts/image.sh", "image/etc/passwd"] {
        let text = std::fs::read_to_string(crate::repo_root().join(file)).unwrap();
        parts.push(format!("{file} {}", text.len()));
        parts.push(text);
    }
    parts.join("\n")
}

fn run_image_script(out: &Path) -> String {
    let script = crate::repo_root().join("scripts/image.sh");
    let output = std::process::Command::new(&script)
        .env("BIN_DIR", process::target_dir())
        .env("IMAGE_OUT", out)
        .env("CONTAINER_ENGINE", "buildah")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed (are buildah, umoci and runc installed? make image-tools)",
        script.display()
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .last()
        .expect("image.sh prints the layout")
        .to_string()
}

/// An exclusive flock(2) on a file, released when dropped.
pub struct FileLock {
    _held: File,
}

impl FileLock {
    pub fn take(path: &Path) -> FileLock {
        let file = File::create(path).unwrap();
        // SAFETY: flock on a descriptor this struct owns for its whole life.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "flock {}", path.display());
        FileLock { _held: file }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let entries = std::fs::read_dir(dir).unwrap();
    entries
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                dir_bytes(&entry.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

/// A running container's process as the kernel sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    /// Hexadecimal, as /proc shows it; all zeros is no capability.
    pub effective_capabilities: String,
    pub no_new_privileges: bool,
    pub read_only_root: bool,
}

/// The security context a container runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct Security {
    pub uid: u32,
    pub gid: u32,
    pub read_only_root: bool,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privileges: bool,
    /// Capabilities kept (none when the pod drops ALL and adds nothing).
    pub capabilities: Vec<String>,
}

impl Default for Security {
    /// What the operator gives relay pods and the chart gives the operator.
    fn default() -> Self {
        Self {
            uid: NON_ROOT,
            gid: NON_ROOT,
            read_only_root: true,
            no_new_privileges: true,
            capabilities: Vec::new(),
        }
    }
}

/// A folder bound into a container.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
}

/// What to run in a container.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// The full command line (the pod's `command` then `args`).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub security: Security,
}

/// One runc container; deleted (killed first if needed) when dropped.
pub struct Container {
    pub id: String,
    pub child: Child,
    pub log: PathBuf,
    dir: PathBuf,
}

impl Container {
    /// Starts `spec` from `image` as container `name` (made unique), its output in its own log.
    pub fn start(image: &Image, name: &str, spec: &ContainerSpec) -> Container {
        let id = crate::unique(name);
        let log = process::log_path(&id);
        Self::start_logging_to(image, &id, spec, &log).expect("start the container")
    }

    /// Starts `spec` as container `id`, appending its output to `log`.
    pub fn start_logging_to(
        image: &Image,
        id: &str,
        spec: &ContainerSpec,
        log: &Path,
    ) -> anyhow::Result<Container> {
        sweep_orphans();
        let dir = process::target_dir().join("oci-containers").join(id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let rootfs = if spec.security.read_only_root {
            image.rootfs()
        } else {
            // A writable root is the container's own copy, so writes never reach the image.
            let copy = dir.join("rootfs");
            let status = std::process::Command::new("cp")
                .arg("-a")
                .arg(image.rootfs())
                .arg(&copy)
                .status()?;
            anyhow::ensure!(status.success(), "copy the root filesystem");
            copy
        };
        let config = runtime_config(image, &rootfs, spec);
        std::fs::write(dir.join("config.json"), config.to_string())?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut command = Command::new("runc");
        command
            .args(["run", "--bundle"])
            .arg(&dir)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        crate::control_plane::spawn::die_with_parent_tokio(&mut command);
        let child = command.spawn()?;
        Ok(Container {
            id: id.to_string(),
            child,
            log: log.to_path_buf(),
            dir,
        })
    }

    /// Runs `spec` to completion; returns the exit code and everything it printed.
    pub async fn run(image: &Image, name: &str, spec: &ContainerSpec) -> (i32, String) {
        let mut container = Container::start(image, name, spec);
        let status = tokio::time::timeout(Duration::from_secs(60), container.child.wait())
            .await
            .expect("the container ends within a minute")
            .unwrap();
        (status.code().unwrap_or(-1), container.output())
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (e.g. "TERM") to the container's process, as a kubelet stopping a pod.
    pub fn signal(&self, signal: &str) {
        let _ = std::process::Command::new("runc")
            .args(["kill", &self.id, signal])
            .stderr(Stdio::null())
            .status();
    }

    /// What the kernel says the container's process runs as, while it runs.
    pub fn confinement(&self) -> Option<Confinement> {
        confinement_of(&self.id)
    }

    /// The exit code if the container has ended.
    pub fn try_exit(&mut self) -> std::io::Result<Option<i32>> {
        Ok(self.child.try_wait()?.map(|s| s.code().unwrap_or(137)))
    }

    /// SIGTERM, then the exit code within `grace`; SIGKILL (and None) if it outlives it.
    pub async fn stop(&mut self, grace: Duration) -> Option<i32> {
        self.signal("TERM");
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                self.signal("KILL");
                let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
                None
            }
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        delete(&self.id);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The host pid of container `id`'s process, while it runs.
pub fn pid_of(id: &str) -> Option<i32> {
    let output = std::process::Command::new("runc")
        .args(["state", id])
        .output()
        .ok()?;
    let state: Value = serde_json::from_slice(&output.stdout).ok()?;
    let running = state["status"] == "running";
    running
        .then(|| state["pid"].as_i64())
        .flatten()
        .map(|pid| pid as i32)
}

/// What the kernel says container `id`'s process runs as: the `Uid`, `Gid`, `CapEff` and
/// `NoNewPrivs` lines of its /proc status, and whether its root is mounted read-only.
pub fn confinement_of(id: &str) -> Option<Confinement> {
    let pid = pid_of(id)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))?;
        Some(line.split_whitespace().nth(1)?.to_string())
    };
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).ok()?;
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"))?;
    let options = root.split_whitespace().nth(3)?;
    Some(Confinement {
        uid: field("Uid")?.parse().ok()?,
        gid: field("Gid")?.parse().ok()?,
        effective_capabilities: field("CapEff")?,
        no_new_privileges: field("NoNewPrivs")? == "1",
        read_only_root: options.split(',').any(|o| o == "ro"),
    })
}

fn delete(id: &str) {
    let _ = std::process::Command::new("runc")
        .args(["delete", "--force", id])
        .stderr(Stdio::null())
        .status();
}

/// Once per process, before its first container: deletes the containers a dead test process
/// left behind, and starts this process's reaper.
///
/// A container outlives runc: its process is the init of its own pid namespace, and nothing
/// kills it when the runc that started it dies. Every other child of a test (or of `make
/// cluster`) dies with it through PR_SET_PDEATHSIG; for containers the reaper does that job.
/// It is a shell that reads a pipe this process holds open and never writes: when this process
/// ends, even by SIGKILL, the pipe reaches end-of-file and the reaper deletes every container
/// annotated with this process's pid, then exits.
fn sweep_orphans() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        start_reaper();
        let Ok(output) = std::process::Command::new("runc")
            .args(["list", "--quiet"])
            .output()
        else {
            return;
        };
        for id in String::from_utf8_lossy(&output.stdout).lines() {
            let Ok(state) = std::process::Command::new("runc")
                .args(["state", id])
                .output()
            else {
                continue;
            };
            let Ok(state) = serde_json::from_slice::<Value>(&state.stdout) else {
                continue;
            };
            let owner = state["annotations"][OWNER_ANNOTATION].as_str();
            let Some(pid) = owner.and_then(|p| p.parse::<i32>().ok()) else {
                continue; // not one of ours
            };
            // SAFETY: signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            if !alive {
                delete(id);
            }
        }
    });
}

// A container can still be dying (runc's own death signal reaches it too) when the reaper
// first looks, and deleting it then fails: it tries again until none of ours is left.
const REAPER: &str = r#"
cat >/dev/null
ours() {
    for id in $(runc list --quiet 2>/dev/null); do
        runc state "$id" 2>/dev/null | grep -q "\"$ANNOTATION\": *\"$OWNER\"" && echo "$id"
    done
}
for round in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    left=$(ours)
    [ -z "$left" ] && break
    for id in $left; do runc delete --force "$id" >/dev/null 2>&1; done
    sleep 0.25
done
"#;

fn start_reaper() {
    static REAPER_PIPE: OnceLock<std::process::ChildStdin> = OnceLock::new();
    let child = std::process::Command::new("sh")
        .args(["-c", REAPER])
        .env("ANNOTATION", OWNER_ANNOTATION)
        .env("OWNER", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match child {
        // Never written, never closed: only this process's end closes it.
        Ok(mut child) => {
            if let Some(pipe) = child.stdin.take() {
                let _ = REAPER_PIPE.set(pipe);
            }
        }
        Err(error) => eprintln!("oci: no reaper for this process's containers: {error}"),
    }
}

/// umoci's configuration with `spec`'s command, environment, mounts and security context,
/// the root filesystem at `rootfs`, and the host's network.
pub fn runtime_config(image: &Image, rootfs: &Path, spec: &ContainerSpec) -> Value {
    let mut config = image.runtime_config();
    let security = &spec.security;
    config["root"] = json!({"path": rootfs, "readonly": security.read_only_root});
    config["annotations"] = json!({ OWNER_ANNOTATION: std::process::id().to_string() });
    let process = &mut config["process"];
    process["terminal"] = json!(false);
    process["args"] = json!(spec.args);
    process["cwd"] = json!("/");
    process["user"] = json!({"uid": security.uid, "gid": security.gid});
    process["noNewPrivileges"] = json!(security.no_new_privileges);
    let kept = &security.capabilities;
    process["capabilities"] = json!({
        "bounding": kept, "effective": kept, "permitted": kept, "inheritable": [], "ambient": [],
    });
    let mut env = vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_string()];
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    process["env"] = json!(env);
    if let Some(namespaces) = config["linux"]["namespaces"].as_array_mut() {
        namespaces.retain(|ns| ns["type"] != "network");
    }
    if let Some(mounts) = config["mounts"].as_array_mut() {
        for mount in &spec.mounts {
            let access = if mount.read_only { "ro" } else { "rw" };
            mounts.push(json!({
                "destination": mount.destination, "type": "bind", "source": mount.source,
                "options": ["rbind", access, "nosuid", "nodev", "noexec"],
            }));
        }
    }
    config
}
