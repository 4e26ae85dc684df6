//! The node agent on its own, on the real control plane: a Deployment built by the operator's
//! own builder becomes, through the real deployment and replicaset controllers, pods that the
//! agent binds and runs as relay processes with their probes; scaling, template changes
//! (rolling updates) and SIGTERM behave as the autoscaling tests assume.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_operator::reconcile::build::{BuildSettings, build_deployment};
use outbox_operator::reconcile::validate::validate;
use outbox_tests::cluster::{create_connection_secrets, relay_spec};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node_agent::{NodeAgent, NodeAgentConfig, PodRuntime};
use outbox_tests::{broker, db, oci, process, unique};
use serde_json::json;

/// The relay's Deployment as the operator would apply it, with `batch_size` in its template.
fn deployment_for(
    namespace: &str,
    name: &str,
    table: &str,
    replicas: i32,
    batch_size: i32,
) -> Deployment {
    let mut spec = relay_spec(table, table);
    spec.relay.batch_size = batch_size;
    let mut relay = OutboxRelay::new(name, spec);
    relay.metadata.namespace = Some(namespace.into());
    relay.metadata.uid = Some(format!("uid-{name}"));
    let plan = validate(&relay.spec).expect("the test spec is valid");
    build_deployment(&relay, &plan, "v1", replicas, &BuildSettings::default())
}

async fn migrate(table: &str) {
    let database_url = outbox_tests::database_url();
    let (code, _, stderr) =
        process::run_relay_command(&["migrate", "--table", table, "--database-url", &database_url])
            .await;
    assert_eq!(code, 0, "migrate failed: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_become_relay_processes_that_scale_roll_and_stop_with_sigterm() {
    let table_name = unique("agent");
    let table = db::table(&table_name);
    db::seeded_table(&table, 5_000).await;
    migrate(&table_name).await;
    let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
    let name = table_name.replace('_', "-");
    let key = name.clone();

    let plane = ControlPlane::shared();
    let namespace = name.clone();
    plane.create_namespace(&namespace).unwrap();
    let client = plane.admin_client().await.unwrap();
    create_connection_secrets(&client, &namespace).await;
    let agent = NodeAgent::start(client.clone(), &namespace, NodeAgentConfig::default())
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let pods_api: Api<Pod> = Api::namespaced(client, &namespace);
    let apply = PatchParams::apply("test").force();
    deployments
        .patch(
            &name,
            &apply,
            &Patch::Apply(deployment_for(&namespace, &name, &table_name, 2, 500)),
        )
        .await
        .unwrap();

    let ready =
        outbox_tests::wait::holds("two pods are ready", Duration::from_secs(60), || async {
            let status = deployments
                .get(&name)
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            agent.running_pods(&key).len() == 2
                && status.ready_replicas == Some(2)
                && status.observed_generation == Some(1)
        })
        .await;
    assert!(ready, "two ready pods: {:?}", agent.timeline());
    // The pods are the real ReplicaSet's, bound to the agent's Node, Ready by their probe.
    let pods = pods_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pods.len(), 2);
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(agent.node.as_str()));
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let ready = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.as_str());
        assert_eq!(ready, Some("True"), "{}", pod.name_any());
    }
    // With runc, each pod is a container of the image under the security context the operator
    // wrote into the pod spec, as the kernel reports it.
    if NodeAgentConfig::default().runtime == PodRuntime::Containers {
        for pod in &pods {
            let id = agent
                .container_of(&pod.name_any())
                .expect("the pod's container");
            let seen = outbox_tests::oci::confinement_of(&id).expect("its process runs");
            assert_eq!((seen.uid, seen.gid), (oci::NON_ROOT, oci::NON_ROOT));
            assert_eq!(seen.effective_capabilities, "0000000000000000");
            assert!(seen.no_new_privileges && seen.read_only_root, "{seen:?}");
        }
    }
    let drained = outbox_tests::wait::holds(
        "the relays drained the table",
        Duration::from_secs(120),
        || async { db::pending(&mut db::connect().await, &table).await == 0 },
    )
    .await;
    assert!(drained, "the agent's relays did not drain the table");
    consumer.wait_for(5_000, Duration::from_secs(30)).await;
    assert_eq!(consumer.distinct(), 5_000);

    // A template change replaces every pod; the count stays.
    let first_pods = agent.running_pods(&key);
    deployments
        .patch(
            &name,
            &apply,
            &Patch::Apply(deployment_for(&namespace, &name, &table_name, 2, 250)),
        )
        .await
        .unwrap();
    let rolled = outbox_tests::wait::holds(
        "the template change replaced both pods",
        Duration::from_secs(60),
        || async {
            let pods = agent.running_pods(&key);
            let ready = agent.timeline().last().map(|s| s.ready);
            // Ready too: SIGTERM during start-up is a different path from the one tested below.
            pods.len() == 2 && pods.iter().all(|p| !first_pods.contains(p)) && ready == Some(2)
        },
    )
    .await;
    assert!(
        rolled,
        "pods after the template change: {:?}",
        agent.running_pods(&key)
    );

    // Scaling to zero sends SIGTERM: each relay finishes and says goodbye.
    let last_pods = agent.running_pods(&key);
    deployments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let stopped = outbox_tests::wait::holds(
        "the Deployment scaled to zero",
        Duration::from_secs(60),
        || async {
            let status = deployments
                .get(&name)
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            // The real controller leaves a zero out of the status.
            agent.running_pods(&key).is_empty() && status.replicas.unwrap_or(0) == 0
        },
    )
    .await;
    assert!(
        stopped,
        "relays still running: {:?}",
        agent.running_pods(&key)
    );
    for pod in &last_pods {
        let log_seen = outbox_tests::wait::holds(
            "each relay logged its goodbye",
            Duration::from_secs(30),
            || async {
                std::fs::read_to_string(process::log_path(pod)).is_ok_and(|log| log.contains("bye"))
            },
        )
        .await;
        assert!(log_seen, "{pod} did not shut down gracefully");
    }
    let samples = agent.timeline();
    assert!(samples.iter().any(|s| s.running == 2 && s.ready == 2));
    assert_eq!(samples.last().map(|s| s.running), Some(0));
    // The agent removed the deleted pods for good, as a agent ends a deletion.
    let gone = outbox_tests::wait::holds(
        "the deleted pods are gone",
        Duration::from_secs(30),
        || async {
            pods_api
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        },
    )
    .await;
    assert!(gone, "pods left after scaling to zero");
    assert!(deployments.get(&name).await.unwrap().name_any() == name);
    agent.shutdown().await;
    let _ = plane.kubectl_output(&["delete", "namespace", &namespace, "--wait=false"]);
    consumer.close().await;
}
