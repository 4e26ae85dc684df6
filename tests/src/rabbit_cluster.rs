//! The three-node RabbitMQ cluster that `scripts/services.sh rabbit-cluster` starts (only the
//! tests that need it start it), as the tests use it: its nodes' URLs (from the host and from
//! pods), a lease that gives one test at a time the right to stop its nodes, and quorum queues
//! declared on all three nodes, and RabbitMQ's resource alarms raised and cleared on purpose.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use crate::services::{SERVICES_ADDRESS, script};

const FIRST_PORT: u16 = crate::ports::RABBIT_CLUSTER_FIRST_PORT;
/// The nodes' AMQP ports, node 1 first.
pub const PORTS: [u16; 3] = [FIRST_PORT, FIRST_PORT + 1, FIRST_PORT + 2];

/// Node `node`'s (1 to 3) URL from the host.
pub fn node_url(node: usize) -> String {
    node_url_on("127.0.0.1", node)
}

/// The broker list of all three nodes, as the relay's `--broker-url` takes it.
pub fn all_nodes() -> String {
    (1..=3).map(node_url).collect::<Vec<_>>().join(",")
}

/// [`all_nodes`] as pods reach the nodes: on the services address, where they listen too.
pub fn all_nodes_for_pods() -> String {
    let host = SERVICES_ADDRESS.to_string();
    (1..=3)
        .map(|node| node_url_on(&host, node))
        .collect::<Vec<_>>()
        .join(",")
}

fn node_url_on(host: &str, node: usize) -> String {
    format!("amqp://guest:guest@{host}:{}/%2f", PORTS[node - 1])
}

async fn services(args: &[&str]) {
    script(args).await.unwrap_or_else(|e| panic!("{e}"));
}

/// Held by a test that stops nodes: the cluster is up with its three nodes when the lease is
/// taken, and again after [`Lease::restore`] (a failed test's next lease brings it back too).
/// A lock file, so that tests of other binaries wait for it as well as those of this one.
pub struct Lease {
    _lock: std::fs::File,
}

impl Lease {
    pub async fn take() -> Self {
        let lock = tokio::task::spawn_blocking(|| {
            let dir = crate::cache_dir();
            std::fs::create_dir_all(&dir).expect("the cache folder");
            let path = dir.join("rabbit-cluster.tests.lock");
            crate::lock_file::lock(&path, true).unwrap_or_else(|| panic!("lock {}", path.display()))
        })
        .await
        .expect("the lock task");
        services(&["rabbit-cluster"]).await;
        Self { _lock: lock }
    }

    /// Brings every node back and waits until each sees the other two.
    pub async fn bring_back(&self) {
        services(&["rabbit-cluster"]).await;
    }

    /// [`Self::bring_back`], and the lease ends.
    pub async fn restore(self) {
        self.bring_back().await;
    }
}

/// `scripts/services.sh rabbit-cluster-node ACTION NODE`: `stop` (graceful), `kill` (-9) or
/// `start`.
pub async fn node(action: &str, node: usize) {
    let started = Instant::now();
    services(&["rabbit-cluster-node", action, &node.to_string()]).await;
    eprintln!("node {node} {action}: {:?}", started.elapsed());
}

/// Queue arguments of a quorum queue, with `extra` ones.
pub fn quorum(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    for (key, value) in extra {
        arguments.insert((*key).into(), value.clone());
    }
    arguments
}

/// Declares the durable fanout exchange `name` and its queue `name_q` (as
/// [`crate::broker::consume_at`] names it) with `arguments`, bound, on the broker at `url`: the
/// relay may start before the consumer does.
pub async fn declare(url: &str, name: &str, arguments: FieldTable) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("the broker answers");
    let channel = connection.create_channel().await.unwrap();
    declare_exchange_on(&channel, name).await;
    let queue = format!("{name}_q");
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), options, arguments)
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            name.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "declared".into()).await;
}

/// The durable fanout exchange `name` alone, on the broker at `url`.
pub async fn declare_exchange(url: &str, name: &str) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("the broker answers");
    let channel = connection.create_channel().await.unwrap();
    declare_exchange_on(&channel, name).await;
    let _ = connection.close(200, "declared".into()).await;
}

