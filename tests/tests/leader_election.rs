//! Two operator processes with leader election on the real control plane: only the holder of
//! the coordination/v1 Lease reconciles; after `kill -9` of the leader the other takes the
//! Lease within its duration and reconciles the next change.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use outbox_operator::OutboxRelay;
use outbox_tests::cluster::{
    OPERATOR_NAME, OperatorProcess, create_connection_secrets, denials, install_chart, relay_spec,
};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::http::get as http_get;
use outbox_tests::{db, unique};
use serde_json::json;

/// The chart's default Lease name.
const LEASE: &str = "outbox-relay-operator";
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// `outbox_operator_reconciles_total` for `relay` on the operator's /metrics (0 when absent).
async fn reconciles(operator: &OperatorProcess, relay: &str) -> u64 {
    let (_, text) = http_get(&operator.metrics_addr, "/metrics").await;
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
async fn only_the_lease_holder_reconciles_and_the_other_takes_over_after_kill_9() {
    let plane = ControlPlane::shared();
    let ns = unique("leader").replace('_', "-");
    plane.create_namespace(&ns).unwrap();
    install_chart(plane, &ns, &["leaderElection.enabled=true".to_string()])
        .expect("helm install with leader election");
    let client = plane.admin_client().await.unwrap();
    create_connection_secrets(&client, &ns).await;
    let table_name = unique("leader");
    db::seeded_table(&db::table(&table_name), 0).await;

    let election = ["--leader-election=true"];
    let mut first = OperatorProcess::start(plane, &ns, &ns, "first", &election)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let leader_of = |name: &str| format!("{name}-{}", std::process::id());
    let took = outbox_tests::wait::holds(
        "the first operator holds the Lease",
        Duration::from_secs(30),
        || async { holder(&leases).await == Some(leader_of("first")) },
    )
    .await;
    assert!(
        took,
        "the first operator never took the Lease: {:?}",
        holder(&leases).await
    );
    let second = OperatorProcess::start(plane, &ns, &ns, "second", &election)
        .await
        .unwrap();

    // The leader reconciles the new relay; the candidate stays passive.
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
        first.log_text()
    );
    // Give the candidate every chance to (wrongly) reconcile too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(reconciles(&first, &key).await > 0);
    assert_eq!(
        reconciles(&second, &key).await,
        0,
        "the candidate reconciled while the other held the Lease"
    );
    assert_eq!(holder(&leases).await, Some(leader_of("first")));

    // kill -9: no release. The candidate takes over within the lease duration.
    first.kill9().await;
    let killed_at = Instant::now();
    let took_over = outbox_tests::wait::holds(
        "the second operator took the Lease over",
        LEASE_DURATION + Duration::from_secs(10),
        || async { holder(&leases).await == Some(leader_of("second")) },
    )
    .await;
    let after = killed_at.elapsed();
    assert!(
        took_over,
        "the Lease is still {:?} {after:?} after the leader died",
        holder(&leases).await
    );
    eprintln!("leader election: took over {after:.1?} after kill -9");
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
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns);
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
        second.log_text()
    );
    assert!(reconciles(&second, &key).await > 0);

    second.stop().await;
    let denied = denials(plane, &ns, OPERATOR_NAME);
    assert!(denied.is_empty(), "the chart's RBAC denied: {denied:#?}");
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}
