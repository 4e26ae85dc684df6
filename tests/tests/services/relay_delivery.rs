//! The relay moves every row exactly once in normal operation, whatever the table looks like.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::ident::Ident;
use outbox_tests::{broker, db, process, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_rows_four_workers_each_id_once() {
    let name = unique("deliv");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 100_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;

    let mut relay =
        process::spawn_relay(&name, &process::run_args(&name, &name, &["--workers", "4"]));
    let drained = db::wait_until_drained(&table, Duration::from_secs(180)).await;
    assert!(
        drained,
        "rows still pending; relay log:\n{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut conn, &table, 100_000)
        .await;
    assert_eq!(db::processed_ids(&mut conn, &table).await.len(), 100_000);
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relay_processes_never_publish_an_id_twice() {
    let name = unique("two");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 30_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;

    let args = process::run_args(&name, &name, &["--workers", "2", "--batch-size", "200"]);
    let mut first = process::spawn_relay(&format!("{name}-a"), &args);
    let mut second = process::spawn_relay(&format!("{name}-b"), &args);
    assert_eq!(
        consumer.wait_for(30_000, Duration::from_secs(120)).await,
        30_000
    );
    assert_eq!(first.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(second.terminate(Duration::from_secs(30)).await, Some(0));
    // Give a stray duplicate time to show up before judging.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.total(), 30_000, "an id was published twice");
    assert!(consumer.duplicates().is_empty());
    assert_eq!(db::pending(&mut conn, &table).await, 0);
    // Both processes did part of the work (SKIP LOCKED shares the table).
    for relay in [&first, &second] {
        assert!(
            relay.log_text().contains("relaying"),
            "{}",
            relay.log_text()
        );
    }
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mode_custom_columns_and_schema_qualified_table() {
    let schema = unique("sch");
    let name = format!("{schema}.events");
    let mut table = db::table(&name);
    table.mode = DeliveryMode::Delete;
    let c = &mut table.columns;
    c.id = Ident::new("event_id").unwrap();
    c.kind = Ident::new("event_type").unwrap();
    c.payload = Ident::new("body").unwrap();
    c.occurred_at = Ident::new("created_at").unwrap();
    c.processed_at = Ident::new("sent_at").unwrap();
    c.error = Ident::new("last_error").unwrap();
    c.routing_key = Some(Ident::new("rk").unwrap());
    let mut conn = db::seeded_table(&table, 2_000).await;
    // Half the rows carry their own routing key; the queue binds only that key, so the other
    // half (routed by type) must not arrive, proving the column is used.
    db::exec(
        &mut conn,
        &format!("UPDATE {} SET rk = 'chosen' WHERE event_id IN (SELECT event_id FROM {} ORDER BY created_at LIMIT 1000)", table.name.quoted(), table.name.quoted()),
    )
    .await;
    let exchange = unique("direct");
    let consumer = broker::consume(&exchange, ExchangeKind::Direct, "chosen").await;

    let args = vec![
        "run",
        "--table",
        &name,
        "--exchange",
        &exchange,
        "--mode",
        "delete",
        "--id-column",
        "event_id",
        "--type-column",
        "event_type",
        "--payload-column",
        "body",
        "--occurred-at-column",
        "created_at",
        "--processed-at-column",
        "sent_at",
        "--error-column",
        "last_error",
        "--routing-key-column",
        "rk",
        "--metrics-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "50ms",
    ];
    let mut relay = process::spawn_relay(&schema, &args);
    let emptied = outbox_tests::wait::holds("the table is empty", Duration::from_secs(60), || {
        let t = table.clone();
        async move {
            db::scalar_i64(
                &mut db::connect().await,
                &format!("SELECT count(*) FROM {}", t.name.quoted()),
            )
            .await
                == 0
        }
    })
    .await;
    assert!(
        emptied,
        "delete mode left rows behind:\n{}",
        relay.log_text()
    );
    assert_eq!(
        consumer.wait_for(1_000, Duration::from_secs(30)).await,
        1_000
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(
        consumer.total(),
        1_000,
        "only the rows with routing key 'chosen' reach the queue"
    );
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_the_amqp_properties_of_their_row() {
    let name = unique("props");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay(&name, &process::run_args(&name, &name, &[]));
    assert_eq!(consumer.wait_for(10, Duration::from_secs(30)).await, 10);
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    let ids = db::all_ids(&mut conn, &table).await;
    let received = consumer.received.lock().unwrap();
    for id in ids {
        assert_eq!(
            received.types.get(&id).map(String::as_str),
            Some(outbox_relay::tools::seed::ARTICLE_TYPE)
        );
    }
}

/// With `migrate --notify` and `--listen`, an idle relay wakes on the trigger's NOTIFY: a row
/// inserted after the table went empty arrives long before the two-minute poll would find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_relay_wakes_on_the_notify_trigger_not_the_poll() {
    let name = unique("listen");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 1).await;
    let (code, out, err) = process::migrate_with_notify(&name).await;
    assert_eq!(code, 0, "{out}{err}");
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let args = [
        "run",
        "--table",
        &name,
        "--exchange",
        &name,
        "--metrics-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "120s",
        "--listen",
        "true",
    ];
    let mut relay = process::spawn_relay(&name, &args);
    // The first row is found by the first claim; then the table is empty and the workers idle.
    assert_eq!(consumer.wait_for(1, Duration::from_secs(30)).await, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 1, 50, |_| {})
        .await
        .expect("insert one more row");
    let woken = consumer.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(woken, 2, "no wake-up; relay log:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
}
