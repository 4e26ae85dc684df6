//! The autoscaling loop end to end on one machine: the in-memory API server, the real operator
//! controller, a kubelet running real `outbox-relay` processes, the real PostgreSQL and
//! RabbitMQ. Intervals are short so a scenario takes a minute or two; assertions are about
//! what happens and in which order, with generous timeouts for a loaded machine.

use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_relay::table::OutboxTable;
use outbox_tests::cluster::{TestCluster, relay_spec};
use outbox_tests::kubelet::KubeletConfig;
use outbox_tests::{broker, db, process, unique};
use serde_json::json;

/// One scenario's table, exchange (same name) and consumer, plus the cluster.
struct Scenario {
    cluster: TestCluster,
    /// Table and exchange name (underscores).
    table_name: String,
    /// OutboxRelay and Deployment name (a DNS label).
    relay: String,
    table: OutboxTable,
    consumer: broker::Consumer,
}

impl Scenario {
    async fn start(prefix: &str, rows: u64, kubelet: KubeletConfig) -> Self {
        let table_name = unique(&format!("e2e_{prefix}"));
        let table = db::table(&table_name);
        db::seeded_table(&table, rows).await;
        // The exchange must exist before a relay publishes to it.
        let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
        let cluster = TestCluster::start(kubelet).await;
        Self {
            cluster,
            relay: table_name.replace('_', "-"),
            table_name,
            table,
            consumer,
        }
    }

    fn deployment_key(&self) -> String {
        TestCluster::deployment_key(&self.relay)
    }

    fn running(&self) -> usize {
        self.cluster
            .kubelet
            .running_pods(&self.deployment_key())
            .len()
    }

    async fn relay(&self) -> OutboxRelay {
        self.cluster
            .relays()
            .get(&self.relay)
            .await
            .expect("the relay exists")
    }

    async fn pending(&self) -> i64 {
        db::pending(&mut db::connect().await, &self.table).await
    }

    /// Waits until the table has no pending row and the consumer saw every id.
    async fn assert_drained_and_delivered(&self, timeout: Duration) {
        let drained = process::eventually(timeout, || async { self.pending().await == 0 }).await;
        assert!(drained, "{} rows still pending", self.pending().await);
        let ids = db::all_ids(&mut db::connect().await, &self.table).await;
        let arrived = process::eventually(Duration::from_secs(60), || async {
            self.consumer.distinct() >= ids.len()
        })
        .await;
        let missing = ids.iter().filter(|id| !self.consumer.has(id)).count();
        assert!(
            arrived && missing == 0,
            "{missing} of {} ids never reached the consumer",
            ids.len()
        );
    }

    async fn finish(self) {
        self.cluster.shutdown().await;
        self.consumer.close().await;
    }
}

/// Polls `check` until it holds, failing with `what` after `timeout`.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(
        process::eventually(timeout, check).await,
        "timed out after {timeout:?} waiting until {what}"
    );
}

fn condition(relay: &OutboxRelay, kind: &str) -> Option<(String, String)> {
    relay
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_mode_runs_spec_replicas_relays_and_drains_the_table() {
    let started = Instant::now();
    let scenario = Scenario::start("manual", 20_000, KubeletConfig::default()).await;
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    spec.replicas = 2;
    scenario.cluster.create_relay(&scenario.relay, spec).await;

    wait_until(
        "two relay processes run",
        Duration::from_secs(60),
        || async { scenario.running() == 2 },
    )
    .await;
    wait_until(
        "the status shows two ready replicas",
        Duration::from_secs(60),
        || async {
            let status = scenario.relay().await.status.unwrap_or_default();
            status.replicas == Some(2) && status.ready_replicas == Some(2)
        },
    )
    .await;
    scenario
        .assert_drained_and_delivered(Duration::from_secs(180))
        .await;
    let relay = scenario.relay().await;
    assert_eq!(
        condition(&relay, "Ready").map(|c| c.0).as_deref(),
        Some("True"),
        "{:?}",
        relay.status
    );

    // kubectl scale obr/NAME --replicas=1, as a merge patch of spec.replicas.
    scenario
        .cluster
        .relays()
        .patch(
            &scenario.relay,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    wait_until(
        "one relay process is left",
        Duration::from_secs(60),
        || async { scenario.running() == 1 },
    )
    .await;
    wait_until(
        "the status shows one replica of the new generation",
        Duration::from_secs(60),
        || async {
            let relay = scenario.relay().await;
            let status = relay.status.clone().unwrap_or_default();
            status.replicas == Some(1) && status.observed_generation == relay.metadata.generation
        },
    )
    .await;
    let reasons: Vec<String> = scenario
        .cluster
        .events(&scenario.relay)
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "DeploymentCreated"),
        "events: {reasons:?}"
    );
    scenario.finish().await;
    eprintln!("manual mode took {:?}", started.elapsed());
}
