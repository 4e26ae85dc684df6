//! Issue 44, AMQP 1.0: a relay whose broker list names an ActiveMQ Artemis primary/backup pair
//! on a shared store (`outbox_tests::artemis_pair`, a pair of each test's own) follows
//! the pair through a failover: the primary SIGKILLed, or stopped gracefully (the pair is made
//! with failover-on-shutdown). The backup does not listen until it takes over, so the relay's
//! list moves it from node 1/2 to node 2/2.
//!
//! Rows are inserted before and throughout the run. Counted at the broker: a consumer attaches
//! to the backup once it is live and must find every row, those the primary took before it
//! went (the shared journal) and those sent since; nothing pending, nothing refused or
//! dead-lettered (`--max-attempts 1`: a lost broker counted as the message's fault would
//! dead-letter at once), duplicates at most what was in flight. The longest gap is measured
//! between batches settling (no consumer can watch both members throughout).

use std::time::{Duration, Instant};

use outbox_tests::artemis_pair::{ArtemisPair, Member};
use outbox_tests::db::{attempts_table, refused_rows};
use outbox_tests::load::SteadyLoad;
use outbox_tests::{amqp10, db, http, metrics, process, unique, wait};

const BATCH: u64 = 200;
const WORKERS: u64 = 2;
/// Rows in the table before the relay starts; the steady load adds a few hundred a second.
const SEEDED: u64 = 3_000;

#[derive(Debug, Clone, Copy)]
enum Loss {
    Kill,
    Stop,
}

async fn relay_follows_the_failover(loss: Loss) {
    let what = match loss {
        Loss::Kill => "primary kill -9",
        Loss::Stop => "primary stopped",
    };
    let setup = Instant::now();
    let pair = ArtemisPair::start().await;
    eprintln!("{what}: the pair started in {:?}", setup.elapsed());
    assert!(
        !pair.listening(Member::Backup).await,
        "{what}: the backup listens before its primary is gone:\n{}",
        pair.log(Member::Backup)
    );
    let name = unique(if matches!(loss, Loss::Kill) {
        "apkill"
    } else {
        "apstop"
    });
    let (table, mut conn) = attempts_table(&name, SEEDED).await;
    let urls = pair.broker_list();
    let args = process::run_args_without_exchange(
        &name,
        &[
            "--broker-protocol",
            "amqp10",
            "--broker-url",
            &urls,
            "--address",
            &name,
            "--batch-size",
            "200",
            "--workers",
            "2",
            "--attempts-column",
            "attempts",
            "--max-attempts",
            "1",
            "--publish-timeout",
            "5s",
        ],
    );
    let mut relay = process::spawn_relay(&name, &args);
    let load = SteadyLoad::start(&table, 25, Duration::from_millis(50));
    // The seeded rows and some of the load's go through the primary.
    let relaying = wait::holds(
        "relaying through the primary",
        Duration::from_secs(90),
        || async {
            db::processed_ids(&mut db::connect().await, &table)
                .await
                .len()
                >= 4_000
        },
    )
    .await;
    assert!(relaying, "{what}:\n{}", relay.log_text());
    let primary = format!(
        "connected to broker node 1/2 127.0.0.1:{}",
        pair.primary_port
    );
    assert!(relay.log_text().contains(&primary), "{}", relay.log_text());

    // Settled (accepted by the primary) before it goes: the backup must have them all.
    let settled_by_primary = db::processed_ids(&mut conn, &table).await;
    let lost = Instant::now();
    match loss {
        Loss::Kill => pair.kill(Member::Primary).await,
        Loss::Stop => pair.stop(Member::Primary).await,
    }
    let stopped = lost.elapsed();
    let taken_over = pair
        .await_listening(Member::Backup, lost, Duration::from_secs(120))
        .await;
    let backup = format!(
        "connected to broker node 2/2 127.0.0.1:{}",
        pair.backup_port
    );
    let moved = wait::holds(
        "the relay is on the backup",
        Duration::from_secs(60),
        || async { relay.log_text().contains(&backup) },
    )
    .await;
    let moved_after = lost.elapsed();
    assert!(moved, "{what}:\n{}", relay.log_text());
    // Rows that exist only after the failover: relayed through the backup, or not at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let inserted = SEEDED + load.stop().await;
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(180)).await,
        "{what}: rows still pending:\n{}",
        relay.log_text()
    );
    let text = http::get(&relay.metrics_addr().await, "/metrics").await.1;
    let series = format!(
        "outbox_relay_broker_node_connections{{node=\"127.0.0.1:{}\"}}",
        pair.backup_port
    );
    assert!(
        metrics::value(&text, &series).is_some_and(|v| v > 0.0),
        "{what}: no worker on the backup:\n{text}"
    );
    assert!(
        metrics::value(&text, "outbox_relay_broker_node_moves_total").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(
        refused_rows(&mut conn, &table).await,
        0,
        "{what}: rows refused"
    );
    let gap = db::longest_settling_gap(&mut conn, &table).await;

    // Counted at the broker: every row on the backup, those the primary took included.
    let ids = db::all_ids(&mut conn, &table).await;
    assert_eq!(ids.len() as u64, inserted);
    let consumer = amqp10::consume(&pair.url(Member::Backup), &name).await;
    let arrived = wait::holds(
        "every row is on the backup",
        Duration::from_secs(60),
        || async { ids.iter().all(|id| consumer.has(id)) },
    )
    .await;
    // Late duplicates have their chance to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    let missing_from_primary = settled_by_primary
        .iter()
        .filter(|id| !consumer.has(id))
        .count();
    assert!(
        arrived && missing == 0,
        "{what}: {missing} of {} rows missing at the backup, {missing_from_primary} of them \
         settled through the primary",
        ids.len()
    );
    let duplicates = consumer.total() - ids.len() as u64;
    eprintln!(
        "{what}: {} rows ({} settled through the primary), {duplicates} duplicates; primary \
         gone after {stopped:?}, backup listening after {taken_over:?}, relay on it after \
         {moved_after:?}; longest gap between settled batches {gap:?}",
        ids.len(),
        settled_by_primary.len()
    );
    assert_eq!(consumer.received.lock().unwrap().foreign, 0);
    assert!(
        duplicates <= BATCH * WORKERS,
        "{what}: {duplicates} duplicates, more than the {} in flight",
        BATCH * WORKERS
    );
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_follows_an_artemis_failover_when_the_primary_is_killed() {
    relay_follows_the_failover(Loss::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_follows_an_artemis_failover_when_the_primary_stops() {
    relay_follows_the_failover(Loss::Stop).await;
}
