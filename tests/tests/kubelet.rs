//! The test kubelet on its own: a Deployment built by the operator's own builder, applied to
//! the in-memory API server, becomes real relay processes; scaling, template changes and
//! SIGTERM behave as the autoscaling tests assume.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_operator::deployment::{BuildSettings, build_deployment};
use outbox_operator::validation::validate;
use outbox_tests::apiserver::ApiServer;
use outbox_tests::cluster::{NAMESPACE, create_connection_secrets, relay_spec};
use outbox_tests::kubelet::{Kubelet, KubeletConfig};
use outbox_tests::{broker, db, process, unique};
use serde_json::json;

/// The relay's Deployment as the operator would apply it, with `batch_size` in its template.
fn deployment_for(name: &str, table: &str, replicas: i32, batch_size: i32) -> Deployment {
    let mut spec = relay_spec(table, table);
    spec.relay.batch_size = batch_size;
    let mut relay = OutboxRelay::new(name, spec);
    relay.metadata.namespace = Some(NAMESPACE.into());
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
    let table_name = unique("kubelet");
    let table = db::table(&table_name);
    db::seeded_table(&table, 5_000).await;
    migrate(&table_name).await;
    let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
    let name = table_name.replace('_', "-");
    let key = format!("{NAMESPACE}/{name}");

    let server = ApiServer::start().await.unwrap();
    let client = server.client(NAMESPACE);
    create_connection_secrets(&client).await;
    let kubelet = Kubelet::start(client.clone(), NAMESPACE, KubeletConfig::default()).await;
    let deployments: Api<Deployment> = Api::namespaced(client, NAMESPACE);
    let apply = PatchParams::apply("test").force();
    deployments
        .patch(
            &name,
            &apply,
            &Patch::Apply(deployment_for(&name, &table_name, 2, 500)),
        )
        .await
        .unwrap();

    let ready = process::eventually(Duration::from_secs(60), || async {
        let status = deployments
            .get(&name)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        kubelet.running_pods(&key).len() == 2
            && status.ready_replicas == Some(2)
            && status.observed_generation == Some(1)
    })
    .await;
    assert!(ready, "two ready pods: {:?}", kubelet.timeline());
    let drained = process::eventually(Duration::from_secs(120), || async {
        db::pending(&mut db::connect().await, &table).await == 0
    })
    .await;
    assert!(drained, "the kubelet's relays did not drain the table");
    consumer.wait_for(5_000, Duration::from_secs(30)).await;
    assert_eq!(consumer.distinct(), 5_000);

    // A template change replaces every pod; the count stays.
    let first_pods = kubelet.running_pods(&key);
    deployments
        .patch(
            &name,
            &apply,
            &Patch::Apply(deployment_for(&name, &table_name, 2, 250)),
        )
        .await
        .unwrap();
    let rolled = process::eventually(Duration::from_secs(60), || async {
        let pods = kubelet.running_pods(&key);
        let ready = kubelet.timeline().last().map(|s| s.ready);
        // Ready too: SIGTERM during start-up is a different path from the one tested below.
        pods.len() == 2 && pods.iter().all(|p| !first_pods.contains(p)) && ready == Some(2)
    })
    .await;
    assert!(
        rolled,
        "pods after the template change: {:?}",
        kubelet.running_pods(&key)
    );

    // Scaling to zero sends SIGTERM: each relay finishes and says goodbye.
    let last_pods = kubelet.running_pods(&key);
    deployments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let stopped = process::eventually(Duration::from_secs(60), || async {
        let status = deployments
            .get(&name)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        kubelet.running_pods(&key).is_empty() && status.replicas == Some(0)
    })
    .await;
    assert!(
        stopped,
        "relays still running: {:?}",
        kubelet.running_pods(&key)
    );
    for pod in &last_pods {
        let log_seen = process::eventually(Duration::from_secs(30), || async {
            std::fs::read_to_string(process::log_path(pod)).is_ok_and(|log| log.contains("bye"))
        })
        .await;
        assert!(log_seen, "{pod} did not shut down gracefully");
    }
    let samples = kubelet.timeline();
    assert!(samples.iter().any(|s| s.spec_replicas == 2 && s.ready == 2));
    assert_eq!(
        samples.last().map(|s| (s.spec_replicas, s.running)),
        Some((0, 0))
    );
    assert!(deployments.get(&name).await.unwrap().name_any() == name);
    kubelet.shutdown(Duration::from_secs(10)).await;
    consumer.close().await;
}
