//! What the kubelet does to relay pods, through the operator, on the real node (tests/src/node):
//! two pods of one relay each get an address of their own and serve `/metrics` there; `kubectl
//! logs deploy/…` reads them through the API server; a hung relay is restarted by its liveness
//! probe and relays again; a pod removed by a scale-down while rows flow gets SIGTERM and exits
//! on its own within its grace period (exit code 0, not the SIGKILL's 137), no message sent
//! twice; and a relay over its memory
//! limit is OOM-killed by the kernel, which the OutboxRelay's status says (reason OOMKilled,
//! naming the limit and the field to raise) until the default resources, which have room for
//! that batch of large payloads, are back. `spec.suspend` during a load takes the pods away
//! (nothing more reaches the broker) while the operator still counts the backlog into the status
//! and `kubectl get obr`, and kstatus and the Argo CD health check read it as Current and
//! Suspended; `suspend: false` delivers everything, each message once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use lapin::ExchangeKind;
use outbox_operator::crd::OutboxRelaySpec;
use outbox_tests::cluster::{TestCluster, relay_spec};
use outbox_tests::history::History;
use outbox_tests::load::SteadyLoad;
use outbox_tests::{broker, db, health, http, unique, wait};
use serde_json::json;

/// How long a step the kubelet takes may last on a loaded 2-core machine (the liveness probe
/// alone needs 3 × 10 s to give up on a hung relay).
const KUBELET_STEP: Duration = Duration::from_secs(120);

fn spec_with(table: &str, exchange: &str, relay: serde_json::Value) -> OutboxRelaySpec {
    let mut spec = serde_json::to_value(relay_spec(table, exchange)).unwrap();
    for (key, value) in relay.as_object().unwrap() {
        spec["relay"][key] = value.clone();
    }
    if let Some(replicas) = relay.get("replicas") {
        spec["replicas"] = replicas.clone();
        spec["relay"].as_object_mut().unwrap().remove("replicas");
    }
    serde_json::from_value(spec).expect("the spec deserializes")
}

fn container_status(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.clone()?.container_statuses?.first().cloned()
}

