//! The three-node RabbitMQ clusters of the failover tests (issues 44 and 56): RabbitMQ 3.10
//! (Debian 12's, this machine's) and RabbitMQ 4.0 (Debian 13's, from the Debian 13 root that
//! `scripts/services.sh rabbitmq4-root` makes, with the Khepri metadata store). Only the tests
//! that need one start it, by taking its [`Lease`], and leave it running for the next (as the
//! tests' other servers are left). This module makes a cluster (once, and again only when what
//! makes it changes), starts, stops and kills its nodes, and gives the tests its nodes' URLs
//! (from the host and from pods), the lease that gives one test at a time the right to stop
//! nodes, quorum queues declared on all three nodes, and RabbitMQ's resource alarms raised and
//! cleared on purpose.
//!
//! The functions that take no [`Cluster`] act on the 3.10 cluster, the only one before 4.0's.
//!
//! Both clusters' nodes listen on 127.0.0.1 and on the services address, with a config file,
//! data, logs and pid file of their own under `$OUTBOX_CACHE/<cluster>/<node>`, one HOME there
//! for the shared Erlang cookie, and modest Erlang settings (one scheduler: two cores carry
//! three VMs, the relays and PostgreSQL). The 4.0 nodes have an Erlang port mapper of their own
//! (`RABBIT4_CLUSTER_EPMD_PORT`), so that they never meet 3.10's nor the single RabbitMQ 4's.

mod alarm;
mod debian13;
mod node;
mod queues;
mod setup;

use std::time::{Duration, Instant};

pub use alarm::{Alarm, Resource, alarms, disk_alarm, memory_alarm, rabbitmq_status};
use node::Node;
pub use queues::{declare, declare_exchange, quorum};

use crate::services::SERVICES_ADDRESS;

/// One of the two clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cluster {
    /// RabbitMQ 3.10 (Debian 12's), nodes `rt1..rt3`, on Mnesia.
    V3_10,
    /// RabbitMQ 4.0 (Debian 13's, in its root), nodes `r4t1..r4t3`, on Khepri.
    V4_0,
}

impl Cluster {
    /// Both, the older first.
    pub const ALL: [Cluster; 2] = [Cluster::V3_10, Cluster::V4_0];

