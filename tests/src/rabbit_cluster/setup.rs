//! Making a cluster and bringing it up (what scripts/services/rabbit-cluster.sh's
//! `start_rabbit_cluster` and `rc_await_cluster` did): made once, and again only when its key,
//! a hash of what makes it, changes; brought up on every lease, which is quick when it runs.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use super::node::Node;
use super::{Cluster, debian13};

/// Makes the cluster when its key changed, starts the nodes that are down side by side, and
/// returns once every node sees all three running and no partition. Holds a lock file
/// meanwhile, so that test binaries starting it at once take turns.
pub(super) async fn up(cluster: Cluster) {
    crate::services::check_address().unwrap_or_else(|e| panic!("{e}"));
    let dir = cluster.dir();
    let lock = tokio::task::spawn_blocking(move || {
        // Made first, off the async workers: the first time on a machine it takes minutes.
        check_installed(cluster);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.with_extension("lock");
        crate::lock_file::lock(&path, true).unwrap_or_else(|| panic!("lock {}", path.display()))
    })
    .await
    .expect("the lock task");
    let key = key(cluster);
    let joined = cluster.dir().join(".joined");
    if std::fs::read_to_string(&joined).ok().as_deref() != Some(key.as_str()) {
        make(cluster).await;
        std::fs::write(&joined, &key).unwrap_or_else(|e| panic!("write {}: {e}", joined.display()));
    }
    // Nodes that were stopped start side by side: a node waits for the peers it last saw.
    futures::future::join_all(Node::all(cluster).map(Node::start)).await;
    await_cluster(cluster).await;
    drop(lock);
}

/// Fails with the fix when the cluster's RabbitMQ is not there: 3.10 is the one
/// scripts/services.sh installs for the tests' broker; 4.0's root is made here if missing.
fn check_installed(cluster: Cluster) {
    match cluster {
        Cluster::V3_10 => assert!(
            std::path::Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server").exists(),
            "RabbitMQ is not installed: run scripts/services.sh"
        ),
        Cluster::V4_0 => {
            debian13::root();
        }
    }
}

/// A new cluster: the old nodes killed and their data removed, a new Erlang cookie, each node's
/// files, node 1 started and the others joined to it.
async fn make(cluster: Cluster) {
    let dir = cluster.dir();
    eprintln!(
        "making a three-node {} cluster in {}",
        cluster.name(),
        dir.display()
    );
    let nodes = Node::all(cluster);
    for node in nodes {
        node.kill().await;
        remove_dir(&node.dir());
    }
    let home = dir.join("home");
    remove_dir(&home);
    std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("create {}: {e}", home.display()));
    // Written before the nodes start, so that three starting at once do not race to make it.
    let cookie = home.join(".erlang.cookie");
    std::fs::write(&cookie, uuid::Uuid::new_v4().simple().to_string())
        .and_then(|()| std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400)))
        .unwrap_or_else(|e| panic!("write {}: {e}", cookie.display()));
    for node in nodes {
        node.write_files();
    }
    let first = nodes[0];
    first.start().await;
    let first_name = first.name();
    let steps: [&[&str]; 4] = [
        &["stop_app"],
        &["reset"],
        &["join_cluster", &first_name],
        &["start_app"],
    ];
    for node in &nodes[1..] {
        node.start().await;
        // join_cluster prints harmless feature-flag errors on 3.10; a failed step panics
        // naming the node and the step.
        for step in steps {
            node.ctl(step).await;
        }
    }
    if cluster == Cluster::V4_0 {
        // Khepri replaces Mnesia only once this flag is on (4.0 still starts on Mnesia); enabled
        // on the whole cluster, which migrates the metadata. 4.0.5 refuses it without
        // `--opt-in` ("requires the user to explicitly opt-in").
        first
            .ctl(&["enable_feature_flag", "--opt-in", "khepri_db"])
            .await;
    }
}

fn remove_dir(path: &std::path::Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("remove {}: {e}", path.display()),
    }
}

