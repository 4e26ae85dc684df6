//! Deleting an OutboxRelay on the real control plane, with the chart's operator: the operator
//! puts its finalizer on the relay; `cleanupPolicy: delete` removes what the migration created
//! (index, NOTIFY trigger, the relay's report rows, autovacuum settings) and releases the
//! table's claim, and the outbox rows stay; with the database unreachable the deletion still
//! completes, after the operator's cleanup bound (`--cleanup-timeout`, 20 s for the tests),
//! with Warning events saying why and what was left.
//!
//! Each test has its own namespace, and the first its own database.

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use lapin::ExchangeKind;
use outbox_operator::crd::CleanupPolicy;
use outbox_operator::reconcile::cleanup::FINALIZER;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::TableName;
use outbox_tests::cluster::{TestCluster, create_url_secret, relay_spec};
use outbox_tests::db::{self, PrivateDatabase};
use outbox_tests::{broker, unique, wait};

const RELAY: &str = "cleanup";

/// Waits until the relay is gone from the API server; panics with the operator's log.
async fn wait_until_gone(cluster: &TestCluster, within: Duration) -> Duration {
    let relays = cluster.relays();
    let started = Instant::now();
    let gone = wait::until("the OutboxRelay is gone", within, || async {
        matches!(relays.get_opt(RELAY).await, Ok(None))
    })
    .await;
    if let Err(e) = gone {
        let relay = relays.get_opt(RELAY).await.ok().flatten();
        panic!(
            "{e}: finalizers {:?}, events {:#?}\n{}",
            relay.map(|r| r.metadata.finalizers),
            cluster.events(RELAY).await,
            cluster.operator.log_text()
        );
    }
    started.elapsed()
}

/// Waits until the operator has put its finalizer on the relay.
async fn wait_for_finalizer(cluster: &TestCluster) {
    let relays = cluster.relays();
    let added = wait::until(
        "the operator adds its finalizer",
        Duration::from_secs(60),
        || async {
            relays.get(RELAY).await.is_ok_and(|relay| {
                relay
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == FINALIZER)
            })
        },
    )
    .await;
    assert!(added.is_ok(), "{}", cluster.operator.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_with_cleanup_policy_delete_removes_the_migration_and_keeps_the_rows() {
    let database = PrivateDatabase::create("e2e_cleanup").await;
    let table = OutboxTable::new(TableName::parse("outbox").unwrap());
    let mut conn = database.connect().await;
    outbox_relay::tools::seed::create_table(&mut conn, &table)
        .await
        .unwrap();
    db::exec(
        &mut conn,
        "INSERT INTO outbox (id, type, content, occurred_on_utc) \
         SELECT gen_random_uuid(), 'order.placed', '{}', now() FROM generate_series(1, 5)",
    )
    .await;
    let exchange = unique("cleanup_x");
    let _consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    create_url_secret(
        &cluster.client,
        &cluster.namespace,
        "cleanup-db",
        &database.url,
    )
    .await;
    let mut spec = relay_spec("outbox", &exchange);
    spec.database.url_secret_ref.name = "cleanup-db".into();
    spec.database.notify_trigger = true;
    spec.database.cleanup_policy = CleanupPolicy::Delete;
    cluster.create_relay(RELAY, spec).await;
    cluster.wait_for_ready(RELAY, "True", "").await;
    wait_for_finalizer(&cluster).await;
    let report_name = cluster.report_name(RELAY);
    let count = |sql: String| {
        let url = database.url.clone();
        async move {
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                .await
                .unwrap();
            db::scalar_i64(&mut conn, &sql).await
        }
    };
    let report_rows =
        format!("SELECT count(*) FROM outbox_relay_reports WHERE relay = '{report_name}'");
    let reported = wait::until("the relay pod reports", Duration::from_secs(60), || {
        let sql = report_rows.clone();
        let count = &count;
        async move { count(sql).await > 0 }
    })
    .await;
    assert!(reported.is_ok(), "no report row of {report_name}");
    let migrated = [
        "SELECT (to_regclass('outbox_pending_idx') IS NOT NULL)::int::bigint",
        "SELECT (to_regclass('outbox_claim_frontier') IS NOT NULL)::int::bigint",
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_outbox_notify'",
        "SELECT count(*) FROM outbox_relay_claims",
        "SELECT count(*) FROM pg_class, unnest(reloptions) o \
         WHERE oid = 'outbox'::regclass AND o LIKE 'autovacuum%'",
    ];
    for sql in migrated {
        assert!(
            count(sql.to_string()).await > 0,
            "before the deletion: {sql}"
        );
    }

    cluster
        .relays()
        .delete(RELAY, &DeleteParams::default())
        .await
        .unwrap();
    // The relay pods stop first (their grace period is 15 s), then the database is cleaned.
    wait_until_gone(&cluster, Duration::from_secs(120)).await;

    let mut left = Vec::new();
    for sql in migrated.iter().map(|s| s.to_string()).chain([
        report_rows.clone(),
        "SELECT count(*) FROM pg_proc WHERE proname = 'outbox_outbox_notify'".to_string(),
    ]) {
        let found = count(sql.clone()).await;
        if found != 0 {
            left.push(format!("{sql} = {found}"));
        }
    }
    assert!(left.is_empty(), "left after the deletion: {left:#?}");
    assert_eq!(
        count("SELECT count(*) FROM outbox".into()).await,
        5,
        "the rows stay"
    );
    let events = cluster.events(RELAY).await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "DatabaseCleanedUp"
                && note.contains("dropped index outbox_pending_idx")),
        "{events:#?}"
    );

    drop(conn);
    cluster.shutdown().await;
    database.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_database_delays_the_deletion_only_until_the_bound() {
    let cluster = TestCluster::start().await;
    // Nothing listens on port 1: every connection is refused at once. The password is a
    // canary: no event may show it.
    let canary = "Canary-Pw-7f3a9";
    let url = format!("postgres://app:{canary}@127.0.0.1:1/orders");
    create_url_secret(&cluster.client, &cluster.namespace, "closed-db", &url).await;
    let mut spec = relay_spec("outbox", &unique("closed_x"));
    spec.database.url_secret_ref.name = "closed-db".into();
    spec.database.cleanup_policy = CleanupPolicy::Delete;
    cluster.create_relay(RELAY, spec).await;
    wait_for_finalizer(&cluster).await;
    cluster
        .wait_for_ready(RELAY, "False", "DatabaseUnreachable")
        .await;

    cluster
        .relays()
        .delete(RELAY, &DeleteParams::default())
        .await
        .unwrap();
    // The operator runs with --cleanup-timeout 20s: it retries for that long, then lets go.
    let took = wait_until_gone(&cluster, Duration::from_secs(90)).await;
    assert!(
        took >= Duration::from_secs(10),
        "gone after {took:?}: the cleanup did not wait for the database at all"
    );

    let events = cluster.events(RELAY).await;
    assert!(
        events.iter().all(|(_, note)| !note.contains(canary)),
        "an event shows the password: {events:#?}"
    );
    let failed = events
        .iter()
        .filter(|(reason, _)| reason == "CleanupFailed")
        .count();
    assert!(failed >= 1, "{events:#?}");
    let abandoned: Vec<&String> = events
        .iter()
        .filter(|(reason, _)| reason == "CleanupAbandoned")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(abandoned.len(), 1, "{events:#?}");
    for shown in [
        "cannot connect to the database",
        "outbox_relay_claims",
        "outbox_pending_idx",
    ] {
        assert!(
            abandoned[0].contains(shown),
            "{shown:?} not in {}",
            abandoned[0]
        );
    }

    cluster.shutdown().await;
}
