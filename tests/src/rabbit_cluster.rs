//! The three-node RabbitMQ cluster that `scripts/services.sh rabbit-cluster` starts (only the
//! tests that need it start it), as the tests use it: its nodes' URLs (from the host and from
//! pods), a lease that gives one test at a time the right to stop its nodes, and quorum queues
//! declared on all three nodes.

use std::time::Instant;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use crate::services::{SERVICES_ADDRESS, script};

/// The nodes' AMQP ports, node 1 first.
pub const PORTS: [u16; 3] = [5782, 5783, 5784];

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
