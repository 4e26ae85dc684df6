//! Two releases on one table, as during a rolling update: a relay of the previous release
//! (built from its recorded commit, `scripts/previous-release.sh`) and one of this build relay
//! the same table at once while a producer inserts rows, each is killed with SIGKILL and
//! started again, and this build's operator code reads the lag reports of both. Every row
//! reaches the broker, none stays pending, and both stop cleanly at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_operator::OutboxRelaySpec;
use outbox_operator::reconcile::database::postgres::PostgresDatabase;
use outbox_operator::reconcile::database::{LagObservation, LagQuery, RelayDatabase};
use outbox_operator::reconcile::input::validate::{RelayPlan, validate};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::DatabaseTarget;
use outbox_relay::table::reports::read_reports;
use outbox_tests::previous_release::PreviousRelease;
use outbox_tests::process::{self, RelayProcess};
use outbox_tests::{broker, db, unique, wait};

/// Rows a relay may send twice after a SIGKILL: at most the batches in flight (between the
/// broker's confirm and the commit), `--batch-size` × `--workers`.
const BATCH: u64 = 200;
const WORKERS: u64 = 2;
/// Rows inserted at once before each kill, so the kill lands among batches in flight.
const BURST: u64 = 20_000;

struct Side {
    label: &'static str,
    program: std::path::PathBuf,
    pod: String,
}

impl Side {
    fn spawn(&self, table: &str, relay: &str, run: u32) -> RelayProcess {
        let batch = BATCH.to_string();
        let workers = WORKERS.to_string();
        let extra = [
            "--batch-size",
            &batch,
            "--workers",
            &workers,
            "--relay-name",
            relay,
            "--pod-name",
            &self.pod,
        ];
        let args = process::run_args(table, table, &extra);
        process::spawn_relay_program(
            &self.program,
            &format!("{table}-{}-{run}", self.label),
            &args,
            &[],
        )
    }
}

fn plan_for(table: &str) -> RelayPlan {
    let spec: OutboxRelaySpec = serde_json::from_value(serde_json::json!({
        "database": {"urlSecretRef": {"name": "db"}, "table": table},
        "broker": {"urlSecretRef": {"name": "amqp"}},
    }))
    .unwrap();
    validate(&spec).unwrap()
}

