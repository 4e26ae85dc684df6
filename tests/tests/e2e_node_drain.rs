//! `kubectl drain` of the node under a running relay of two pods. First with the relay's
//! PodDisruptionBudget (the default, at most one pod away): the drain evicts one relay pod and
//! the operator's, is refused the second relay pod, and gives up; that pod keeps relaying while
//! the node is cordoned. Then with the budget turned off: the drain evicts the last pod, its
//! replacements wait unscheduled, rows inserted meanwhile stay pending, and once the node is
//! uncordoned every row reaches the broker. A test binary of its own: the drain empties the
//! node its control plane shares with nobody else.

use std::time::Duration;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{Patch, PatchParams};
use lapin::ExchangeKind;
use outbox_operator::crd::OutboxRelaySpec;
use outbox_tests::cluster::{TestCluster, relay_spec};
use outbox_tests::node::NODE_NAME;
use outbox_tests::{broker, db, unique, wait};
use serde_json::json;

const STEP: Duration = Duration::from_secs(120);

/// `kubectl drain` of the node, giving up after `timeout`: (succeeded, stdout, stderr).
fn drain(cluster: &TestCluster, timeout: &str) -> (bool, String, String) {
    cluster
        .plane
        .kubectl_output(&[
            "drain",
            NODE_NAME,
            "--ignore-daemonsets",
            &format!("--timeout={timeout}"),
        ])
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Relay pods the drain's output says it evicted.
fn evicted(stdout: &str, relay: &str) -> usize {
    stdout
        .lines()
        .filter(|l| l.contains(&format!("pod/{relay}-")) && l.ends_with("evicted"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_node_respects_the_relays_disruption_budget_and_loses_nothing() {
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
    let budgets: Api<PodDisruptionBudget> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let budget = budgets.get(&relay).await.expect("the relay's budget");
    let allowed = wait::holds("the budget allows one disruption", STEP, || async {
        let budget = budgets.get(&relay).await.unwrap();
        budget
            .status
            .is_some_and(|s| s.disruptions_allowed == Some(1))
    })
    .await;
    assert!(allowed, "{:?}", budgets.get(&relay).await.unwrap().status);
    assert_eq!(
        budget.metadata.owner_references.unwrap()[0].kind,
        "OutboxRelay"
    );

    // Rows in flight while the node drains.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 2_000, 50, |_| {})
        .await
        .unwrap();
    let (drained, stdout, stderr) = drain(&cluster, "30s");
    assert!(
        !drained,
        "the drain took every relay pod:\n{stdout}{stderr}"
    );
    assert!(
        stderr.contains("disruption budget"),
        "refused for another reason:\n{stderr}"
    );
    assert_eq!(evicted(&stdout, &relay), 1, "{stdout}");
    let one_left = wait::holds("one relay pod is left", STEP, || async {
        cluster.running_pods(&relay).len() == 1
    })
    .await;
    assert!(one_left, "{:?}", cluster.running_pods(&relay));

    // The pod the budget kept relays on, the node cordoned and the operator evicted.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 1_000, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, STEP).await,
        "rows still pending while one relay pod runs"
    );
    assert_eq!(
        consumer.wait_for(3_000, Duration::from_secs(60)).await,
        3_000
    );

    // Without the budget the drain goes through. The operator pod was evicted, so the budget
    // is removed by hand, as someone who turned it off on purpose would see it go.
    cluster
        .relays()
        .patch(
            &relay,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"relay": {"disruptionBudget": {"enabled": false}}}})),
        )
        .await
        .unwrap();
    cluster
        .plane
        .kubectl_ok(&["-n", &cluster.namespace, "delete", "pdb", &relay])
        .unwrap();
    let (drained, stdout, stderr) = drain(&cluster, "120s");
    assert!(drained, "{stdout}{stderr}");
    assert_eq!(evicted(&stdout, &relay), 1, "{stdout}");
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
    // The Deployment replaced the evicted pod; it waits, unschedulable, on the cordoned node.
    let phases: Vec<&str> = unschedulable.split_whitespace().collect();
    assert!(
        !phases.is_empty() && phases.iter().all(|phase| *phase == "Pending"),
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
        consumer.wait_for(4_000, Duration::from_secs(60)).await,
        4_000
    );
    assert_eq!(consumer.distinct(), 4_000);
    // With the operator back, the budget stays off as the spec says: the operator was evicted
    // when the spec changed, so once it reports the new generation it has applied that spec
    // (and would have recreated the budget, had it ignored `enabled: false`).
    let generation = cluster
        .relays()
        .get(&relay)
        .await
        .unwrap()
        .metadata
        .generation;
    let seen = wait::holds(
        "the operator reconciled the spec without a budget",
        STEP,
        || async {
            let status = cluster.relays().get(&relay).await.unwrap().status;
            status.and_then(|s| s.observed_generation) == generation
        },
    )
    .await;
    assert!(seen, "{}", cluster.operator.log_text());
    assert!(budgets.get_opt(&relay).await.unwrap().is_none());
    consumer.close().await;
    cluster.shutdown().await;
}