    /// `RabbitMQ 3.10`, `RabbitMQ 4.0`: for messages.
    pub fn name(self) -> &'static str {
        match self {
            Cluster::V3_10 => "RabbitMQ 3.10",
            Cluster::V4_0 => "RabbitMQ 4.0",
        }
    }

    /// The nodes' AMQP ports, node 1 first.
    pub fn ports(self) -> [u16; 3] {
        let first = match self {
            Cluster::V3_10 => crate::ports::RABBIT_CLUSTER_FIRST_PORT,
            Cluster::V4_0 => crate::ports::RABBIT4_CLUSTER_FIRST_PORT,
        };
        [first, first + 1, first + 2]
    }

    /// Node `node`'s (1 to 3) URL from the host.
    pub fn node_url(self, node: usize) -> String {
        self.node_url_on("127.0.0.1", node)
    }

    /// Node `node`'s (1 to 3) AMQP 1.0 URL from the host, on the same port (core in 4.0, whose
    /// nodes here deny the deprecated v1 address format; 3.10's nodes have no AMQP 1.0 plugin).
    pub fn node_amqp10_url(self, node: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}", self.ports()[node - 1])
    }

    /// The broker list of all three nodes, as the relay's `--broker-url` takes it.
    pub fn all_nodes(self) -> String {
        (1..=3)
            .map(|node| self.node_url(node))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// [`Self::all_nodes`] as pods reach the nodes: on the services address, where they listen
    /// too.
    pub fn all_nodes_for_pods(self) -> String {
        let host = SERVICES_ADDRESS.to_string();
        (1..=3)
            .map(|node| self.node_url_on(&host, node))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn node_url_on(self, host: &str, node: usize) -> String {
        format!("amqp://guest:guest@{host}:{}/%2f", self.ports()[node - 1])
    }

    /// Stops node `node` (1 to 3) gracefully (`stop`, returning once its VM is gone), SIGKILLs
    /// it (`kill`), or starts it (`start`, returning once it listens); says how long it took.
    pub async fn node(self, action: &str, node: usize) {
        let started = Instant::now();
        let target = Node::new(self, node);
        match action {
            "stop" => target.stop().await,
            "kill" => target.kill().await,
            "start" => target.start().await,
            other => panic!("rabbit_cluster: no node action {other:?}: stop, kill or start"),
        }
        eprintln!(
            "{} node {node} {action}: {:?}",
            self.name(),
            started.elapsed()
        );
    }

    /// [`declare`] with a quorum queue through node 1, then [`Self::await_quorum`].
    pub async fn declare_quorum(self, name: &str) {
        self.declare_quorum_on(1, name).await;
    }

    /// [`declare`] with a quorum queue through node `node`, then waits until the queue has a
    /// leader and a member on each node: a queue declared while a restarted node is not yet
    /// seen running gets two members, and losing one of two loses its majority. The queue's
    /// first leader is the declaring node (the default leader locator, `client-local`, in 3.10
    /// and 4.0).
    pub async fn declare_quorum_on(self, node: usize, name: &str) {
        declare(&self.node_url(node), name, quorum(&[])).await;
        self.await_quorum(&format!("{name}_q")).await;
    }

    /// Waits until quorum queue `queue` has a leader and a member online on each node (60 s at
    /// most, then panics naming its state).
    pub async fn await_quorum(self, queue: &str) {
        queues::await_queue(self, queue, 3, Duration::from_secs(60)).await;
    }

    /// After a node is lost: waits until quorum queue `queue` has elected a leader among the
    /// two members left (`limit` at most, then panics naming its state), and says how long it
    /// took.
    pub async fn await_new_leader(self, queue: &str, limit: Duration) {
        let started = Instant::now();
        queues::await_queue(self, queue, 2, limit).await;
        eprintln!(
            "{queue}: a leader on the two nodes left after {:?}",
            started.elapsed()
        );
    }

    /// The node (1 to 3) leading quorum queue `queue` now, if one does.
    pub async fn leader(self, queue: &str) -> Option<usize> {
        queues::leader(self, queue).await.map(|node| node.n)
    }

    /// The version node `node` runs, as `rabbitmqctl version` prints it (`4.0.5`).
    pub async fn version(self, node: usize) -> String {
        Node::new(self, node)
            .ctl(&["version"])
            .await
            .trim()
            .to_string()
    }

    /// The feature flags node `node` lists as enabled (`khepri_db` among them on Khepri).
    pub async fn enabled_feature_flags(self, node: usize) -> Vec<String> {
        let text = Node::new(self, node)
            .ctl(&["list_feature_flags", "name", "state", "--formatter", "json"])
            .await;
        let flags: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("rabbitmqctl list_feature_flags: {e}: {text}"));
        flags
            .as_array()
            .into_iter()
            .flatten()
            .filter(|flag| flag["state"] == "enabled")
            .filter_map(|flag| flag["name"].as_str().map(str::to_string))
            .collect()
    }

    /// The node names' prefix (`rt` makes `rt1@HOST`).
    fn node_prefix(self) -> &'static str {
        match self {
            Cluster::V3_10 => "rt",
            Cluster::V4_0 => "r4t",
        }
    }

    /// The cluster's folder on the host (`$OUTBOX_CACHE/rabbit-cluster`, as
    /// scripts/services.sh had it for 3.10).
    fn dir(self) -> std::path::PathBuf {
        crate::cache_dir().join(match self {
            Cluster::V3_10 => "rabbit-cluster",
            Cluster::V4_0 => "rabbit4-cluster",
        })
    }

    /// [`Self::dir`] as its nodes see it: inside the root for 4.0.
    fn seen_dir(self) -> String {
        match self {
            Cluster::V3_10 => self.dir().display().to_string(),
            Cluster::V4_0 => debian13::DATA.to_string(),
        }
    }

    /// The nodes' extra Erlang flags: one scheduler and a few async threads, two cores being
    /// shared by three VMs and the rest of the tests; 4.0's schedulers also do not busy-wait
    /// (as the single RabbitMQ 4's).
    fn erl_args(self) -> &'static str {
        match self {
            Cluster::V3_10 => "+S 1:1 +A 4",
            Cluster::V4_0 => "+S 1:1 +A 4 +sbwt none +sbwtdcpu none +sbwtdio none",
        }
    }

    /// The nodes' own Erlang port mapper, when not the system's (4369).
    fn epmd_port(self) -> Option<u16> {
        match self {
            Cluster::V3_10 => None,
            Cluster::V4_0 => Some(crate::ports::RABBIT4_CLUSTER_EPMD_PORT),
        }
    }
}

