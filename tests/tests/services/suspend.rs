//! A running relay suspended with SIGUSR1 and resumed with SIGUSR2, under a steady load: once
//! the batches in flight are settled nothing reaches the broker, while the lag reporter keeps
//! measuring the growing backlog and `/readyz` stays ready; after SIGUSR2 every row arrives,
//! each once. SIGTERM while suspended still exits 0.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::http::get as http_get;
use outbox_tests::load::SteadyLoad;
use outbox_tests::process::RelayProcess;
use outbox_tests::{broker, db, metrics, process, unique, wait};

/// How long the test watches a suspended relay deliver nothing.
const QUIET: Duration = Duration::from_secs(4);

async fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics").await;
    metrics::value(&body, series)
}

async fn wait_for_metric(relay: &RelayProcess, addr: &str, series: &str, want: f64) {
    let reached = wait::holds(
        &format!("{series} = {want}"),
        Duration::from_secs(20),
        || async { metric(addr, series).await == Some(want) },
    )
    .await;
    assert!(reached, "{series} never {want}:\n{}", relay.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_suspends_delivery_under_load_and_sigusr2_resumes_it() {
    let name = unique("suspend");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let relay = process::spawn_relay(
        &name,
        &process::run_args(&name, &name, &["--workers", "2", "--batch-size", "100"]),
    );
    let addr = relay.metrics_addr().await;

    // A steady load: 100 rows every 50 ms until told to stop.
    let load = SteadyLoad::start(&table, 100, Duration::from_millis(50));
    assert!(
        consumer.wait_for(500, Duration::from_secs(30)).await >= 500,
        "the relay does not deliver under load:\n{}",
        relay.log_text()
    );

    relay.signal(libc::SIGUSR1);
    wait_for_metric(&relay, &addr, "outbox_relay_suspended", 1.0).await;
    // The batches in hand settle; a confirmed message may still be on its way to the consumer.
    wait_for_metric(&relay, &addr, "outbox_relay_workers_busy", 0.0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = consumer.total();
    let backlog_before = metric(&addr, "outbox_relay_backlog").await.unwrap_or(0.0);
    let inserted_before = load.inserted();
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        consumer.total(),
        delivered,
        "delivered while suspended:\n{}",
        relay.log_text()
    );
    assert!(
        load.inserted() >= inserted_before + 1_000,
        "the load stopped: the test proves nothing"
    );
    // The reporter still measures: the backlog grows with the inserts.
    let grew = wait::holds(
        "the backlog gauge grows while suspended",
        Duration::from_secs(10),
        || async {
            metric(&addr, "outbox_relay_backlog")
                .await
                .is_some_and(|now| now >= backlog_before + 1_000.0)
        },
    )
    .await;
    assert!(
        grew,
        "backlog stayed at {backlog_before}:\n{}",
        relay.log_text()
    );
    // A suspended relay is healthy: ready, and it says why it delivers nothing.
    let (code, body) = http_get(&addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("delivery: suspended"), "{body}");
    let log = relay.log_text();
    assert_eq!(
        log.matches("delivery suspended (SIGUSR1)").count(),
        1,
        "{log}"
    );

    relay.signal(libc::SIGUSR2);
    wait_for_metric(&relay, &addr, "outbox_relay_suspended", 0.0).await;
    assert!(
        consumer
            .wait_for(delivered + 100, Duration::from_secs(30))
            .await
            > delivered,
        "nothing delivered after SIGUSR2:\n{}",
        relay.log_text()
    );
    let total = load.stop().await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "rows still pending after SIGUSR2:\n{}",
        relay.log_text()
    );
    assert!(relay.log_text().contains("delivery resumed (SIGUSR2)"));
    let (_, body) = http_get(&addr, "/readyz").await;
    assert!(body.contains("delivery: running"), "{body}");

    // SIGTERM while suspended: the idle workers stop at once, exit 0.
    let mut relay = relay;
    relay.signal(libc::SIGUSR1);
    wait_for_metric(&relay, &addr, "outbox_relay_suspended", 1.0).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.assert_each_id_once(&mut conn, &table, total).await;
    consumer.close().await;
}
