//! `kubectl drain` of the node under a running relay: the node is cordoned and every pod on it
//! (the relay's and the operator's) is evicted through the eviction API; the relay pods stop
//! with SIGTERM, the replacements wait unscheduled, rows inserted meanwhile stay pending, and
//! once the node is uncordoned every row reaches the broker. A test binary of its own: the
//! drain empties the node its control plane shares with nobody else.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_operator::crd::OutboxRelaySpec;
use outbox_tests::cluster::{TestCluster, relay_spec};
use outbox_tests::node::NODE_NAME;
use outbox_tests::{broker, db, unique, wait};

const STEP: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_node_evicts_the_relay_pods_and_loses_nothing() {
    let name = unique("e2e_drain");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    let relay = name.replace('_', "-");
    let mut spec = serde_json::to_value(relay_spec(&name, &name)).unwrap();
    spec["replicas"] = 2.into();
    let spec: OutboxRelaySpec = serde_json::from_value(spec).unwrap();
    cluster.create_relay(&relay, spec).await;
    cluster.wait_for_ready(&relay, "True", "").await;
    assert_eq!(cluster.running_pods(&relay).len(), 2);

    // Rows in flight while the node drains.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 2_000, 50, |_| {})
        .await
        .unwrap();
    let drained = cluster
        .plane
        .kubectl_ok(&["drain", NODE_NAME, "--ignore-daemonsets", "--timeout=120s"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let evicted = drained
        .lines()
        .filter(|l| l.contains(&format!("pod/{relay}-")) && l.ends_with("evicted"))
        .count();
    assert_eq!(evicted, 2, "{drained}");
    let gone = wait::holds("the relay pods are gone", STEP, || async {
        cluster.running_pods(&relay).is_empty()
    })
    .await;
    assert!(gone, "{:?}", cluster.running_pods(&relay));

    // Nothing runs the relay now: what is inserted waits in the table.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 1_000, 50, |_| {})
        .await
        .unwrap();
    assert!(db::pending(&mut conn, &table).await >= 1_000);
    let unschedulable = cluster
        .plane
        .kubectl_ok(&[
            "-n",
            &cluster.namespace,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={relay}"),
            "-o",
            "jsonpath={.items[*].status.phase}",
        ])
        .unwrap();
    assert!(
        unschedulable
            .split_whitespace()
            .all(|phase| phase == "Pending"),
        "{unschedulable}"
    );

    cluster
        .plane
        .kubectl_ok(&["uncordon", NODE_NAME])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        db::wait_until_drained(&table, STEP).await,
        "rows still pending after the uncordon\n{}",
        cluster.operator.log_text()
    );
    assert_eq!(
        consumer.wait_for(3_000, Duration::from_secs(60)).await,
        3_000
    );
    assert_eq!(consumer.distinct(), 3_000);
    consumer.close().await;
    cluster.shutdown().await;
}