/// Held by a test that stops nodes: the cluster is up with its three nodes when the lease is
/// taken, and again after [`Lease::restore`] (a failed test's next lease brings it back too).
/// A lock file per cluster, so that tests of other binaries wait for it as well as those of
/// this one.
pub struct Lease {
    cluster: Cluster,
    _lock: std::fs::File,
}

impl Lease {
    /// The 3.10 cluster's lease.
    pub async fn take() -> Self {
        Self::take_on(Cluster::V3_10).await
    }

    /// `cluster`'s lease: made and started first when it is not (the 4.0 cluster's first
    /// making on a machine also makes the Debian 13 root when missing: minutes).
    pub async fn take_on(cluster: Cluster) -> Self {
        let lock = tokio::task::spawn_blocking(move || {
            let dir = crate::cache_dir();
            std::fs::create_dir_all(&dir).expect("the cache folder");
            let path = dir.join(format!(
                "{}.tests.lock",
                cluster.dir().file_name().unwrap().to_string_lossy()
            ));
            crate::lock_file::lock(&path, true).unwrap_or_else(|| panic!("lock {}", path.display()))
        })
        .await
        .expect("the lock task");
        setup::up(cluster).await;
        Self {
            cluster,
            _lock: lock,
        }
    }

    /// The cluster leased.
    pub fn cluster(&self) -> Cluster {
        self.cluster
    }

    /// Brings every node back and waits until each sees the other two.
    pub async fn bring_back(&self) {
        setup::up(self.cluster).await;
    }

    /// [`Self::bring_back`], and the lease ends.
    pub async fn restore(self) {
        self.bring_back().await;
    }
}

/// Node `node`'s (1 to 3) URL from the host, on the 3.10 cluster.
pub fn node_url(node: usize) -> String {
    Cluster::V3_10.node_url(node)
}

/// [`Cluster::all_nodes`] of the 3.10 cluster.
pub fn all_nodes() -> String {
    Cluster::V3_10.all_nodes()
}

/// [`Cluster::all_nodes_for_pods`] of the 3.10 cluster.
pub fn all_nodes_for_pods() -> String {
    Cluster::V3_10.all_nodes_for_pods()
}

/// [`Cluster::node`] on the 3.10 cluster: `stop` (graceful), `kill` (-9) or `start`.
pub async fn node(action: &str, node: usize) {
    Cluster::V3_10.node(action, node).await;
}

/// [`Cluster::declare_quorum`] on the 3.10 cluster.
pub async fn declare_quorum(name: &str) {
    Cluster::V3_10.declare_quorum(name).await;
}

/// [`Cluster::await_quorum`] on the 3.10 cluster.
pub async fn await_quorum(queue: &str) {
    Cluster::V3_10.await_quorum(queue).await;
}