async fn declare_exchange_on(channel: &lapin::Channel, name: &str) {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Fanout,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// [`declare`] with a quorum queue on the cluster, then waits until the queue has a leader and
/// a member on each node: a queue declared while a restarted node is not yet seen running gets
/// two members, and losing one of two loses its majority.
pub async fn declare_quorum(name: &str) {
    declare_quorum_on(1, name).await;
}

/// [`declare_quorum`] through node `node`: a quorum queue's first leader is the declaring
/// node (3.10's default leader locator, `client-local`).
pub async fn declare_quorum_on(node: usize, name: &str) {
    declare(&node_url(node), name, quorum(&[])).await;
    await_quorum(&format!("{name}_q")).await;
}

/// Waits until quorum queue `queue` has a leader and a member online on each node (60 s at
/// most, then panics naming its state).
pub async fn await_quorum(queue: &str) {
    services(&["rabbit-cluster-queue", queue]).await;
}

/// After a node is lost: waits until quorum queue `queue` has elected a leader among the two
/// members left (`limit` at most, then panics naming its state), and says how long it took.
pub async fn await_new_leader(queue: &str, limit: std::time::Duration) {
    let started = Instant::now();
    let seconds = limit.as_secs().to_string();
    services(&["rabbit-cluster-queue", queue, "2", &seconds]).await;
    eprintln!(
        "{queue}: a leader on the two nodes left after {:?}",
        started.elapsed()
    );
}

/// A RabbitMQ resource alarm: publishing stops on the whole cluster while it is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `vm_memory_high_watermark` below what the node uses.
    Memory,
    /// `disk_free_limit` above the free disk space.
    Disk,
}

impl Resource {
    /// As `rabbitmqctl status` names it in its `alarms`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Disk => "disk",
        }
    }

    /// The `rabbitmqctl` command that raises it: a watermark of 0, or a free-disk limit far
    /// above any disk here.
    fn raise_args(self) -> [&'static str; 2] {
        match self {
            Resource::Memory => ["set_vm_memory_high_watermark", "0"],
            Resource::Disk => ["set_disk_free_limit", "1000GB"],
        }
    }
}

/// The memory alarm raised on node `node` (1 to 3); see [`Alarm`].
pub async fn memory_alarm(node: usize) -> Alarm {
    let mut alarm = Alarm::prepare(node, Resource::Memory).await;
    alarm.raise().await;
    alarm
}

/// The disk alarm raised on node `node` (1 to 3); see [`Alarm`].
pub async fn disk_alarm(node: usize) -> Alarm {
    let mut alarm = Alarm::prepare(node, Resource::Disk).await;
    alarm.raise().await;
    alarm
}

/// An alarm a test raises. It blocks every publisher of the cluster, so only a test holding
/// the [`Lease`] raises one, and never on the tests' shared RabbitMQ. [`Alarm::clear`] sets the
/// value read before raising back and waits until the alarm is gone; a guard raised and not
/// cleared (a failing test) sets it back on drop, synchronously, so the next lease finds no
/// alarm.
pub struct Alarm {
    node: usize,
    resource: Resource,
    /// The `rabbitmqctl` arguments that set the setting back.
    restore: Vec<String>,
    raised: bool,
    cleared: bool,
}

impl Alarm {
    /// Reads the setting to restore from `rabbitmqctl status`; raises nothing yet, so that
    /// [`Alarm::raise`] is one command at the moment it matters.
    pub async fn prepare(node: usize, resource: Resource) -> Self {
        let status = rabbitmq_status(node).await;
        Self {
            node,
            resource,
            restore: restore_args(resource, &status),
            raised: false,
            cleared: false,
        }
    }

    /// Raises the alarm; returns once the command that raised it has (the node acts on a new
    /// watermark or limit at once).
    pub async fn raise(&mut self) {
        // Marked first: a raise that failed half-way is undone too.
        self.raised = true;
        rabbitmqctl(self.node, &self.resource.raise_args()).await;
    }

