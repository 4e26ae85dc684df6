//! A cluster on one machine for end-to-end operator tests: the in-memory API server, the real
//! operator controller running against it, and the kubelet running real relay processes. The
//! relays talk to the real PostgreSQL and RabbitMQ.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use outbox_operator::controller::{Context, Settings, run_controller};
use outbox_operator::metrics::Metrics;
use outbox_operator::{OutboxRelay, OutboxRelaySpec};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::apiserver::ApiServer;
use crate::kubelet::{Kubelet, KubeletConfig};

/// Every test object lives in this namespace; each test has its own API server.
pub const NAMESPACE: &str = "e2e";
/// Secrets holding the connection URLs, as a user would create them.
pub const DATABASE_SECRET: &str = "outbox-db";
pub const BROKER_SECRET: &str = "outbox-amqp";

pub struct TestCluster {
    pub api: ApiServer,
    pub client: Client,
    pub kubelet: Kubelet,
    operator: JoinHandle<()>,
    stop_operator: oneshot::Sender<()>,
}

impl TestCluster {
    /// Starts the API server, creates the connection Secrets, then the kubelet and the
    /// operator (retries and backoffs short, as a test needs).
    pub async fn start(kubelet: KubeletConfig) -> Self {
        // RUST_LOG=outbox_operator=debug shows the operator's decisions in a failing test.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let api = ApiServer::start().await.expect("the API server binds");
        let client = api.client(NAMESPACE);
        create_connection_secrets(&client).await;
        let kubelet = Kubelet::start(client.clone(), NAMESPACE, kubelet).await;
        let settings = Settings {
            base_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            lock_busy_retry: Duration::from_millis(500),
            resync_after: Duration::from_secs(30),
            ..Settings::default()
        };
        let context = Arc::new(Context::new(
            client.clone(),
            Arc::new(Metrics::default()),
            settings,
        ));
        let (stop_operator, stopped) = oneshot::channel::<()>();
        let operator = tokio::spawn(run_controller(
            context,
            Some(NAMESPACE.to_string()),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            api,
            client,
            kubelet,
            operator,
            stop_operator,
        }
    }

    pub fn relays(&self) -> Api<OutboxRelay> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub async fn create_relay(&self, name: &str, spec: OutboxRelaySpec) -> OutboxRelay {
        self.relays()
            .create(&PostParams::default(), &OutboxRelay::new(name, spec))
            .await
            .expect("the OutboxRelay is created")
    }

    /// The relay's Deployment replicas, `None` before the operator created it.
    pub async fn deployment_replicas(&self, name: &str) -> Option<i32> {
        self.deployments()
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|d| d.spec.replicas)
    }

    /// `namespace/name` of the relay's Deployment, the kubelet's key.
    pub fn deployment_key(name: &str) -> String {
        format!("{NAMESPACE}/{name}")
    }

    /// Every `spec.replicas` the relay's Deployment had, with the kubelet-clock second it was
    /// written, consecutive repeats dropped: the exact scaling history.
    pub fn replicas_history(&self, name: &str) -> Vec<(f64, i32)> {
        let origin = self.kubelet.origin();
        let mut history: Vec<(f64, i32)> = Vec::new();
        for (at, deployment) in self.api.versions_of("deployments", NAMESPACE, name) {
            let Some(replicas) = deployment["spec"]["replicas"].as_i64() else {
                continue;
            };
            if history.last().map(|h| h.1) != Some(replicas as i32) {
                history.push(((at - origin).as_seconds_f64(), replicas as i32));
            }
        }
        history
    }

    /// Reasons and notes of the events about the relay, oldest first.
    pub async fn events(&self, relay: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NAMESPACE);
        let mut list = events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        list.sort_by_key(|e| {
            e.metadata
                .resource_version
                .as_ref()
                .and_then(|v| v.parse::<u64>().ok())
        });
        list.into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(relay))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Stops the operator first (so it does not react), then the relays with SIGTERM.
    pub async fn shutdown(self) {
        let _ = self.stop_operator.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.operator).await;
        self.kubelet.shutdown(Duration::from_secs(20)).await;
    }
}

/// The Secrets [`relay_spec`] refers to, holding the local PostgreSQL and RabbitMQ URLs.
pub async fn create_connection_secrets(client: &Client) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, url) in [
        (DATABASE_SECRET, crate::database_url()),
        (BROKER_SECRET, crate::amqp_url()),
    ] {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "url".to_string(),
                k8s_openapi::ByteString(url.into_bytes()),
            )])),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("the Secret is created");
    }
}

/// An OutboxRelay spec for `table`, publishing to `exchange`, with the intervals of a test:
/// fast polling, a report every second, and a short grace period.
pub fn relay_spec(table: &str, exchange: &str) -> OutboxRelaySpec {
    serde_json::from_value(json!({
        "database": {"urlSecretRef": {"name": DATABASE_SECRET}, "table": table},
        "broker": {"urlSecretRef": {"name": BROKER_SECRET}, "exchange": exchange},
        "relay": {
            "batchSize": 500,
            "workersPerPod": 2,
            "pollInterval": "100ms",
            "reportInterval": "1s",
            "terminationGracePeriodSeconds": 15,
            "logFormat": "text",
        },
    }))
    .expect("the test spec deserializes")
}
