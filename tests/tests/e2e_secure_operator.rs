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
use outbox_relay::table::OutboxTable;
use outbox_tests::cluster::{TestCluster, create_url_secret, relay_spec};
use outbox_tests::ports::{PGBOUNCER_PORT, RABBITMQ_TLS_PORT};
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

/// Inserts [`ROWS`] rows and waits until the relay has settled them all.
async fn insert_and_drain(cluster: &TestCluster, admin: &mut PgConnection, table: &OutboxTable) {
    outbox_relay::tools::seed::copy_rows(admin, table, ROWS, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(table, Duration::from_secs(120)).await,
        "rows still pending: {}\n{}",
        db::pending(admin, table).await,
        cluster.operator.log_text()
    );
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

    let cluster = TestCluster::start().await;
    // No password and no TLS parameter in the URL: the spec's fields say them.
    let url = tls::url(&role.name, None, &[]);
    create_url_secret(&cluster.client, &cluster.namespace, "db-tls", &url).await;
    let amqps =
        format!("amqps://outbox_cert@127.0.0.1:{RABBITMQ_TLS_PORT}/%2f?auth_mechanism=external");
    create_url_secret(&cluster.client, &cluster.namespace, "amqps", &amqps).await;
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

    insert_and_drain(&cluster, &mut admin, &table).await;
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
    insert_and_drain(&cluster, &mut admin, &table).await;
    // Every row once or more (a rolled pod may repeat a batch), none lost.
    assert!(consumer.wait_for(2 * ROWS, Duration::from_secs(60)).await >= 2 * ROWS);
    assert_eq!(consumer.distinct() as u64, 2 * ROWS);

    consumer.close().await;
    cluster.shutdown().await;
    role.drop_now().await;
}

/// Behind PgBouncer's transaction pool (with its session pool as the session URL), as
/// `database.poolMode: transaction` declares: the operator migrates through the session URL,
/// the pods relay through the transaction pool, every row arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbox_relay_behind_a_transaction_pool_relays_every_row() {
    let schema = unique("e2e_pool");
    let mut admin = db::connect().await;
    let create = format!("CREATE SCHEMA {schema} AUTHORIZATION outbox_scram");
    db::exec(&mut admin, &create).await;
    let name = format!("{schema}.outbox");
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 0).await;
    let adopt = format!("ALTER TABLE {} OWNER TO outbox_scram", table.name.quoted());
    db::exec(&mut admin, &adopt).await;
    let exchange = unique("e2e_pool_x");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;

    let cluster = TestCluster::start().await;
    let pool = |database: &str| {
        tls::url_on(
            "127.0.0.1",
            PGBOUNCER_PORT,
            database,
            "outbox_scram",
            None,
            &[],
        )
    };
    create_url_secret(
        &cluster.client,
        &cluster.namespace,
        "db-pool",
        &pool("transaction"),
    )
    .await;
    create_url_secret(
        &cluster.client,
        &cluster.namespace,
        "db-session",
        &pool("session"),
    )
    .await;
    let password = format!("{}\n", tls::SCRAM_PASSWORD);
    put_secret(&cluster, "db-password", None, &[("password", password)]).await;
    let mut spec = serde_json::to_value(relay_spec(&name, &exchange)).unwrap();
    spec["database"]["urlSecretRef"]["name"] = "db-pool".into();
    spec["database"]["poolMode"] = "transaction".into();
    spec["database"]["sessionUrlSecretRef"] = serde_json::json!({"name": "db-session"});
    spec["database"]["passwordSecretRef"] = serde_json::json!({"name": "db-password"});
    let spec: OutboxRelaySpec = serde_json::from_value(spec).unwrap();
    cluster.create_relay("pooled", spec).await;
    cluster.wait_for_ready("pooled", "True", "").await;
    let deployment = cluster.deployments().get("pooled").await.unwrap();
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    let args = container.args.clone().unwrap_or_default().join(" ");
    assert!(args.contains("--database-pool-mode transaction"), "{args}");
    let env: Vec<String> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    assert!(env.contains(&"SESSION_DATABASE_URL".to_string()), "{env:?}");

    insert_and_drain(&cluster, &mut admin, &table).await;
    assert!(consumer.wait_for(ROWS, Duration::from_secs(60)).await >= ROWS);
    assert_eq!(consumer.distinct() as u64, ROWS);

    consumer.close().await;
    cluster.shutdown().await;
    db::exec(&mut admin, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