    /// Sets the setting back, then waits until `rabbitmqctl status` lists no alarm of this
    /// resource (30 s at most, then panics with the alarms still listed).
    pub async fn clear(mut self) {
        let restore: Vec<&str> = self.restore.iter().map(String::as_str).collect();
        rabbitmqctl(self.node, &restore).await;
        self.cleared = true;
        let resource = self.resource.name();
        let gone = crate::wait::for_value(
            "the alarm is no longer listed",
            Duration::from_secs(30),
            || async {
                let listed = alarms(self.node).await;
                (!listed.iter().any(|r| r == resource)).then_some(())
            },
        )
        .await;
        if let Err(e) = gone {
            panic!("{e}: {:?}", alarms(self.node).await);
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        if !self.raised || self.cleared {
            return;
        }
        let outcome = ctl_command(self.node, &self.restore).output();
        let said = match outcome {
            Ok(output) if output.status.success() => "set back".to_string(),
            Ok(output) => format!(
                "NOT set back: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Err(e) => format!("NOT set back: {e}"),
        };
        eprintln!(
            "{} alarm on node {} (on drop): {said} ({:?})",
            self.resource.name(),
            self.node,
            self.restore
        );
    }
}

/// The resources in alarm on the cluster, as `rabbitmqctl status` on node `node` lists them
/// (`memory`, `disk`).
pub async fn alarms(node: usize) -> Vec<String> {
    let status = rabbitmq_status(node).await;
    status["alarms"]
        .as_array()
        .map(|alarms| {
            alarms
                .iter()
                .filter_map(|a| a["resource"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `rabbitmqctl status --formatter json` of node `node`.
pub async fn rabbitmq_status(node: usize) -> serde_json::Value {
    let text = rabbitmqctl(node, &["status", "--formatter", "json"]).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("rabbitmqctl status: {e}: {text}"))
}

/// What sets `resource`'s setting back to its value in `status`. A value this module's own
/// raise left (a test killed before it could clear: 0, or 1000 GB) is replaced by RabbitMQ's
/// default, so that a run after it does not keep the alarm for good.
fn restore_args(resource: Resource, status: &serde_json::Value) -> Vec<String> {
    let args: Vec<String> = match resource {
        Resource::Memory => {
            let setting = &status["vm_memory_high_watermark_setting"];
            let relative = setting["relative"].as_f64();
            let absolute = &setting["absolute"];
            match (relative, absolute) {
                (Some(relative), _) if relative > 0.0 => vec![relative.to_string()],
                (None, serde_json::Value::Number(bytes)) => {
                    vec!["absolute".into(), bytes.to_string()]
                }
                (None, serde_json::Value::String(amount)) => {
                    vec!["absolute".into(), amount.clone()]
                }
                _ => {
                    eprintln!("memory watermark {setting} left by an earlier run: 0.4 restored");
                    vec!["0.4".into()]
                }
            }
        }
        Resource::Disk => match status["disk_free_limit"].as_u64() {
            Some(bytes) if bytes < 1_000_000_000_000 => vec![bytes.to_string()],
            other => {
                eprintln!("disk free limit {other:?} left by an earlier run: 50 MB restored");
                vec!["50000000".into()]
            }
        },
    };
    let command = match resource {
        Resource::Memory => "set_vm_memory_high_watermark",
        Resource::Disk => "set_disk_free_limit",
    };
    std::iter::once(command.to_string()).chain(args).collect()
}

/// `rabbitmqctl -q -n rtN@HOST ARGS` against node `node`; returns its stdout, panics with its
/// stderr when it fails.
async fn rabbitmqctl(node: usize, args: &[&str]) -> String {
    let output = tokio::process::Command::from(ctl_command(node, args))
        .output()
        .await
        .unwrap_or_else(|e| panic!("run rabbitmqctl: {e}"));
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} on node {node}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The command, in the environment `scripts/services.sh` gives the cluster's CLI (`rc_ctl`):
/// the cluster's HOME for the shared Erlang cookie, no `rabbitmq-env.conf`. It runs in that
/// HOME, so a crash dump of the CLI lands there, not in the repository.
fn ctl_command<S: AsRef<std::ffi::OsStr>>(node: usize, args: &[S]) -> std::process::Command {
    let home = cluster_dir().join("home");
    let mut command = std::process::Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl");
    command
        .env("HOME", &home)
        .env("RABBITMQ_CONF_ENV_FILE", "/dev/null")
        .args(["-q", "-n", &format!("rt{node}@{}", short_hostname())])
        .args(args)
        .current_dir(&home)
        .stdin(Stdio::null());
    command
}

/// Where services.sh keeps the cluster (`$OUTBOX_CACHE/rabbit-cluster`).
fn cluster_dir() -> PathBuf {
    crate::cache_dir().join("rabbit-cluster")
}

/// `hostname -s`, the host part of the nodes' names, as services.sh takes it.
fn short_hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let output = std::process::Command::new("hostname")
            .arg("-s")
            .output()
            .expect("run hostname -s");
        assert!(output.status.success(), "hostname -s failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alarm_is_cleared_with_the_setting_it_found() {
        let status = serde_json::json!({
            "vm_memory_high_watermark_setting": {"relative": 0.4},
            "disk_free_limit": 50_000_000u64,
        });
        assert_eq!(
            restore_args(Resource::Memory, &status),
            ["set_vm_memory_high_watermark", "0.4"]
        );
        assert_eq!(
            restore_args(Resource::Disk, &status),
            ["set_disk_free_limit", "50000000"]
        );
        let absolute = serde_json::json!({
            "vm_memory_high_watermark_setting": {"absolute": 2_000_000_000u64},
        });
        assert_eq!(
            restore_args(Resource::Memory, &absolute),
            ["set_vm_memory_high_watermark", "absolute", "2000000000"]
        );
        // What a killed run's raise left: RabbitMQ's defaults instead.
        let left = serde_json::json!({
            "vm_memory_high_watermark_setting": {"relative": 0.0},
            "disk_free_limit": 1_000_000_000_000u64,
        });
        assert_eq!(
            restore_args(Resource::Memory, &left),
            ["set_vm_memory_high_watermark", "0.4"]
        );
        assert_eq!(
            restore_args(Resource::Disk, &left),
            ["set_disk_free_limit", "50000000"]
        );
    }
}
