//! The chart's operator with two replicas on the real node: only the pod holding the
//! coordination/v1 Lease reconciles; when the leader hangs (its container's process stopped
//! with SIGSTOP: alive, silent, as a wedged process looks) the other pod takes the Lease within
//! its duration and reconciles the next change.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use outbox_operator::OutboxRelay;
use outbox_tests::cluster::{
    OPERATOR_NAME, OperatorPod, create_connection_secrets, denials, relay_spec,
};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::http::get as http_get;
use outbox_tests::node::Node;
use outbox_tests::pods::container_id;
use outbox_tests::{db, unique};
use serde_json::json;

/// The chart's default Lease name and duration.
const LEASE: &str = "outbox-relay-operator";
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// `outbox_operator_reconciles_total` for `relay` on the operator pod's /metrics (port 8080 on
/// its own address; 0 when absent).
async fn reconciles(pod: &Pod, relay: &str) -> u64 {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    let Some(ip) = ip else { return 0 };
    let (_, text) = http_get(&format!("{ip}:8080"), "/metrics").await;
    let needle = format!("outbox_operator_reconciles_total{{relay=\"{relay}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_reconciles_and_the_other_pod_takes_over_from_a_hung_leader() {
    let plane = ControlPlane::shared();
    let node = tokio::task::spawn_blocking(Node::shared).await.unwrap();
    let ns = unique("leader").replace('_', "-");
    plane.create_restricted_namespace(&ns).unwrap();
    let client = plane.admin_client().await.unwrap();
    create_connection_secrets(&client, &ns).await;
    // Two replicas: the chart turns leader election on.
    let operator = OperatorPod::install_with(plane, &ns, &["replicaCount=2"])
        .await
        .expect("helm install with two operator replicas");
    let pods = operator.pods(&client).await.unwrap();
    assert_eq!(pods.len(), 2, "two operator pods");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let took = outbox_tests::wait::holds(
        "an operator pod holds the Lease",
        Duration::from_secs(30),
        || async { holder(&leases).await.is_some_and(|h| names.contains(&h)) },
    )
    .await;
    assert!(took, "no pod took the Lease: {:?}", holder(&leases).await);
    let leader_name = holder(&leases).await.unwrap();
    let (leader, candidate): (Vec<Pod>, Vec<Pod>) =
        pods.into_iter().partition(|p| p.name_any() == leader_name);
    let (leader, candidate) = (&leader[0], &candidate[0]);

    // The leader reconciles the new relay; the candidate stays passive.
    let table_name = unique("leader");
    db::seeded_table(&db::table(&table_name), 0).await;
    let relays: Api<OutboxRelay> = Api::namespaced(client.clone(), &ns);
    let name = table_name.replace('_', "-");
    let key = format!("{ns}/{name}");
    let mut spec = relay_spec(&table_name, &table_name);
    spec.replicas = 0;
    relays
        .create(&PostParams::default(), &OutboxRelay::new(&name, spec))
        .await
        .unwrap();
    let reconciled = outbox_tests::wait::holds(
        "the leader reconciled the relay",
        Duration::from_secs(60),
        || async {
            let relay = relays.get(&name).await.unwrap();
            relay.status.and_then(|s| s.observed_generation) == relay.metadata.generation
        },
    )
    .await;
    assert!(
        reconciled,
        "the leader did not reconcile: {}",
        operator.log_text()
    );
    // Give the candidate every chance to (wrongly) reconcile too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(reconciles(leader, &key).await > 0);
    assert_eq!(
        reconciles(candidate, &key).await,
        0,
        "the candidate reconciled while the other held the Lease"
    );
    assert_eq!(holder(&leases).await, Some(leader_name.clone()));

    // SIGSTOP: the leader neither renews nor releases. The candidate takes over within the
    // lease duration (before the kubelet's liveness probe restarts the frozen one).
    let frozen = container_id(leader).expect("the leader's container id");
    node.signal_container(&frozen, "SIGSTOP").unwrap();
    let stopped_at = Instant::now();
    let candidate_name = candidate.name_any();
    let took_over = outbox_tests::wait::holds(
        "the other pod took the Lease over",
        LEASE_DURATION + Duration::from_secs(10),
        || async { holder(&leases).await.as_ref() == Some(&candidate_name) },
    )
    .await;
    let after = stopped_at.elapsed();
    let _ = node.signal_container(&frozen, "SIGCONT");
    assert!(
        took_over,
        "the Lease is still {:?} {after:?} after the leader hung",
        holder(&leases).await
    );
    eprintln!("leader election: taken over {after:.1?} after the leader hung");
    assert!(
        after <= LEASE_DURATION + Duration::from_secs(5),
        "took over after {after:?}"
    );

    // The new leader reconciles the next change.
    relays
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let followed = outbox_tests::wait::holds(
        "the new leader follows the relay's changes",
        Duration::from_secs(60),
        || async {
            let relay = relays.get(&name).await.unwrap();
            let seen =
                relay.status.and_then(|s| s.observed_generation) == relay.metadata.generation;
            let replicas = deployments
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.spec.replicas);
            seen && replicas == Some(1)
        },
    )
    .await;
    assert!(
        followed,
        "the new leader did not reconcile: {}",
        operator.log_text()
    );
    assert!(reconciles(candidate, &key).await > 0);

    operator.stop(&client).await;
    let denied = denials(plane, &ns, OPERATOR_NAME);
    assert!(denied.is_empty(), "the chart's RBAC denied: {denied:#?}");
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}
