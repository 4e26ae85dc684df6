//! One node of a cluster: its name, port and folder, the environment it and its CLI run in, and
//! starting, stopping and killing it (what scripts/services/rabbit-cluster.sh's `rc_env`,
//! `rc_ctl`, `rc_start_node`, `rc_stop_node` and `rc_kill_node` did).
//!
//! A 3.10 node runs `/usr/lib/rabbitmq/bin/rabbitmq-server` itself (the `/usr/sbin` wrapper
//! switches user and writes under /var/log), a 4.0 node the same program inside the Debian 13
//! root ([`super::debian13`]); each with a config file of its own, since the system's
//! rabbitmq.conf pins RABBITMQ_PORT, and in 3.10 `listeners.tcp` wins over RABBITMQ_NODE_PORT.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{Cluster, debian13};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Node {
    pub cluster: Cluster,
    /// 1 to 3.
    pub n: usize,
}

impl Node {
    pub fn new(cluster: Cluster, n: usize) -> Self {
        assert!((1..=3).contains(&n), "a cluster has nodes 1 to 3, not {n}");
        Self { cluster, n }
    }

    pub fn all(cluster: Cluster) -> [Node; 3] {
        [1, 2, 3].map(|n| Node::new(cluster, n))
    }

    /// `rt1`, `r4t1`: the node's name before the host, and its folder's.
    fn short_name(self) -> String {
        format!("{}{}", self.cluster.node_prefix(), self.n)
    }

    /// `rt1@HOST`, as Erlang and the CLI name it.
    pub fn name(self) -> String {
        format!("{}@{}", self.short_name(), short_hostname())
    }

    /// Its AMQP port.
    pub fn port(self) -> u16 {
        self.cluster.ports()[self.n - 1]
    }

    /// Its folder on the host: config, data, logs, pid file.
    pub fn dir(self) -> PathBuf {
        self.cluster.dir().join(self.short_name())
    }

    /// [`Self::dir`] as the node sees it (inside the root for 4.0).
    fn seen_dir(self) -> String {
        format!("{}/{}", self.cluster.seen_dir(), self.short_name())
    }

    /// The node's config file. The 4.0 nodes deny RabbitMQ 4's deprecated AMQP 1.0 address
    /// format v1 (`/amq/queue/NAME`, `/exchange/NAME/KEY`, …), so that the relay's refusal of
    /// it is tried against a real broker (issue 56); their other tests speak AMQP 0-9-1, which
    /// it does not touch. The single RabbitMQ 4 of scripts/services/rabbitmq4.sh keeps 4.0's
    /// default (v1 permitted), which the broker matrix asserts. 3.10 knows no such setting.
    pub fn config(self) -> String {
        let port = self.port();
        let services = crate::services::SERVICES_ADDRESS;
        // On the services address too, where the tests' pods reach the nodes.
        let mut lines = vec![
            format!("listeners.tcp.default = 127.0.0.1:{port}"),
            format!("listeners.tcp.pods = {services}:{port}"),
            "loopback_users = none".into(),
            "log.console = false".into(),
            "log.file.level = warning".into(),
        ];
        if self.cluster == Cluster::V4_0 {
            lines.push("deprecated_features.permit.amqp_address_v1 = false".into());
        }
        lines.into_iter().map(|line| line + "\n").collect()
    }

