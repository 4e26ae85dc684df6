//! Issue 44 on the real cluster: an OutboxRelay whose database Secret holds libpq's multi-host
//! URL of a primary and its synchronous standby, and whose broker Secret holds the list of the
//! three RabbitMQ nodes, relays through a PostgreSQL failover and through the loss of each
//! broker node in turn. While only the standby answers, its status says so
//! (`Ready=False`, `DatabaseReadOnly`, naming the standby) and an event records it; once the
//! standby is promoted it is Ready again. Every row reaches the quorum queue.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::cluster::{TestCluster, create_url_secret_as_is, relay_spec};
use outbox_tests::rabbit_cluster::{self, Lease, all_nodes_for_pods, declare_quorum, node_url};
use outbox_tests::standby::{Server, StandbyPair};
use outbox_tests::{broker, db, unique};
use sqlx::PgConnection;

const DATABASE_SECRET: &str = "failover-db";
const BROKER_SECRET: &str = "failover-amqp";
/// Rows inserted before the failover, after it, and while each broker node is down.
const ROWS: u64 = 3_000;

async fn insert(conn: &mut PgConnection, table: &outbox_relay::table::OutboxTable, rows: u64) {
    outbox_relay::tools::seed::copy_rows(conn, table, rows, 50, |_| {})
        .await
        .expect("insert rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbox_relay_follows_the_primary_and_the_broker_cluster() {
    let pair = StandbyPair::start().await;
    let name = unique("e2e_failover");
    let table = db::table(&name);
    let conn = db::seeded_table_in(&pair.primary_url(), &table, ROWS).await;
    let lease = Lease::take().await;
    declare_quorum(&name).await;

    let cluster = TestCluster::start().await;
    create_url_secret_as_is(
        &cluster.client,
        &cluster.namespace,
        DATABASE_SECRET,
        &pair.multi_host_url_for_pods(),
    )
    .await;
    create_url_secret_as_is(
        &cluster.client,
        &cluster.namespace,
        BROKER_SECRET,
        &all_nodes_for_pods(),
    )
    .await;
    let mut spec = relay_spec(&name, &name);
    spec.database.url_secret_ref.name = DATABASE_SECRET.into();
    spec.broker.url_secret_ref.name = BROKER_SECRET.into();
    cluster.create_relay("orders", spec).await;
    cluster.wait_for_ready("orders", "True", "").await;
    assert!(
        db::wait_until_drained_in(&pair.primary_url(), &table, Duration::from_secs(120)).await,
        "the relay did not drain the table on the primary"
    );

    // The primary dies; the standby is not promoted yet: the relay and the operator find only
    // a read-only server behind the multi-host URL, and say so.
    pair.kill_primary().await;
    let (_, _, message) = cluster
        .wait_for_ready("orders", "False", "DatabaseReadOnly")
        .await;
    let standby = pair.addr(Server::Standby).port().to_string();
    assert!(
        message.contains(&standby) && message.contains("standby"),
        "the status names the standby it found: {message}"
    );
    pair.promote().await;
    cluster.wait_for_ready("orders", "True", "").await;
    let events = cluster.events("orders").await;
    assert!(
        events
            .iter()
            .any(|(reason, _)| reason == "DatabaseReadOnly"),
        "an event records the wait for a primary: {events:?}"
    );
    let promoted = pair.url(Server::Standby);
    let mut conn_after = db::connect_to(&promoted).await;
    insert(&mut conn_after, &table, ROWS).await;
    assert!(
        db::wait_until_drained_in(&promoted, &table, Duration::from_secs(120)).await,
        "rows inserted on the promoted server are not relayed"
    );

    // Each broker node stopped in turn: whichever the relay's workers are on, one stop takes
    // it away, and the rows inserted while a node is down are relayed by the other two.
    for lost in 1..=3 {
        rabbit_cluster::node("stop", lost).await;
        insert(&mut conn_after, &table, ROWS).await;
        let drained = db::wait_until_drained_in(&promoted, &table, Duration::from_secs(120)).await;
        lease.bring_back().await;
        assert!(
            drained,
            "rows not relayed while broker node {lost} was down"
        );
        declare_quorum(&name).await;
    }
    let (status, _, message) = cluster.wait_for_ready("orders", "True", "").await;
    assert_eq!(status, "True", "{message}");

    // Every row at the broker (at least once; duplicates are what was in flight at a loss).
    let consumer = broker::consume_at(
        &node_url(1),
        &name,
        ExchangeKind::Fanout,
        "",
        rabbit_cluster::quorum(&[]),
    )
    .await;
    let ids = db::all_ids(&mut conn_after, &table).await;
    assert_eq!(ids.len() as u64, 5 * ROWS);
    let arrived = outbox_tests::wait::holds(
        "every row reached the quorum queue",
        Duration::from_secs(60),
        || async { ids.iter().all(|id| consumer.has(id)) },
    )
    .await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    eprintln!(
        "failover e2e: {} rows, {} duplicates",
        ids.len(),
        consumer.total().saturating_sub(ids.len() as u64)
    );
    assert!(arrived, "{missing} of {} rows lost", ids.len());
    consumer.close().await;
    drop(conn);
    cluster.shutdown().await;
    lease.restore().await;
}
