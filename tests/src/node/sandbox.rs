//! The node's own namespaces (pid, network, mount, uts, ipc), as a kind node has its container:
//! the node's programs see their own process table, network stack (bridge, iptables chains,
//! ports 10250 and 10249 free), mounts and host name, so two nodes on one machine (a test's and
//! `make cluster`'s) never meet, and nothing of a node outlives it.
//!
//! The namespaces' first process is the pause program. When it dies the kernel kills every
//! other process in its pid namespace (containerd, its shims, the containers, the kubelet,
//! kube-proxy), which empties the network namespace (its bridge, veth and iptables chains go
//! with it) and the mount namespace (containerd's overlay mounts, the kubelet's tmpfs volumes).
//! `unshare --kill-child` gives it SIGKILL when `unshare` dies, and `unshare` itself dies with
//! the test process (parent-death signal): a panic, a timeout or a `kill -9` of the test leaves
//! none of it behind.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::command::output_of;
use crate::control_plane::spawn::spawn_for_process_lifetime;

pub struct Sandbox {
    unshare: Child,
    /// The pid (as the host sees it) of the namespaces' first process.
    pub init_pid: u32,
}

impl Sandbox {
    /// Creates the namespaces with `pause` as their first process, its output in `log`.
    pub fn create(pause: &Path, host_name: &str, log: &Path) -> anyhow::Result<Sandbox> {
        let file = std::fs::File::create(log)?;
        let mut command = Command::new("unshare");
        command
            .args([
                "--fork",
                "--pid",
                "--mount-proc",
                "--net",
                "--mount",
                "--uts",
                "--ipc",
            ])
            .args(["--propagation", "private", "--kill-child=SIGKILL"])
            .arg(pause)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let unshare = spawn_for_process_lifetime(command).context("start unshare")?;
        let mut sandbox = Sandbox {
            init_pid: 0,
            unshare,
        };
        sandbox.init_pid = sandbox.wait_for_init()?;
        sandbox.run("hostname", &[host_name])?;
        Ok(sandbox)
    }

    /// `unshare --fork` starts the first process of the namespaces as its only child.
    fn wait_for_init(&mut self) -> anyhow::Result<u32> {
        let parent = self.unshare.id();
        let children = format!("/proc/{parent}/task/{parent}/children");
        let started = Instant::now();
        loop {
            if let Some(status) = self.unshare.try_wait()? {
                bail!("unshare exited with {status} before the node's namespaces were made");
            }
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
                return Ok(pid);
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("unshare started no process in 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `program` as it runs inside the node: in every one of its namespaces.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["--target", &self.init_pid.to_string()])
            .args(["--pid", "--net", "--mount", "--uts", "--ipc", "--"])
            .arg(program);
        command
    }

    /// Runs `program args…` inside the node to completion, failing with its stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let what = format!("{program} {} in the node", args.join(" "));
        output_of(
            self.command(program).args(args),
            &what,
            "util-linux's nsenter",
        )
    }

    /// Whether the namespaces' first process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.unshare.try_wait(), Ok(None))
    }
}

impl Sandbox {
    /// SIGKILL to `unshare`: its child, the first process, gets SIGKILL too, and with it every
    /// process of the node. Returns once the first process is gone.
    pub fn stop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        // The kernel tears the namespaces down once their last process is reaped.
        let started = Instant::now();
        while Path::new(&format!("/proc/{}", self.init_pid)).exists()
            && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.stop();
    }
}
