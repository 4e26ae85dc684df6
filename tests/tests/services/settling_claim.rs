//! The settling claim of mark mode (the claim marks what it claims, and the batch puts back what
//! the broker did not confirm before COMMIT), on the real PostgreSQL and RabbitMQ: what a
//! committed batch leaves in the table is exactly what the two-pass batch left.

use std::time::Duration;

use lapin::options::ExchangeDeleteOptions;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::broker::amqp::{AmqpPublisher, AmqpSettings};
use outbox_relay::broker::routing::RoutingKey;
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::metrics::Metrics;
use outbox_relay::protocol::batch::{BatchReport, BatchSettings, ClaimFrom, run_batch};
use outbox_relay::protocol::claim::ClaimStart;
use outbox_relay::table::ident::Ident;
use outbox_relay::table::inspect::inspect;
use outbox_relay::table::sql::Statements;
use outbox_relay::table::{DeliveryMode, OutboxTable};
use outbox_tests::{broker, db, unique};
use sqlx::{AssertSqlSafe, PgConnection};

/// A mark-mode table with an attempts column and no rows.
async fn empty_table(name: &str) -> (PgConnection, OutboxTable, Statements) {
    let mut table = db::table(name);
    table.columns.attempts = Some(Ident::new("attempts").unwrap());
    let mut conn = db::seeded_table(&table, 0).await;
    let shape = inspect(&mut conn, &table).await.expect("inspect");
    let statements = Statements::for_shape(&table, &shape);
    assert!(
        statements.settling.is_some(),
        "mark mode must claim with the settling claim, or this test checks nothing new"
    );
    assert_eq!(table.mode, DeliveryMode::Mark);
    (conn, table, statements)
}

/// Inserts `n` rows of `kind` that already carry an error and attempts, one millisecond apart.
async fn insert(conn: &mut PgConnection, table: &OutboxTable, kind: &str, n: i32, attempts: i32) {
    let t = table.name.quoted();
    db::exec(
        conn,
        &format!(
            "INSERT INTO {t} (id, type, content, occurred_on_utc, error, attempts)
             SELECT gen_random_uuid(), '{kind}', jsonb_build_object('n', g),
                    now() + g * interval '1 ms', 'earlier failure', {attempts}
               FROM generate_series(1, {n}) g"
        ),
    )
    .await;
}

async fn publisher(exchange: &str, mandatory: bool) -> AmqpPublisher {
    let url = SecretUrl::parse(&outbox_tests::amqp_url(), UrlKind::Amqp).unwrap();
    AmqpPublisher::connect(
        &url,
        AmqpSettings {
            exchange: exchange.to_string(),
            dead_letter_exchange: None,
            confirms: true,
            mandatory,
            timeout: Duration::from_secs(10),
            heartbeat: outbox_relay::defaults::BROKER_HEARTBEAT,
            content_type: "application/json".into(),
            connection_name: format!("settling-claim test {exchange}"),
            declare_exchange: None,
            tls: Default::default(),
            password_file: None,
            cloudevents: None,
        },
    )
    .await
    .expect("connect to RabbitMQ")
}

async fn one_batch(
    conn: &mut PgConnection,
    publisher: &mut AmqpPublisher,
    statements: &Statements,
    max_attempts: i32,
) -> BatchReport {
    batch_of(conn, publisher, statements, max_attempts, 100).await
}

async fn batch_of(
    conn: &mut PgConnection,
    publisher: &mut AmqpPublisher,
    statements: &Statements,
    max_attempts: i32,
    batch_size: usize,
) -> BatchReport {
    let settings = BatchSettings {
        batch_size,
        routing_key: RoutingKey::Type,
        max_attempts,
        has_attempts_column: true,
        dead_letter_exchange: false,
        publish_slots: None,
        publish_notices: Default::default(),
        commit_timeout: outbox_relay::defaults::COMMIT_TIMEOUT,
        spans: None,
    };
    run_batch(
        conn,
        publisher,
        statements,
        &settings,
        &Metrics::default(),
        ClaimFrom::Start(ClaimStart::Head),
        None,
    )
    .await
    .expect("the batch commits")
}