/// What this build's operator reads from the table's reports, as its reconcile does.
async fn observe(plan: &RelayPlan, relay: &str) -> LagObservation {
    let url = SecretUrl::parse(&outbox_tests::database_url(), UrlKind::Postgres).unwrap();
    let query = LagQuery {
        relay_name: relay.to_owned(),
        running: 2,
        stale_after: Duration::from_secs(30),
    };
    PostgresDatabase::default()
        .observe_lag(&DatabaseTarget::from_url(url), plan, query)
        .await
        .expect("the operator observes the lag")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_of_the_previous_release_and_one_of_this_build_share_a_table_through_kills() {
    let previous = tokio::task::spawn_blocking(PreviousRelease::get)
        .await
        .unwrap()
        .expect("the previous release's binaries");
    let name = unique("mixed");
    let relay = format!("upgrade/{name}");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 5_000).await;
    let inserted = Arc::new(AtomicU64::new(5_000));
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let plan = plan_for(&name);
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;

    // The two versions, told apart by their pod names in the reports.
    let old = Side {
        label: "old",
        program: previous.relay.clone(),
        pod: format!("relay-{}", previous.version),
    };
    let new = Side {
        label: "new",
        program: process::binary("outbox-relay"),
        pod: format!("relay-{}", env!("CARGO_PKG_VERSION")),
    };
    assert_ne!(old.pod, new.pod, "the previous release is another version");
    for (side, version) in [
        (&old, previous.version.as_str()),
        (&new, env!("CARGO_PKG_VERSION")),
    ] {
        let said = std::process::Command::new(&side.program)
            .arg("--version")
            .output()
            .expect("run outbox-relay --version");
        assert_eq!(
            String::from_utf8_lossy(&said.stdout).trim(),
            format!("outbox-relay {version}"),
            "the {} relay",
            side.label
        );
    }
    let mut old_relay = old.spawn(&name, &relay, 1);
    let mut new_relay = new.spawn(&name, &relay, 1);

    // A producer inserting rows the whole time, as an application would.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (table, inserted, stop) = (table.clone(), inserted.clone(), stop.clone());
        async move {
            let mut conn = db::connect().await;
            while !stop.load(Ordering::Relaxed) {
                outbox_relay::tools::seed::copy_rows(&mut conn, &table, 100, 50, |_| {})
                    .await
                    .expect("the producer inserts");
                inserted.fetch_add(100, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    // Both versions relay the table at once, and this build's operator reads both reports.
    let reports = table.reports_table();
    let both_published = wait::holds("both versions published", Duration::from_secs(60), || {
        let (reports, relay) = (reports.clone(), relay.clone());
        let pods = [old.pod.clone(), new.pod.clone()];
        async move {
            let seen = read_reports(&mut db::connect().await, &reports, &relay, 30.0)
                .await
                .unwrap();
            pods.iter()
                .all(|pod| seen.iter().any(|r| &r.pod == pod && r.published_total > 0))
        }
    })
    .await;
    assert!(
        both_published,
        "both relays should publish from the table:\n{}\n{}",
        old_relay.log_text(),
        new_relay.log_text()
    );
    let lag = observe(&plan, &relay).await;
    assert_eq!(lag.reporting_pods, 2, "{lag:?}");
    assert!(!lag.measured_by_operator, "{lag:?}");
    assert!(lag.backlog.is_some(), "one of them measures: {lag:?}");
    assert!(lag.publish_rate > 0.0, "{lag:?}");

    // A SIGKILL of each in turn, in the middle of a burst of rows (batches in flight), the
    // other relaying alone meanwhile; then a restart, which relays again beside the other.
    for (side, process) in [(&old, &mut old_relay), (&new, &mut new_relay)] {
        let before = consumer.total();
        outbox_relay::tools::seed::copy_rows(&mut conn, &table, BURST, 50, |_| {})
            .await
            .unwrap();
        inserted.fetch_add(BURST, Ordering::Relaxed);
        consumer
            .wait_for(before + BURST / 10, Duration::from_secs(60))
            .await;
        process.kill9().await;
        let killed_at = consumer.total();
        let got = consumer
            .wait_for(killed_at + BURST / 4, Duration::from_secs(60))
            .await;
        assert!(
            got >= killed_at + BURST / 4,
            "the other relay goes on after {} is killed: {got} of {}",
            side.label,
            killed_at + BURST / 4
        );
        let restarted_at = db::scalar_i64(
            &mut conn,
            "SELECT (extract(epoch FROM now()) * 1000)::bigint",
        )
        .await;
        *process = side.spawn(&name, &relay, 2);
        let relays_again = wait::holds(
            &format!("the restarted {} relay publishes", side.label),
            Duration::from_secs(60),
            || {
                let (reports, relay, pod) = (reports.clone(), relay.clone(), side.pod.clone());
                async move {
                    read_reports(&mut db::connect().await, &reports, &relay, 30.0)
                        .await
                        .unwrap()
                        .iter()
                        .any(|r| {
                            r.pod == pod
                                && r.reported_at.timestamp_millis() > restarted_at
                                && r.published_total > 0
                        })
                }
            },
        )
        .await;
        assert!(relays_again, "{}", process.log_text());
    }

    // The producer stops; everything it inserted reaches the broker and nothing stays pending.
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let rows = inserted.load(Ordering::Relaxed);
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(
        drained,
        "{} rows still pending:\n{}\n{}",
        db::pending(&mut conn, &table).await,
        old_relay.log_text(),
        new_relay.log_text()
    );
    let ids = db::all_ids(&mut conn, &table).await;
    assert_eq!(ids.len() as u64, rows, "rows the producer inserted");
    let arrived = wait::holds("every row arrived", Duration::from_secs(60), || {
        let all = ids.iter().all(|id| consumer.has(id));
        async move { all }
    })
    .await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    assert!(arrived, "{missing} of {rows} rows never reached the broker");
    let failed = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM {} WHERE error IS NOT NULL",
            table.name.quoted()
        ),
    )
    .await;
    assert_eq!(failed, 0, "rows marked with an error");
    let duplicates: u64 = consumer
        .duplicates()
        .iter()
        .map(|(_, n)| u64::from(n - 1))
        .sum();
    assert!(
        duplicates <= 2 * BATCH * WORKERS,
        "{duplicates} duplicates: more than the batches in flight at the two kills"
    );

    // The restarted pair reports again, and the operator sees the empty backlog from them.
    let settled = wait::holds(
        "the operator reads an empty backlog from both",
        Duration::from_secs(30),
        || {
            let (plan, relay) = (plan.clone(), relay.clone());
            async move {
                let lag = observe(&plan, &relay).await;
                lag.reporting_pods == 2 && lag.backlog == Some(0)
            }
        },
    )
    .await;
    assert!(settled, "{:?}", observe(&plan, &relay).await);

    // Both stop cleanly on SIGTERM, as a rolling update stops them.
    for (side, process) in [(&old, &mut old_relay), (&new, &mut new_relay)] {
        let code = process.terminate(Duration::from_secs(30)).await;
        assert_eq!(
            code,
            Some(0),
            "{} on SIGTERM:\n{}",
            side.label,
            process.log_text()
        );
    }
    println!(
        "mixed versions {} and {}: {rows} rows, {duplicates} duplicates",
        previous.version,
        env!("CARGO_PKG_VERSION")
    );
    consumer.close().await;
}