/// The cluster's key: a hash of this file's code (comments and blank lines aside), every node's
/// config and environment, the services address, and for 4.0 the root it runs from (whose name
/// holds the root's own key). Whatever changes it makes the cluster again on the next lease;
/// nothing is bumped by hand.
fn key(cluster: Cluster) -> String {
    let mut inputs = String::new();
    for line in include_str!("setup.rs").lines().map(str::trim) {
        if !line.is_empty() && !line.starts_with("//") {
            inputs.push_str(line);
            inputs.push('\n');
        }
    }
    inputs.push_str(&format!(
        "{}\n{}\n",
        cluster.name(),
        crate::services::SERVICES_ADDRESS
    ));
    for node in Node::all(cluster) {
        inputs.push_str(&node.config());
        for (name, value) in node.env() {
            inputs.push_str(&format!("{name}={value}\n"));
        }
    }
    if cluster == Cluster::V4_0 {
        inputs.push_str(&debian13::root().display().to_string());
    }
    sha256(&inputs)
}

/// The first 16 hex digits of the SHA-256 of `text` (`sha256sum`, as scripts/services.sh's
/// stamps).
fn sha256(text: &str) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run sha256sum: {e}"));
    child
        .stdin
        .take()
        .expect("its stdin")
        .write_all(text.as_bytes())
        .expect("write to sha256sum");
    let output = child.wait_with_output().expect("sha256sum");
    assert!(output.status.success(), "sha256sum failed");
    String::from_utf8_lossy(&output.stdout)
        .chars()
        .take(16)
        .collect()
}

/// A node answers on its AMQP port before its peers count it as running again (after a kill
/// -9, mnesia may even see a partition for a while). A quorum queue declared then gets members
/// only on the nodes seen running, and losing one of two loses its majority: waits until every
/// node sees all three running and no partition (60 s at most, then panics with each node's
/// view).
async fn await_cluster(cluster: Cluster) {
    let nodes = Node::all(cluster);
    for attempt in 0..120 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut all = true;
        for node in nodes {
            if view(node).await != Some((3, 0)) {
                all = false;
                break;
            }
        }
        if all {
            return;
        }
    }
    let mut views = String::new();
    for node in nodes {
        let output = node.ctl_output(&["cluster_status"]).await;
        views.push_str(&format!(
            "{}: {}{}\n",
            node.name(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    panic!(
        "{} cluster: a node does not see the other two running, or sees a partition, after 60 s:\n{views}",
        cluster.name()
    );
}

/// (nodes running, partitions) as `node` sees them; None when it does not answer.
async fn view(node: Node) -> Option<(usize, usize)> {
    let output = node
        .ctl_output(&["cluster_status", "--formatter", "json"])
        .await;
    if !output.status.success() {
        return None;
    }
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    Some(running_and_partitions(&status))
}

/// From `rabbitmqctl cluster_status --formatter json`: how many distinct nodes run, and how
/// many partitions there are (an object or a list, by version; absent is none).
fn running_and_partitions(status: &serde_json::Value) -> (usize, usize) {
    let running: std::collections::BTreeSet<&str> = status["running_nodes"]
        .as_array()
        .map(|nodes| nodes.iter().filter_map(|n| n.as_str()).collect())
        .unwrap_or_default();
    let partitions = match &status["partitions"] {
        serde_json::Value::Object(partitions) => partitions.len(),
        serde_json::Value::Array(partitions) => partitions.len(),
        _ => 0,
    };
    (running.len(), partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_status_gives_running_nodes_and_partitions() {
        let status = serde_json::json!({
            "running_nodes": ["rt1@vm", "rt2@vm", "rt3@vm", "rt1@vm"],
            "partitions": {},
        });
        assert_eq!(running_and_partitions(&status), (3, 0));
        let split = serde_json::json!({
            "running_nodes": ["rt1@vm"],
            "partitions": {"rt1@vm": ["rt2@vm"]},
        });
        assert_eq!(running_and_partitions(&split), (1, 1));
        assert_eq!(running_and_partitions(&serde_json::json!({})), (0, 0));
    }
}
