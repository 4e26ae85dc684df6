//! `broker.protocol: amqp10` on the real control plane: the chart's operator turns the
//! OutboxRelay into relay pods (run by the real node) that send over AMQP 1.0 to ActiveMQ
//! Artemis, and every row reaches an AMQP 1.0 consumer once. A second relay whose address
//! Artemis refuses turns `Ready=False` with the pods' reason, `AddressNotFound`, naming it, and
//! is Stalled: a person must create the address. A third, whose broker does not answer, turns
//! `Ready=False` with `BrokerUnreachable` and is Reconciling, not Stalled: an outage the pods
//! retry on their own.

use std::time::Duration;

use outbox_operator::crd::{BrokerProtocol, OutboxRelaySpec};
use outbox_tests::amqp10::{self, ARTEMIS_REFUSED_PREFIX, ARTEMIS_URL};
use outbox_tests::cluster::{TestCluster, create_url_secret, create_url_secret_as_is, relay_spec};
use outbox_tests::services::SERVICES_ADDRESS;
use outbox_tests::{db, unique, wait};

const ROWS: u64 = 3_000;
const BROKER_SECRET: &str = "artemis";

/// A spec relaying `table` over AMQP 1.0 to `address`, with the broker URL from the test's
/// own Secret.
fn amqp10_spec(table: &str, address: &str) -> OutboxRelaySpec {
    let mut spec = relay_spec(table, "");
    spec.broker.exchange = None;
    spec.broker.protocol = BrokerProtocol::Amqp10;
    spec.broker.address = Some(address.to_string());
    spec.broker.url_secret_ref.name = BROKER_SECRET.into();
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_amqp10_relay_delivers_through_the_operator_and_names_a_refused_address_and_an_outage() {
    let name = unique("e2e_amqp10");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = amqp10::consume(ARTEMIS_URL, &name).await;
    let cluster = TestCluster::start().await;
    create_url_secret(
        &cluster.client,
        &cluster.namespace,
        BROKER_SECRET,
        ARTEMIS_URL,
    )
    .await;

    cluster
        .create_relay("invoices", amqp10_spec(&name, &name))
        .await;
    cluster.wait_for_ready("invoices", "True", "").await;

    // What the operator gave the pod: the AMQP 1.0 flags, the URL in BROKER_URL, no exchange.
    let deployment = cluster.deployments().get("invoices").await.unwrap();
    let pod = deployment.spec.template.spec.unwrap();
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap_or_default();
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .map(|i| args[i + 1].clone())
    };
    assert_eq!(
        flag("--broker-protocol").as_deref(),
        Some("amqp10"),
        "{args:?}"
    );
    assert_eq!(
        flag("--address").as_deref(),
        Some(name.as_str()),
        "{args:?}"
    );
    assert_eq!(flag("--exchange"), None, "{args:?}");
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env.contains(&"BROKER_URL") && !env.contains(&"AMQP_URL"),
        "{env:?}"
    );

    outbox_relay::tools::seed::copy_rows(&mut conn, &table, ROWS, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending: {}",
        db::pending(&mut conn, &table).await
    );
    let arrived = wait::holds(
        "every row reached the AMQP 1.0 consumer",
        Duration::from_secs(60),
        || async { consumer.distinct() as u64 >= ROWS },
    )
    .await;
    assert!(arrived, "{} of {ROWS} arrived", consumer.distinct());
    assert_eq!(consumer.duplicates(), 0);
    consumer.stop().await;

    // An address Artemis will not create: the pods say so, and so does the OutboxRelay.
    let refused_table = unique("e2e_amqp10_refused");
    let refused = db::table(&refused_table);
    let mut refused_conn = db::seeded_table(&refused, 5).await;
    let address = format!("{ARTEMIS_REFUSED_PREFIX}{refused_table}");
    cluster
        .create_relay("refused", amqp10_spec(&refused_table, &address))
        .await;
    let (_, _, message) = cluster
        .wait_for_ready("refused", "False", "AddressNotFound")
        .await;
    assert!(message.contains(&address), "{message}");
    assert_eq!(db::pending(&mut refused_conn, &refused).await, 5);
    assert_eq!(
        condition(&cluster, "refused", "Stalled").await,
        Some(("True".into(), "AddressNotFound".into()))
    );

    // A broker that does not answer: a port on the pods' side that nothing listens on.
    let away_table = unique("e2e_amqp10_away");
    let away = db::table(&away_table);
    let mut away_conn = db::seeded_table(&away, 5).await;
    let closed_port = std::net::TcpListener::bind((SERVICES_ADDRESS, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port on the services address")
        .port();
    create_url_secret_as_is(
        &cluster.client,
        &cluster.namespace,
        "away",
        &format!("amqp://{SERVICES_ADDRESS}:{closed_port}"),
    )
    .await;
    let mut spec = amqp10_spec(&away_table, &away_table);
    spec.broker.url_secret_ref.name = "away".into();
    cluster.create_relay("away", spec).await;
    let (_, _, message) = cluster
        .wait_for_ready("away", "False", "BrokerUnreachable")
        .await;
    assert!(message.contains("cannot reach the broker"), "{message}");
    assert_eq!(
        condition(&cluster, "away", "Reconciling").await,
        Some(("True".into(), "BrokerUnreachable".into()))
    );
    assert_eq!(
        condition(&cluster, "away", "Stalled")
            .await
            .map(|(status, _)| status),
        Some("False".into())
    );
    assert_eq!(db::pending(&mut away_conn, &away).await, 5);

    cluster.shutdown().await;
}

/// The relay's condition `type_` as (status, reason), if it has one.
async fn condition(cluster: &TestCluster, relay: &str, type_: &str) -> Option<(String, String)> {
    let relay = cluster.relays().get(relay).await.ok()?;
    let found = relay
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((found.status, found.reason))
}
