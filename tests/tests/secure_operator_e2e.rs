//! Production-style connections through the operator on the real control plane: the database
//! role may log in only over TLS with SCRAM (pg_hba `hostnossl … reject`), its password is in a
//! Secret of its own, the CA that signed PostgreSQL's certificate is in another Secret
//! (`verify-full`), and the relay logs in to RabbitMQ's AMQPS listener by a client certificate
//! from a `kubernetes.io/tls` Secret, trusting a CA from a ConfigMap. The OutboxRelay must reach
//! `Ready`, relay every row, show `Ready=False` with reason `DatabaseTLS` naming the Secret when
//! the CA Secret is replaced by a wrong CA, and recover when it is put back.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use lapin::ExchangeKind;
use outbox_operator::crd::OutboxRelaySpec;
use outbox_tests::cluster::{TestCluster, create_url_secret, relay_spec};
use outbox_tests::node_agent::NodeAgentConfig;
use outbox_tests::tls::{self, TlsRole};
use outbox_tests::{broker, db, unique};
use sqlx::PgConnection;

const ROWS: u64 = 2_000;
const PASSWORD: &str = "e2e-Pw/with:colon@tls";

fn file_text(name: &str) -> String {
    std::fs::read_to_string(tls::file(name)).unwrap()
}

/// A Secret (of `kind`, e.g. `kubernetes.io/tls`) holding `data`.
async fn put_secret(
    cluster: &TestCluster,
    name: &str,
    kind: Option<&str>,
    data: &[(&str, String)],
) {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: kind.map(str::to_string),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("the Secret {name} is created: {e}"));
}

/// Replaces the CA in the Secret `db-ca`, as a user fixing (or breaking) it would.
async fn set_database_ca(cluster: &TestCluster, pem: &str) {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let patch = serde_json::json!({"stringData": {"ca.crt": pem}});
    secrets
        .patch("db-ca", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the CA Secret is patched");
}

fn secure_spec(table: &str, exchange: &str) -> OutboxRelaySpec {
    let mut spec = serde_json::to_value(relay_spec(table, exchange)).unwrap();
    spec["database"]["urlSecretRef"]["name"] = "db-tls".into();
    spec["database"]["passwordSecretRef"] = serde_json::json!({"name": "db-password"});
    spec["database"]["tls"] = serde_json::json!({
        "mode": "verify-full",
        "ca": {"secretKeyRef": {"name": "db-ca"}},
    });
    spec["broker"]["urlSecretRef"]["name"] = "amqps".into();
    spec["broker"]["tls"] = serde_json::json!({
        "ca": {"configMapKeyRef": {"name": "rabbit-ca"}},
        "clientCertificateSecretRef": {"name": "relay-client"},
    });
    serde_json::from_value(spec).expect("the secure spec deserializes")
}

/// (sessions of `role` over TLS, all its sessions), from pg_stat_ssl.
async fn sessions_of(admin: &mut PgConnection, role: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid WHERE a.usename = $1",
    )
    .bind(role)
    .fetch_one(admin)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbox_relay_with_tls_secrets_relays_names_a_wrong_ca_and_recovers() {
    let role = TlsRole::create("e2etls", PASSWORD).await;
    let name = format!("{}.outbox", role.name);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 0).await;
    role.own(&mut admin, &name).await;
    let exchange = unique("e2e_tls_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;

    let cluster = TestCluster::start(NodeAgentConfig::default()).await;
    // No password and no TLS parameter in the URL: the spec's fields say them.
    let url = tls::url(&role.name, None, &[]);
    create_url_secret(&cluster.client, &cluster.namespace, "db-tls", &url).await;
    let amqps = "amqps://outbox_cert@127.0.0.1:5671/%2f?auth_mechanism=external";
    create_url_secret(&cluster.client, &cluster.namespace, "amqps", amqps).await;
    put_secret(
        &cluster,
        "db-password",
        None,
        &[("password", format!("{PASSWORD}\n"))],
    )
    .await;
    put_secret(&cluster, "db-ca", None, &[("ca.crt", file_text("ca.pem"))]).await;
    put_secret(
        &cluster,
        "relay-client",
        Some("kubernetes.io/tls"),
        &[
            ("tls.crt", file_text("client.pem")),
            ("tls.key", file_text("client.key")),
        ],
    )
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bundle = ConfigMap {
        metadata: ObjectMeta {
            name: Some("rabbit-ca".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "ca.crt".to_string(),
            file_text("ca.pem"),
        )])),
        ..Default::default()
    };
    config_maps
        .create(&PostParams::default(), &bundle)
        .await
        .unwrap();

    cluster
        .create_relay("secure", secure_spec(&name, &exchange))
        .await;
    // The operator migrated the table as this role, which pg_hba lets in only over TLS: its
    // own connection used the password Secret and the CA Secret.
    cluster.wait_for_ready("secure", "True", "").await;

    outbox_relay::tools::seed::copy_rows(&mut admin, &table, ROWS, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending: {}\n{}",
        db::pending(&mut admin, &table).await,
        cluster.operator.log_text()
    );
    let (encrypted, all) = sessions_of(&mut admin, &role.name).await;
    assert!(
        all > 0 && encrypted == all,
        "{encrypted} of {all} sessions use TLS"
    );
    assert!(consumer.wait_for(ROWS, Duration::from_secs(60)).await >= ROWS);

    // A wrong CA: the operator's verify-full connection fails, and says which Secret to fix.
    set_database_ca(&cluster, &file_text("other-ca.pem")).await;
    let (_, _, message) = cluster
        .wait_for_ready("secure", "False", "DatabaseTLS")
        .await;
    assert!(message.contains("Secret db-ca, key ca.crt"), "{message}");
    assert!(!message.contains(PASSWORD), "{message}");

    set_database_ca(&cluster, &file_text("ca.pem")).await;
    cluster.wait_for_ready("secure", "True", "").await;
    outbox_relay::tools::seed::copy_rows(&mut admin, &table, ROWS, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending after the CA came back: {}",
        db::pending(&mut admin, &table).await
    );
    // Every row once or more (a rolled pod may repeat a batch), none lost.
    assert!(consumer.wait_for(2 * ROWS, Duration::from_secs(60)).await >= 2 * ROWS);
    assert_eq!(consumer.distinct() as u64, 2 * ROWS);

    consumer.close().await;
    cluster.shutdown().await;
    role.drop_now().await;
}