async fn wait_until<F, Fut>(what: &str, cluster: &TestCluster, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let held = wait::holds(what, KUBELET_STEP, check).await;
    assert!(
        held,
        "{what}: not within {KUBELET_STEP:?}\n{}",
        cluster.operator.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_pods_get_addresses_logs_liveness_restarts_and_a_graceful_scale_down() {
    let name = unique("e2e_pods");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    let relay = name.replace('_', "-");
    let spec = spec_with(&name, &name, json!({"replicas": 2}));
    cluster.create_relay(&relay, spec).await;
    cluster.wait_for_ready(&relay, "True", "").await;

    // Two pods, two addresses on the node's pod network, each serving its own /metrics.
    let pods = cluster.running_pods(&relay);
    assert_eq!(pods.len(), 2, "{pods:?}");
    let mut addresses = Vec::new();
    for pod in &pods {
        let ip = cluster
            .pods
            .get(pod)
            .and_then(|p| p.status.clone()?.pod_ip)
            .unwrap_or_else(|| panic!("{pod} has no IP"));
        assert!(ip.starts_with("10.244."), "{pod} at {ip}");
        let (code, body) = http::get(&format!("{ip}:9090"), "/metrics").await;
        assert!(
            code == 200 && body.contains("outbox_"),
            "{pod} at {ip}: {code}"
        );
        addresses.push(ip);
    }
    assert_ne!(addresses[0], addresses[1]);

    // The relay's log, through the API server and the kubelet.
    let logs = cluster
        .plane
        .kubectl_ok(&["-n", &cluster.namespace, "logs", &format!("deploy/{relay}")])
        .unwrap();
    assert!(logs.contains("relaying"), "{logs}");

    // A hung relay: its liveness probe fails, the kubelet restarts the container, and it relays
    // again.
    let hung = pods[0].clone();
    cluster.freeze_pod(&hung).await;
    wait_until("the kubelet restarts the hung relay", &cluster, || async {
        let status = cluster
            .pods
            .get(&hung)
            .as_deref()
            .and_then(container_status);
        status.is_some_and(|s| s.restart_count >= 1 && s.ready)
    })
    .await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 1_000, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, KUBELET_STEP).await,
        "rows still pending"
    );
    assert_eq!(
        consumer.wait_for(1_000, Duration::from_secs(60)).await,
        1_000
    );
    assert_eq!(consumer.distinct(), 1_000);

    // A scale-down while rows flow: the pod that goes gets SIGTERM and exits by itself, within
    // its grace, having settled what it published: no message twice.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 3_000, 50, |_| {})
        .await
        .unwrap();
    let pods_api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let histories: Vec<(String, History)> = cluster
        .running_pods(&relay)
        .into_iter()
        .map(|pod| (pod.clone(), History::record(pods_api.clone(), &pod)))
        .collect();
    cluster
        .relays()
        .patch(
            &relay,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    wait_until("one relay pod is left", &cluster, || async {
        cluster.running_pods(&relay).len() == 1
            && histories
                .iter()
                .any(|(pod, _)| cluster.pods.get(pod).is_none())
    })
    .await;
    let (removed, history) = histories
        .iter()
        .find(|(pod, _)| cluster.pods.get(pod).is_none())
        .expect("a pod was removed");
    let exit_codes: Vec<i64> = history
        .versions()
        .iter()
        .filter_map(|(_, pod)| {
            pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64()
        })
        .collect();
    assert!(
        !exit_codes.is_empty() && exit_codes.iter().all(|code| *code == 0),
        "{removed} ended with exit codes {exit_codes:?}, not 0 after SIGTERM"
    );
    assert!(
        db::wait_until_drained(&table, KUBELET_STEP).await,
        "rows still pending after the scale-down"
    );
    assert_eq!(
        consumer.wait_for(4_000, Duration::from_secs(60)).await,
        4_000
    );
    assert_eq!(consumer.distinct(), 4_000);
    assert!(
        consumer.duplicates().is_empty(),
        "{:?}",
        consumer.duplicates()
    );
    // With the default resources (a 256Mi memory limit at 2 workers), nothing was OOM-killed.
    let template = cluster.deployments().get(&relay).await.unwrap();
    let pod_spec = template.spec.template.spec.unwrap();
    let resources = pod_spec.containers[0]
        .resources
        .clone()
        .expect("default resources");
    // Spread over nodes by default, as a preference a one-node cluster can ignore.
    let spread = pod_spec
        .topology_spread_constraints
        .expect("default spread");
    assert_eq!(spread[0].topology_key, "kubernetes.io/hostname");
    assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
    assert_eq!(resources.limits.unwrap()["memory"].0, "256Mi");
    assert_eq!(resources.requests.unwrap()["memory"].0, "64Mi");
    let relay_object = cluster.relays().get(&relay).await.unwrap();
    let reasons: Vec<String> = relay_object
        .status
        .unwrap()
        .conditions
        .into_iter()
        .map(|c| c.reason)
        .collect();
    assert!(!reasons.iter().any(|r| r == "OOMKilled"), "{reasons:?}");

    consumer.close().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_over_its_memory_limit_is_oom_killed_and_the_status_names_the_limit() {
    // 300 rows of 200 kB: one claimed batch holds 60 MB of payloads, above a 48Mi limit.
    let name = unique("e2e_oom");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 300, 200_000, |_| {})
        .await
        .unwrap();
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    let relay = name.replace('_', "-");
    let limited = |memory: &str| json!({"resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}});
    let spec = spec_with(&name, &name, limited("48Mi"));
    cluster.create_relay(&relay, spec).await;

    let (_, _, message) = cluster.wait_for_ready(&relay, "False", "OOMKilled").await;
    assert!(
        message.contains("48Mi") && message.contains("spec.relay.resources.limits.memory"),
        "{message}"
    );
    let events = cluster.events(&relay).await;
    assert!(
        events.iter().any(|(reason, _)| reason == "OOMKilled"),
        "{events:?}"
    );

    // Back to the default resources: their limit has room for this batch of large payloads,
    // the relay drains the table and the condition clears.
    let patch = json!({"spec": {"relay": {"resources": null}}});
    cluster
        .relays()
        .patch(&relay, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, KUBELET_STEP).await,
        "rows still pending after the limit was raised"
    );
    assert_eq!(consumer.wait_for(300, Duration::from_secs(60)).await, 300);
    cluster.wait_for_ready(&relay, "True", "").await;
    let relay_object = cluster.relays().get(&relay).await.unwrap();
    let degraded = relay_object
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("False", "AsExpected")
    );

    consumer.close().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_relay_stops_delivering_keeps_reporting_its_backlog_and_resumes() {
    let name = unique("e2e_suspend");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    let relay = name.replace('_', "-");
    // Autoscaled, so the test also shows the autoscaler leaving a suspended relay at zero.
    let mut spec = relay_spec(&name, &name);
    spec.scaling = Some(
        serde_json::from_value(json!({
            "minReplicas": 1, "maxReplicas": 2, "targetBacklogPerReplica": 1000,
            "pollingInterval": "2s",
        }))
        .unwrap(),
    );
    cluster.create_relay(&relay, spec).await;
    cluster.wait_for_ready(&relay, "True", "").await;

    // A steady load: 100 rows every 100 ms until the end.
    let load = SteadyLoad::start(&table, 100, Duration::from_millis(100));
    assert!(
        consumer.wait_for(300, KUBELET_STEP).await >= 300,
        "no delivery under load"
    );

    let suspend = |on: bool| {
        let relays = cluster.relays();
        let relay = relay.clone();
        async move {
            let patch = json!({"spec": {"suspend": on}});
            relays
                .patch(&relay, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    };
    suspend(true).await;
    cluster.wait_for_ready(&relay, "True", "Suspended").await;
    wait_until("the relay pods are gone", &cluster, || async {
        let object = cluster.relays().get(&relay).await.unwrap();
        cluster.running_pods(&relay).is_empty() && object.status.and_then(|s| s.replicas) == Some(0)
    })
    .await;
    // The last batches were settled before the pods exited; their messages may still be on
    // their way to the consumer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let delivered = consumer.total();
    let backlog = || async {
        let object = cluster.relays().get(&relay).await.unwrap();
        object.status.and_then(|s| s.backlog).unwrap_or(0)
    };
    let first = backlog().await;
    // The operator counts the backlog itself: it grows with the inserts in the status...
    wait_until("the status shows the backlog growing", &cluster, || async {
        backlog().await >= first + 500
    })
    .await;
    assert_eq!(consumer.total(), delivered, "delivered while suspended");
    assert_eq!(cluster.deployment_replicas(&relay).await, Some(0));
    // ...and in kubectl get obr, with the SUSPENDED column.
    let shown = cluster
        .plane
        .kubectl_ok(&["-n", &cluster.namespace, "get", "obr", &relay])
        .unwrap();
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = shown.lines().nth(1).unwrap().split_whitespace().collect();
    let column = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!(
        (column("READY"), column("SUSPENDED")),
        ("True", "true"),
        "{shown}"
    );
    assert!(
        column("BACKLOG").parse::<i64>().unwrap() >= first + 500,
        "{shown}"
    );
    // kstatus: Current (the spec is in place); the shipped Argo CD check: Suspended.
    let object = serde_json::to_value(cluster.relays().get(&relay).await.unwrap()).unwrap();
    let verdict = health::assess(cluster.plane, std::slice::from_ref(&object))
        .unwrap_or_else(|e| panic!("{e:#}"))
        .remove(0);
    assert_eq!(
        (verdict.kstatus.as_str(), verdict.argocd.as_str()),
        ("Current", "Suspended"),
        "{verdict:?}\n{object}"
    );
    assert!(
        verdict.argocd_message.contains("spec.suspend"),
        "{verdict:?}"
    );

    suspend(false).await;
    assert!(
        consumer.wait_for(delivered + 100, KUBELET_STEP).await > delivered,
        "nothing delivered after the resume\n{}",
        cluster.operator.log_text()
    );
    let total = load.stop().await;
    assert!(
        db::wait_until_drained(&table, KUBELET_STEP).await,
        "rows still pending after the resume"
    );
    consumer.assert_each_id_once(&mut conn, &table, total).await;
    let events: Vec<String> = cluster
        .events(&relay)
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .filter(|reason| reason == "Suspended" || reason == "Resumed")
        .collect();
    assert_eq!(events, ["Suspended", "Resumed"]);

    consumer.close().await;
    cluster.shutdown().await;
}