    /// The environment the node and its CLI run in: one HOME for the cluster's nodes and CLI,
    /// so that they share its `.erlang.cookie`, and everything else the node's own.
    pub fn env(self) -> Vec<(&'static str, String)> {
        let dir = self.seen_dir();
        let port = self.port();
        let mut env = vec![
            ("HOME", format!("{}/home", self.cluster.seen_dir())),
            ("RABBITMQ_CONF_ENV_FILE", "/dev/null".into()),
            ("RABBITMQ_NODENAME", self.name()),
            ("RABBITMQ_NODE_PORT", port.to_string()),
            (
                "RABBITMQ_DIST_PORT",
                (crate::ports::RABBIT_CLUSTER_DIST_PORT_OFFSET + port).to_string(),
            ),
            ("RABBITMQ_CONFIG_FILE", format!("{dir}/rabbitmq.conf")),
            ("RABBITMQ_MNESIA_BASE", format!("{dir}/mnesia")),
            ("RABBITMQ_LOG_BASE", format!("{dir}/log")),
            ("RABBITMQ_PID_FILE", format!("{dir}/pid")),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                format!("{dir}/enabled_plugins"),
            ),
            (
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                self.cluster.erl_args().into(),
            ),
        ];
        if let Some(epmd) = self.cluster.epmd_port() {
            env.push(("ERL_EPMD_PORT", epmd.to_string()));
            env.push(("ERL_CRASH_DUMP", format!("{dir}/log/erl_crash.dump")));
        }
        env
    }

    /// `TOOL ARGS` (a program of `/usr/lib/rabbitmq/bin`) in the node's environment. It runs in
    /// the cluster's HOME, so a crash dump of the CLI lands there, not in the repository.
    fn command<S: AsRef<str>>(self, tool: &str, args: &[S]) -> Command {
        let mut command = Command::new(format!("/usr/lib/rabbitmq/bin/{tool}"));
        command
            .args(args.iter().map(|arg| -> &str { arg.as_ref() }))
            .stdin(Stdio::null());
        match self.cluster {
            Cluster::V3_10 => {
                command
                    .envs(self.env())
                    .current_dir(self.cluster.dir().join("home"));
            }
            Cluster::V4_0 => {
                // Nothing of the caller's environment goes into the root.
                command
                    .env_clear()
                    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                    .env("LANG", "C.UTF-8")
                    .envs(self.env());
                debian13::enter(&mut command, debian13::root(), &self.cluster.dir());
            }
        }
        command
    }

    /// `rabbitmqctl -q -n NODE ARGS`, not run yet (a drop handler runs it synchronously).
    pub fn ctl_command<S: AsRef<str>>(self, args: &[S]) -> Command {
        let name = self.name();
        let mut all = vec!["-q", "-n", name.as_str()];
        all.extend(args.iter().map(|arg| -> &str { arg.as_ref() }));
        self.command("rabbitmqctl", &all)
    }

    /// [`Self::ctl_command`] run; its output, whether it succeeded or not.
    pub async fn ctl_output(self, args: &[&str]) -> std::process::Output {
        tokio::process::Command::from(self.ctl_command(args))
            .output()
            .await
            .unwrap_or_else(|e| panic!("run rabbitmqctl: {e}"))
    }

    /// [`Self::ctl_command`] run: its stdout; panics with its stderr when it fails.
    pub async fn ctl(self, args: &[&str]) -> String {
        let output = self.ctl_output(args).await;
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?} on {}: {}",
            self.name(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Something accepts connections on its AMQP port.
    pub fn up(self) -> bool {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port()));
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok()
    }

    fn pid_file(self) -> PathBuf {
        self.dir().join("pid")
    }

    fn pid(self) -> Option<libc::pid_t> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Starts the node unless it listens already; returns once it runs and listens, and panics
    /// with the end of its console log when it does not.
    pub async fn start(self) {
        if self.up() {
            return;
        }
        let dir = self.dir();
        for sub in ["log", "mnesia"] {
            std::fs::create_dir_all(dir.join(sub))
                .unwrap_or_else(|e| panic!("create {}/{sub}: {e}", dir.display()));
        }
        let console_path = dir.join("log/console.log");
        let console = std::fs::File::create(&console_path)
            .unwrap_or_else(|e| panic!("create {}: {e}", console_path.display()));
        let mut command = self.command::<&str>("rabbitmq-server", &[]);
        command
            .stdout(console.try_clone().expect("the console log"))
            .stderr(console);
        // SAFETY: setsid(2) only, between fork and exec. A session of its own: the node outlives
        // this test process and no signal for the test's terminal reaches it.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.name()));
        // Reaped when it exits, so that a stopped node is gone, not a zombie that `kill -0`
        // would take for running.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let pid_file = format!("{}/pid", self.seen_dir());
        let waited = self
            .ctl_output(&["wait", &pid_file, "--timeout", "120"])
            .await;
        if !waited.status.success() {
            panic!(
                "RabbitMQ node {} did not start on 127.0.0.1:{} (logs: {}/log): {}\n{}",
                self.name(),
                self.port(),
                dir.display(),
                String::from_utf8_lossy(&waited.stderr).trim(),
                tail(&console_path, 20)
            );
        }
        let node = self;
        let listening = crate::wait::holds(
            "the node listens",
            Duration::from_secs(30),
            move || async move { node.up() },
        )
        .await;
        assert!(
            listening,
            "RabbitMQ node {} runs but does not listen on 127.0.0.1:{}",
            self.name(),
            self.port()
        );
    }

    /// Stops the node gracefully; returns once its VM is gone: `rabbitmqctl stop` answers while
    /// the VM still shuts down, and its quorum queue members keep voting until then.
    pub async fn stop(self) {
        if !self.up() && !self.pid_file().exists() {
            return;
        }
        let pid = self.pid();
        let _ = self.ctl_output(&["stop"]).await;
        if let Some(pid) = pid {
            gone(pid, Duration::from_secs(60)).await;
        }
        let _ = std::fs::remove_file(self.pid_file());
    }

    /// SIGKILLs the node (when the pid file names a VM of this node: after a reboot it may name
    /// a stranger) and returns once it is gone.
    pub async fn kill(self) {
        let Some(pid) = self.pid() else {
            return;
        };
        if self.is_running_as(pid) {
            // SAFETY: kill(2) with a pid and a signal number.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        gone(pid, Duration::from_secs(6)).await;
        let _ = std::fs::remove_file(self.pid_file());
    }

    /// Process `pid` was started as this node: its environment names it.
    fn is_running_as(self, pid: libc::pid_t) -> bool {
        let wanted = format!("RABBITMQ_NODENAME={}", self.name());
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|environ| {
                environ
                    .split(|&byte| byte == 0)
                    .any(|entry| entry == wanted.as_bytes())
            })
            .unwrap_or(false)
    }

    /// Writes the node's folder for a new cluster: config, no plugins.
    pub fn write_files(self) {
        let dir = self.dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        write(dir.join("rabbitmq.conf"), &self.config());
        write(dir.join("enabled_plugins"), "[].\n");
    }
}

fn write(path: PathBuf, text: &str) {
    std::fs::File::create(&path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Waits until process `pid` no longer exists, `limit` at most.
async fn gone(pid: libc::pid_t, limit: Duration) {
    let started = Instant::now();
    // SAFETY: kill(2) with signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last `lines` lines of the file at `path` (for a failure's message).
fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `hostname -s`, the host part of the nodes' names.
pub(super) fn short_hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let output = Command::new("hostname")
            .arg("-s")
            .output()
            .expect("run hostname -s");
        assert!(output.status.success(), "hostname -s failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    })
}
