//! Exchanges and quorum queues on a cluster's nodes (or any broker), and waiting until a quorum
//! queue has a leader and its members online (what scripts/services/rabbit-cluster.sh's
//! `rc_await_queue` did).

use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use super::Cluster;
use super::node::Node;

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

/// A quorum queue as `rabbitmqctl list_queues name members online leader` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QueueState {
    members: usize,
    online: usize,
    /// The leader, when it is among the members online.
    leader: Option<String>,
}

impl std::fmt::Display for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "members={} online={} leader={}",
            self.members,
            self.online,
            self.leader.as_deref().unwrap_or("none")
        )
    }
}

/// Queue `queue` in `rabbitmqctl list_queues name members online leader --formatter json`;
/// None when it is not listed.
fn queue_state(list: &serde_json::Value, queue: &str) -> Option<QueueState> {
    let entry = list
        .as_array()?
        .iter()
        .find(|q| q["name"].as_str() == Some(queue))?;
    let names = |key: &str| -> Vec<String> {
        entry[key]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (members, online) = (names("members"), names("online"));
    let leader = entry["leader"]
        .as_str()
        .filter(|leader| online.iter().any(|n| n == leader))
        .map(str::to_string);
    Some(QueueState {
        members: members.len(),
        online: online.len(),
        leader,
    })
}

/// Quorum queue `queue` as the first node of `cluster` that answers lists it (after a loss, not
/// necessarily node 1); Err says why there is none (`no answer`, `missing`).
async fn state(cluster: Cluster, queue: &str) -> Result<QueueState, String> {
    for node in Node::all(cluster) {
        if !node.up() {
            continue;
        }
        let output = node
            .ctl_output(&[
                "list_queues",
                "name",
                "members",
                "online",
                "leader",
                "--formatter",
                "json",
            ])
            .await;
        if !output.status.success() {
            continue;
        }
        let Ok(list) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
            continue;
        };
        return queue_state(&list, queue).ok_or_else(|| "missing".to_string());
    }
    Err("no answer".into())
}

/// The node leading quorum queue `queue` of `cluster` now, if one does.
pub(super) async fn leader(cluster: Cluster, queue: &str) -> Option<Node> {
    let name = state(cluster, queue).await.ok()?.leader?;
    Node::all(cluster)
        .into_iter()
        .find(|node| node.name() == name)
}

/// Waits until quorum queue `queue` of `cluster` has a leader and `online` members online out
/// of three, `limit` at most, then panics naming its state.
pub(super) async fn await_queue(cluster: Cluster, queue: &str, online: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let state = state(cluster, queue).await;
        let ready = |found: &QueueState| {
            found.members == 3 && found.online == online && found.leader.is_some()
        };
        if state.as_ref().is_ok_and(ready) {
            return;
        }
        if started.elapsed() >= limit {
            let state = state.map_or_else(|why| why, |found| found.to_string());
            panic!(
                "quorum queue {queue} has no leader with {online} members online after {limit:?}: {state}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_counts_its_members_and_a_leader_only_when_online() {
        let list = serde_json::json!([
            {"name": "other_q", "members": [], "online": [], "leader": ""},
            {"name": "a_q", "members": ["rt1@vm", "rt2@vm", "rt3@vm"],
             "online": ["rt1@vm", "rt3@vm"], "leader": "rt1@vm"},
            {"name": "b_q", "members": ["rt1@vm", "rt2@vm", "rt3@vm"],
             "online": ["rt3@vm"], "leader": "rt2@vm"},
        ]);
        let a = queue_state(&list, "a_q").unwrap();
        assert_eq!((a.members, a.online), (3, 2));
        assert_eq!(a.leader.as_deref(), Some("rt1@vm"));
        assert_eq!(a.to_string(), "members=3 online=2 leader=rt1@vm");
        // A leader not among the members online is no leader.
        let b = queue_state(&list, "b_q").unwrap();
        assert_eq!(b.leader, None);
        assert_eq!(b.to_string(), "members=3 online=1 leader=none");
        assert_eq!(queue_state(&list, "c_q"), None);
    }
}