/// Rows of `kind` as (pending, error, attempts), one entry per distinct combination.
async fn states(
    conn: &mut PgConnection,
    table: &OutboxTable,
    kind: &str,
) -> Vec<(bool, Option<String>, i32, i64)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT processed_on_utc IS NULL, error, attempts, count(*) FROM {} WHERE type = $1 \
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        table.name.quoted()
    )))
    .bind(kind)
    .fetch_all(conn)
    .await
    .expect("row states")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_broker_never_confirmed_leaves_every_row_as_it_was() {
    let name = unique("settle_lost");
    let (mut conn, table, statements) = empty_table(&name).await;
    insert(&mut conn, &table, "lost", 30, 1).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut publisher = publisher(&name, false).await;
    // The exchange goes away after the publisher checked it: the broker closes the channel at
    // the first publish, so no message of the batch is confirmed.
    let admin = Connection::connect(&outbox_tests::amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    admin
        .create_channel()
        .await
        .unwrap()
        .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();

    let report = one_batch(&mut conn, &mut publisher, &statements, 5).await;
    assert_eq!(report.claimed, 30);
    assert_eq!(report.published, 0);
    assert_eq!(report.untouched, 30, "{report:?}");
    assert!(report.broker_broken.is_some(), "{report:?}");
    // Pending, with the error it had and no attempt spent: an outage is not a message failure.
    assert_eq!(
        states(&mut conn, &table, "lost").await,
        vec![(true, Some("earlier failure".into()), 1, 30)]
    );
    consumer.close().await;
    let _ = admin.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rows_go_back_or_are_dead_lettered_and_confirmed_rows_stay_settled() {
    let name = unique("settle_mixed");
    let (mut conn, table, statements) = empty_table(&name).await;
    insert(&mut conn, &table, "good", 20, 1).await;
    insert(&mut conn, &table, "retry", 5, 0).await;
    insert(&mut conn, &table, "give_up", 3, 1).await;
    // Only "good" is bound; mandatory publishes of the others come back unroutable.
    let consumer = broker::consume(&name, ExchangeKind::Direct, "good").await;
    let mut publisher = publisher(&name, true).await;

    let report = one_batch(&mut conn, &mut publisher, &statements, 2).await;
    assert_eq!(
        (
            report.claimed,
            report.published,
            report.retried,
            report.dead_lettered
        ),
        (28, 20, 5, 3),
        "{report:?}"
    );
    assert_eq!(consumer.wait_for(20, Duration::from_secs(10)).await, 20);
    // Confirmed: settled, the earlier error cleared, attempts as they were.
    assert_eq!(
        states(&mut conn, &table, "good").await,
        vec![(false, None, 1, 20)]
    );
    let retry = states(&mut conn, &table, "retry").await;
    assert_eq!(retry.len(), 1, "{retry:?}");
    let (pending, error, attempts, count) = &retry[0];
    assert!(*pending && *attempts == 1 && *count == 5, "{retry:?}");
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.starts_with("attempt 1/2: returned by the broker as unroutable")),
        "{retry:?}"
    );
    let given_up = states(&mut conn, &table, "give_up").await;
    assert_eq!(given_up.len(), 1, "{given_up:?}");
    let (pending, error, attempts, count) = &given_up[0];
    assert!(!*pending && *attempts == 2 && *count == 3, "{given_up:?}");
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.starts_with("dead-lettered after 2 attempt(s)")),
        "{given_up:?}"
    );

    // The next batch claims only the rows put back.
    let again = one_batch(&mut conn, &mut publisher, &statements, 2).await;
    assert_eq!((again.claimed, again.dead_lettered), (5, 5), "{again:?}");
    assert_eq!(db::pending(&mut conn, &table).await, 0);
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_settles_only_the_rows_it_claimed() {
    // Two fresh partitions hold rows at the same ctids: a claim that found its rows by ctid on
    // the parent would settle rows of both.
    let name = unique("settle_parts");
    let table = db::table(&name);
    let t = table.name.quoted();
    let mut conn = db::connect().await;
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {t} (id uuid NOT NULL, type varchar(255) NOT NULL, content jsonb,
                occurred_on_utc timestamptz NOT NULL, processed_on_utc timestamptz, error text,
                PRIMARY KEY (id, occurred_on_utc)) PARTITION BY RANGE (occurred_on_utc);
             CREATE TABLE \"{name}_old\" PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ('2026-01-01');
             CREATE TABLE \"{name}_new\" PARTITION OF {t} FOR VALUES FROM ('2026-01-01') TO (MAXVALUE);
             INSERT INTO {t} (id, type, content, occurred_on_utc)
             SELECT gen_random_uuid(), 'part', '{{}}', d + g * interval '1 s'
               FROM generate_series(1, 10) g, (VALUES (timestamptz '2025-06-01'), (timestamptz '2026-06-01')) AS p(d);"
        ),
    )
    .await;
    let shape = inspect(&mut conn, &table).await.expect("inspect");
    assert!(!shape.single_heap);
    let statements = Statements::for_shape(&table, &shape);
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut publisher = publisher(&name, false).await;

    let report = batch_of(&mut conn, &mut publisher, &statements, 5, 5).await;
    assert_eq!((report.claimed, report.published), (5, 5), "{report:?}");
    assert_eq!(db::pending(&mut conn, &table).await, 15);
    let settled_old = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM \"{name}_old\" WHERE processed_on_utc IS NOT NULL"),
    )
    .await;
    assert_eq!(settled_old, 5);
    consumer.close().await;
}
