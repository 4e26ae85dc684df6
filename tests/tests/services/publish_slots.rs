//! `--inflight-batches`: workers that share publish slots never have more batches at the real
//! broker than there are slots, and every row is still relayed once — in the batch protocol
//! and in a running relay process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::broker::amqp::{AmqpPublisher, AmqpSettings};
use outbox_relay::broker::routing::{ExchangeType, RoutingKey};
use outbox_relay::broker::{BatchOutcome, Message, Publisher, Target};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::metrics::Metrics;
use outbox_relay::protocol::batch::{BatchSettings, ClaimFrom, run_batch};
use outbox_relay::protocol::claim::ClaimStart;
use outbox_relay::table::sql::Statements;
use outbox_tests::{broker, db, http, process, proxy, unique};
use tokio::sync::{Barrier, Semaphore};

const ROWS: u64 = 400;
const BATCH: usize = 50;

/// The real publisher, counting how many batches are at the broker at once. The pause keeps a
/// batch there long enough that two unrestricted workers surely overlap.
struct Counting {
    inner: AmqpPublisher,
    at_broker: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Publisher for Counting {
    async fn publish_batch(&mut self, target: Target, messages: &[Message<'_>]) -> BatchOutcome {
        let now = self.at_broker.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let outcome = self.inner.publish_batch(target, messages).await;
        self.at_broker.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }

    fn opened_at(&self) -> std::time::Instant {
        self.inner.opened_at()
    }
}

async fn connect_publisher(exchange: String) -> AmqpPublisher {
    let url = SecretUrl::parse(&outbox_tests::amqp_url(), UrlKind::Amqp).unwrap();
    AmqpPublisher::connect(
        &url,
        AmqpSettings {
            exchange,
            dead_letter_exchange: None,
            confirms: true,
            mandatory: false,
            timeout: Duration::from_secs(10),
            heartbeat: outbox_relay::defaults::BROKER_HEARTBEAT,
            content_type: "application/json".into(),
            connection_name: "publish-slots test".into(),
            declare_exchange: Some(ExchangeType::Fanout),
            tls: Default::default(),
            password_file: None,
            cloudevents: None,
        },
    )
    .await
    .expect("connect to RabbitMQ")
}

fn settings(publish_slots: Option<Arc<Semaphore>>) -> BatchSettings {
    BatchSettings {
        batch_size: BATCH,
        routing_key: RoutingKey::Type,
        max_attempts: 5,
        has_attempts_column: false,
        dead_letter_exchange: false,
        publish_slots,
        publish_notices: Default::default(),
        commit_timeout: outbox_relay::defaults::COMMIT_TIMEOUT,
        spans: None,
    }
}

/// Relays a fresh table with two workers; returns the most batches seen at the broker at once.
async fn most_batches_at_the_broker(slots: Option<usize>) -> usize {
    let name = unique("slots");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let statements = Arc::new(Statements::new(
        &table,
        outbox_relay::table::inspect::PayloadKind::Json,
    ));
    let settings = Arc::new(settings(slots.map(|n| Arc::new(Semaphore::new(n)))));
    let at_broker = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(2));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (statements, settings) = (statements.clone(), settings.clone());
            let (at_broker, most, start) = (at_broker.clone(), most.clone(), start.clone());
            let exchange = name.clone();
            tokio::spawn(async move {
                let mut conn = db::connect().await;
                let mut publisher = Counting {
                    inner: connect_publisher(exchange).await,
                    at_broker,
                    most,
                };
                let metrics = Metrics::default();
                start.wait().await;
                loop {
                    let report = run_batch(
                        &mut conn,
                        &mut publisher,
                        &statements,
                        &settings,
                        &metrics,
                        ClaimFrom::Start(ClaimStart::Head),
                        None,
                    )
                    .await
                    .expect("batch");
                    if report.claimed == 0 {
                        break;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(db::pending(&mut conn, &table).await, 0, "every row relayed");
    assert_eq!(
        consumer.wait_for(ROWS, Duration::from_secs(10)).await,
        ROWS,
        "every row reached the queue"
    );
    assert!(consumer.duplicates().is_empty());
    consumer.close().await;
    most.load(Ordering::SeqCst)
}

#[tokio::test]
async fn one_slot_keeps_one_batch_at_the_broker() {
    assert_eq!(most_batches_at_the_broker(Some(1)).await, 1);
}

#[tokio::test]
async fn without_slots_both_workers_publish_at_once() {
    assert_eq!(most_batches_at_the_broker(None).await, 2);
}

/// A batch whose rows are all malformed sends nothing to the broker, so it settles its dead
/// letters without waiting for a slot another worker holds.
#[tokio::test]
async fn a_batch_of_malformed_rows_takes_no_slot() {
    let name = unique("slots_bad");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 5).await;
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {} SET {} = NULL",
            table.name.quoted(),
            table.columns.payload.quoted()
        ),
    )
    .await;
    let statements = Statements::new(&table, outbox_relay::table::inspect::PayloadKind::Json);
    let slots = Arc::new(Semaphore::new(1));
    let _held_by_another_worker = slots.clone().acquire_owned().await.unwrap();
    let most = Arc::new(AtomicUsize::new(0));
    let mut publisher = Counting {
        inner: connect_publisher(name.clone()).await,
        at_broker: Arc::new(AtomicUsize::new(0)),
        most: most.clone(),
    };
    let mut worker_conn = db::connect().await;
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        run_batch(
            &mut worker_conn,
            &mut publisher,
            &statements,
            &settings(Some(slots)),
            &Metrics::default(),
            ClaimFrom::Start(ClaimStart::Head),
            None,
        ),
    )
    .await
    .expect("the batch waited for a publish slot it does not need")
    .expect("batch");
    assert_eq!((report.claimed, report.dead_lettered), (5, 5));
    assert_eq!(most.load(Ordering::SeqCst), 0, "nothing went to the broker");
    assert_eq!(db::pending(&mut conn, &table).await, 0);
}

/// Rows and batch size of the process-level test.
const PROCESS_ROWS: u64 = 400;
const PROCESS_BATCH: u64 = 50;

/// Starts a relay process with `workers` workers and the `extra` flags, talking to RabbitMQ
/// through a proxy, holds back the broker's replies once every worker is connected, and
/// inserts rows. Returns how many messages reached the queue while no confirm could come back:
/// the batches the relay put at the broker at once, times the batch size. Then lets the
/// confirms through and checks that every row is relayed once.
async fn messages_at_the_broker_without_confirms(workers: &str, extra: &[&str]) -> u64 {
    let name = unique("slots_proc");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let (amqp_url, switch) = proxy::start_for_url(&outbox_tests::amqp_url())
        .await
        .expect("start the proxy");
    let (table_name, batch) = (table.name.to_string(), PROCESS_BATCH.to_string());
    let mut flags = vec![
        "--workers",
        workers,
        "--batch-size",
        &batch,
        "--amqp-url",
        &amqp_url,
    ];
    flags.extend_from_slice(extra);
    let mut relay = process::spawn_relay(&name, &process::run_args(&table_name, &name, &flags));

    // The gauge counts connected workers: all of them must be up before the replies stop.
    let connected = format!("outbox_relay_broker_connected {workers}");
    let all_connected =
        outbox_tests::wait::holds("every worker is connected", Duration::from_secs(20), || {
            let (log, connected) = (relay.log_text(), connected.clone());
            async move {
                match http::metrics_addr(&log) {
                    Some(addr) => http::get(&addr, "/metrics").await.1.contains(&connected),
                    None => false,
                }
            }
        })
        .await;
    assert!(
        all_connected,
        "workers did not connect:\n{}",
        relay.log_text()
    );

    switch.stall_replies();
    // One COPY, so every row is visible at once and each worker claims a full batch.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, PROCESS_ROWS, 50, |_| {})
        .await
        .expect("insert rows");
    // Every worker claims within a poll interval; what no slot lets out never arrives.
    let at_broker = consumer
        .wait_for(PROCESS_ROWS, Duration::from_secs(3))
        .await;

    switch.resume();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "rows left pending:\n{}",
        relay.log_text()
    );
    assert_eq!(
        consumer
            .wait_for(PROCESS_ROWS, Duration::from_secs(10))
            .await,
        PROCESS_ROWS
    );
    assert!(consumer.duplicates().is_empty());
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    consumer.close().await;
    at_broker
}

#[tokio::test]
async fn a_running_relay_keeps_at_most_its_inflight_batches_at_the_broker() {
    let (by_default, with_two_slots) = tokio::join!(
        messages_at_the_broker_without_confirms("2", &[]),
        messages_at_the_broker_without_confirms("3", &["--inflight-batches", "2"]),
    );
    assert_eq!(
        by_default, PROCESS_BATCH,
        "by default one batch is at the broker while the other worker waits"
    );
    assert_eq!(
        with_two_slots,
        2 * PROCESS_BATCH,
        "--inflight-batches 2: two of the three workers' batches are at the broker"
    );
}
