//! VacuumBlocked on the real control plane: the chart's operator, a relay pod run by the node
//! agent, and a session of the test that holds a REPEATABLE READ snapshot open. The pod reports
//! the holder; the OutboxRelay turns `Degraded=True` with reason `VacuumBlocked` naming it (and
//! stays Ready), `kubectl describe` shows it with a Warning event; when the transaction ends,
//! Degraded clears with a `VacuumUnblocked` event.
//!
//! The relay's table is in a database of the test's own: the horizon is per database.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::TableName;
use outbox_tests::cluster::{TestCluster, create_url_secret, relay_spec};
use outbox_tests::db::{self, PrivateDatabase};
use outbox_tests::{broker, unique, wait};

const RELAY: &str = "vacuum";
const SECRET: &str = "vacuum-db";

/// The condition `type_` as (status, reason, message).
fn condition(relay: &OutboxRelay, type_: &str) -> Option<(String, String, String)> {
    let conditions = &relay.status.as_ref()?.conditions;
    let found = conditions.iter().find(|c| c.type_ == type_)?;
    Some((
        found.status.clone(),
        found.reason.clone(),
        found.message.clone(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_snapshot_makes_the_relay_vacuum_blocked_until_it_ends() {
    let database = PrivateDatabase::create("e2e_vacuum").await;
    let table = OutboxTable::new(TableName::parse("outbox").unwrap());
    outbox_relay::tools::seed::create_table(&mut database.connect().await, &table)
        .await
        .unwrap();
    let exchange = unique("vacuum_x");
    let _consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    create_url_secret(&cluster.client, &cluster.namespace, SECRET, &database.url).await;

    let mut spec = relay_spec("outbox", &exchange);
    spec.database.url_secret_ref.name = SECRET.into();
    spec.database.vacuum_blocked_after = "4s".into();
    // Scaling mode: the operator looks at the reports every polling interval.
    spec.scaling = Some(
        serde_json::from_value(serde_json::json!({
            "minReplicas": 1, "maxReplicas": 1, "pollingInterval": "1s",
        }))
        .unwrap(),
    );
    cluster.create_relay(RELAY, spec).await;
    let relays = cluster.relays();
    let status_of = |type_: &'static str| {
        let relays = relays.clone();
        async move {
            let relay = relays.get(RELAY).await.ok()?;
            condition(&relay, type_)
        }
    };
    let ready = wait::until("the relay is Ready", Duration::from_secs(120), || async {
        status_of("Ready")
            .await
            .is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    if let Err(e) = ready {
        panic!(
            "{e}: {:?}\n{}",
            status_of("Ready").await,
            cluster.operator.log_text()
        );
    }

    let application = unique("report-job");
    let mut holder = database.connect().await;
    db::exec(
        &mut holder,
        &format!("SET application_name = '{application}'"),
    )
    .await;
    db::exec(&mut holder, "BEGIN ISOLATION LEVEL REPEATABLE READ").await;
    db::exec(&mut holder, "SELECT count(*) FROM outbox").await;
    let pid = db::scalar_i64(&mut holder, "SELECT pg_backend_pid()::bigint").await;

    let blocked = wait::for_value(
        "Degraded=True with reason VacuumBlocked",
        Duration::from_secs(60),
        || async {
            status_of("Degraded")
                .await
                .filter(|(status, reason, _)| status == "True" && reason == "VacuumBlocked")
        },
    )
    .await;
    let (_, _, message) = match blocked {
        Ok(found) => found,
        Err(e) => panic!("{e}: {:?}", status_of("Degraded").await),
    };
    assert!(
        message.contains(&format!("pid {pid} (application \"{application}\""))
            && message.contains("holds a snapshot"),
        "{message}"
    );
    let relay = relays.get(RELAY).await.unwrap();
    let health = relay.status.as_ref().and_then(|s| s.table_health.clone());
    let health = health.expect("status.tableHealth");
    assert!(
        health.vacuum_blocked && health.horizon_age_seconds >= 4.0,
        "{health:?}"
    );
    assert!(
        health.pending_index_bytes.is_some_and(|b| b > 0),
        "{health:?}"
    );
    let ready = condition(&relay, "Ready").unwrap();
    assert_eq!(ready.0, "True", "the relay still relays: {ready:?}");

    let events = cluster.events(RELAY).await;
    let warned = events
        .iter()
        .filter(|(reason, note)| reason == "VacuumBlocked" && note.contains(&application))
        .count();
    assert_eq!(warned, 1, "{events:#?}");
    let described = cluster
        .plane
        .kubectl_ok(&[
            "-n",
            &cluster.namespace,
            "describe",
            &format!("obr/{RELAY}"),
        ])
        .unwrap();
    for shown in [
        "VacuumBlocked",
        "Vacuum Blocked:",
        "Horizon Holder:",
        &application,
    ] {
        assert!(described.contains(shown), "no {shown:?} in:\n{described}");
    }

    db::exec(&mut holder, "ROLLBACK").await;
    let cleared = wait::until(
        "Degraded clears once the transaction ends",
        Duration::from_secs(60),
        || async {
            status_of("Degraded")
                .await
                .is_some_and(|(status, _, _)| status == "False")
        },
    )
    .await;
    if let Err(e) = cleared {
        panic!("{e}: {:?}", status_of("Degraded").await);
    }
    let announced = wait::until(
        "a VacuumUnblocked event",
        Duration::from_secs(20),
        || async {
            cluster
                .events(RELAY)
                .await
                .iter()
                .any(|(reason, _)| reason == "VacuumUnblocked")
        },
    )
    .await;
    assert!(announced.is_ok(), "{:#?}", cluster.events(RELAY).await);

    drop(holder);
    cluster.shutdown().await;
    database.drop_now().await;
}
