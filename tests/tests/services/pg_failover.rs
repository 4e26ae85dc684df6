//! PostgreSQL failover on a real primary and synchronous standby (issue 44), each scenario on a
//! pair of its own (`outbox_tests::standby`), counted at the broker: every id arrives at least
//! once, nothing is left pending on the surviving primary, nothing is dead-lettered, and the
//! duplicates stay within what was in flight. Each prints its figures: duplicates, the longest
//! gap in delivery and its time.

use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use outbox_relay::table::OutboxTable;
use outbox_tests::broker::Consumer;
use outbox_tests::standby::{Server, StandbyPair, Stop};
use outbox_tests::{broker, db, http, metrics, process, proxy, unique, wait};

const BATCH: u64 = 200;
const WORKERS: u64 = 2;
/// The most a fault can send twice: one batch per worker (claimed, confirmed, not committed).
const IN_FLIGHT: u64 = BATCH * WORKERS;

const WAITING_GAUGE: &str = "outbox_relay_database_waiting_for_primary";
const REFUSALS: &str = "outbox_relay_database_standby_refusals_total";

/// `run` arguments for a relay on `name` (table and exchange) reaching PostgreSQL at `url`,
/// with [`BATCH`] and [`WORKERS`].
fn relay_args<'a>(name: &'a str, url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--database-url",
        url,
        "--batch-size",
        "200",
        "--workers",
        "2",
    ];
    args.extend_from_slice(extra);
    process::run_args(name, name, &args)
}

/// One scenario: a fresh pair with `rows` rows in a table of the test's own, and a consumer
/// of the exchange of the same name.
struct Scenario {
    started: Instant,
    pair: StandbyPair,
    name: String,
    table: OutboxTable,
    consumer: Consumer,
    rows: u64,
}

impl Scenario {
    async fn start(prefix: &str, rows: u64) -> Self {
        let started = Instant::now();
        let pair = StandbyPair::start().await;
        let name = unique(prefix);
        let table = db::table(&name);
        db::seeded_table_in(&pair.primary_url(), &table, rows).await;
        let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
        Self {
            started,
            pair,
            name,
            table,
            consumer,
            rows,
        }
    }

    /// Waits for the table on the primary at `survivor` to drain and the broker to have every
    /// row, stops the relay (SIGTERM, exit 0), then checks what the broker saw, prints the
    /// figures, and closes the consumer.
    async fn assert_all_delivered(
        self,
        what: &str,
        relay: &mut process::RelayProcess,
        survivor: &str,
        max_duplicates: u64,
    ) {
        let (table, consumer, rows) = (&self.table, &self.consumer, self.rows);
        wait_until_drained(what, relay, survivor, table).await;
        consumer.wait_for(rows, Duration::from_secs(30)).await;
        assert_eq!(
            relay.terminate(Duration::from_secs(30)).await,
            Some(0),
            "{what}:\n{}",
            log_tail(relay)
        );
        // A late duplicate has its chance to show.
        tokio::time::sleep(Duration::from_millis(300)).await;

        let mut conn = db::connect_to(survivor).await;
        let ids = db::all_ids(&mut conn, table).await;
        assert_eq!(ids.len() as u64, rows, "{what}: rows in the table");
        let missing = ids.iter().filter(|id| !consumer.has(id)).count();
        assert_eq!(missing, 0, "{what}: ids that never reached the broker");
        let dead_lettered = db::scalar_i64(
            &mut conn,
            &format!(
                "SELECT count(*) FROM {} WHERE {} IS NOT NULL",
                table.name.quoted(),
                table.columns.error.quoted()
            ),
        )
        .await;
        assert_eq!(dead_lettered, 0, "{what}: rows marked with an error");
        let duplicates = consumer.total() - consumer.distinct() as u64;
        let (gap, gap_at) = consumer.longest_gap();
        println!(
            "{what}: {rows} rows delivered, {duplicates} duplicates (at most {max_duplicates}), \
             longest gap in delivery {gap:.2?} ({gap_at:.2?} after the first), {:.1?} in all",
            self.started.elapsed()
        );
        assert!(
            duplicates <= max_duplicates,
            "{what}: {duplicates} duplicates, more than the {max_duplicates} in flight"
        );
        self.consumer.close().await;
    }
}

/// The last lines of a relay's log, for a failure message (a relay looping on a standby
/// writes thousands).
fn log_tail(relay: &process::RelayProcess) -> String {
    tail(&relay.log_text())
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Waits until `consumer` has `n` messages; panics with the relay's log when the relay exits
/// first or a minute passes.
async fn wait_for_delivery(relay: &mut process::RelayProcess, consumer: &Consumer, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumer.total() < n {
        if let Some(status) = relay.child.try_wait().expect("the relay's status") {
            panic!("the relay exited ({status}):\n{}", log_tail(relay));
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} messages after a minute:\n{}",
            consumer.total(),
            log_tail(relay)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no row of `table` is pending on the primary at `url`; panics with the relay's
/// log when the relay exits first or a minute passes.
async fn wait_until_drained(
    what: &str,
    relay: &mut process::RelayProcess,
    url: &str,
    table: &OutboxTable,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = relay.child.try_wait().expect("the relay's status") {
            panic!("{what}: the relay exited ({status}):\n{}", log_tail(relay));
        }
        if db::pending(&mut db::connect_to(url).await, table).await == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: rows still pending on {url} after a minute:\n{}",
            log_tail(relay)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Kills the primary once `consumer` has a fifth of `rows`, and checks the relay had not
/// finished by then.
async fn kill_primary_mid_run(
    pair: &StandbyPair,
    relay: &mut process::RelayProcess,
    consumer: &Consumer,
    rows: u64,
) {
    wait_for_delivery(relay, consumer, rows / 5).await;
    pair.kill_primary().await;
    assert!(
        consumer.total() < rows,
        "the relay finished before the primary was killed"
    );
    // What a failover manager takes to notice (Patroni's loop is seconds): the relay meanwhile
    // has a dead primary and a standby.
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, text) = http::get(addr, "/metrics").await;
    metrics::value(&text, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_bed_replicates_synchronously_and_fails_over() {
    // The pair itself, without a relay: what the scenarios below rely on.
    let pair = StandbyPair::start().await;
    assert_eq!(pair.sync_state().await.as_deref(), Some("sync"));
    assert!(pair.in_recovery(Server::Standby).await);
    let mut primary = db::connect_to(&pair.primary_url()).await;
    db::exec(
        &mut primary,
        "CREATE TABLE bed (n int); INSERT INTO bed VALUES (1)",
    )
    .await;
    let mut standby = db::connect_to(&pair.standby_url()).await;
    // A synchronous commit waits for the standby to flush the WAL (`synchronous_commit = on`),
    // not to replay it: the table shows there a moment later.
    let replayed = wait::holds(
        "the standby replays the table",
        Duration::from_secs(30),
        || {
            let url = pair.standby_url();
            async move {
                let mut standby = db::connect_to(&url).await;
                db::scalar_i64(
                    &mut standby,
                    "SELECT count(*) FROM pg_class WHERE relname = 'bed'",
                )
                .await
                    == 1
            }
        },
    )
    .await;
    assert!(replayed, "the standby never showed the primary's table");
    let written = sqlx::query("INSERT INTO bed VALUES (2)")
        .execute(&mut standby)
        .await
        .expect_err("a standby takes no writes");
    let code = written.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("25006"), "{written}");

    // Without its synchronous standby, a commit on the primary does not return.
    pair.stop_standby().await;
    let waiting = tokio::time::timeout(
        Duration::from_secs(1),
        sqlx::query("INSERT INTO bed VALUES (3)").execute(&mut primary),
    )
    .await;
    assert!(waiting.is_err(), "a commit returned without the standby");
    drop(primary);
    pair.start_standby().await;
    assert!(pair.wait_until_synchronous(Duration::from_secs(30)).await);
    let standby = pair.standby_url();
    assert!(
        outbox_tests::wait::holds(
            "the waiting commit arrives",
            Duration::from_secs(10),
            || {
                async {
                    let mut conn = db::connect_to(&standby).await;
                    db::scalar_i64(&mut conn, "SELECT count(*) FROM bed").await == 2
                }
            }
        )
        .await
    );

    // Failover: the promoted standby takes writes at once (it waits for no standby).
    pair.kill_primary().await;
    pair.promote().await;
    assert!(!pair.in_recovery(Server::Standby).await);
    let mut promoted = db::connect_to(&pair.standby_url()).await;
    let write = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query("INSERT INTO bed VALUES (4)").execute(&mut promoted),
    )
    .await;
    assert!(
        write.is_ok_and(|r| r.is_ok()),
        "a write on the promoted standby"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_and_standby_promoted_the_multi_host_url_follows() {
    let run = Scenario::start("pgfo_kill", 20_000).await;
    let (name, url) = (&run.name, run.pair.multi_host_url());
    let mut relay = process::spawn_relay(name, &relay_args(name, &url, &[]));
    kill_primary_mid_run(&run.pair, &mut relay, &run.consumer, run.rows).await;
    run.pair.promote().await;
    let survivor = run.pair.standby_url();
    run.assert_all_delivered(
        "primary killed, multi-host URL",
        &mut relay,
        &survivor,
        IN_FLIGHT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_and_standby_promoted_behind_a_stable_address() {
    // What a CloudNativePG `-rw` Service or an RDS cluster endpoint does: one address, which
    // moves to the promoted standby. The relay is told nothing of the pair.
    let run = Scenario::start("pgfo_addr", 20_000).await;
    let (addr, forwarder) = proxy::start(run.pair.addr(Server::Primary))
        .await
        .expect("start the forwarder");
    let (name, url) = (&run.name, format!("postgres://postgres@{addr}/test"));
    let mut relay = process::spawn_relay(name, &relay_args(name, &url, &[]));
    kill_primary_mid_run(&run.pair, &mut relay, &run.consumer, run.rows).await;
    run.pair.promote().await;
    forwarder.repoint(run.pair.addr(Server::Standby));
    let survivor = run.pair.standby_url();
    run.assert_all_delivered(
        "primary killed, stable address moved",
        &mut relay,
        &survivor,
        IN_FLIGHT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_brings_the_old_primary_back_as_a_standby_and_the_multi_host_url_passes_it_over()
 {
    // Patroni's or CloudNativePG's switchover: the primary stopped cleanly (its sessions get
    // 57P01), the standby promoted, the old primary back on its address as the new one's
    // standby. The URL still names it first: every connection that lands there must be closed
    // and the next host tried.
    let run = Scenario::start("pgfo_switch", 20_000).await;
    let (name, url) = (&run.name, run.pair.multi_host_url());
    let mut relay = process::spawn_relay(name, &relay_args(name, &url, &[]));
    wait_for_delivery(&mut relay, &run.consumer, run.rows / 5).await;
    run.pair.stop(Server::Primary, Stop::Fast).await;
    run.pair.promote().await;
    run.pair
        .rejoin(Server::Primary)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(run.pair.in_recovery(Server::Primary).await);
    let survivor = run.pair.standby_url();
    run.assert_all_delivered(
        "switchover, the old primary back as standby",
        &mut relay,
        &survivor,
        IN_FLIGHT,
    )
    .await;
}

/// How long a relay on a standby alone is watched, and the most lines it may log meanwhile
/// (the first "read-only standby" line included): "a handful a minute", with room for a
/// backoff that starts short.
const STANDBY_WATCH: Duration = Duration::from_secs(20);
const STANDBY_WATCH_MAX_LINES: usize = 5;

/// Waits until the relay's metric `series` reads `value`; false after 10 s.
async fn metric_becomes(addr: &str, series: &str, value: f64) -> bool {
    outbox_tests::wait::holds(
        &format!("{series} is {value}"),
        Duration::from_secs(10),
        || async { metric(addr, series).await == Some(value) },
    )
    .await
}

/// The first line of the relay's log containing `needle`, by its index; panics with the log
/// after 20 s.
async fn first_line_with(relay: &process::RelayProcess, needle: &str) -> usize {
    outbox_tests::wait::for_value(
        &format!("the relay logs {needle:?}"),
        Duration::from_secs(20),
        || async {
            relay
                .log_text()
                .lines()
                .position(|line| line.contains(needle))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", log_tail(relay)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_a_standby_waits_quietly_and_relays_once_it_is_promoted() {
    let run = Scenario::start("pgfo_standby", 5_000).await;
    let (name, table, rows) = (&run.name, &run.table, run.rows);
    // The standby has flushed every row (synchronous commit); wait until it has applied them.
    let standby = run.pair.standby_url();
    let count = format!("SELECT count(*) FROM {}", table.name.quoted());
    assert!(
        outbox_tests::wait::holds(
            "the standby shows the seeded rows",
            Duration::from_secs(30),
            || async {
                db::scalar_i64(&mut db::connect_to(&standby).await, &count).await as u64 == rows
            }
        )
        .await
    );
    let mut relay = process::spawn_relay(name, &relay_args(name, &standby, &[]));
    let addr = relay.metrics_addr().await;

    let first = first_line_with(&relay, "read-only standby").await;
    let watch_start = Instant::now();
    let log = relay.log_text();
    let line = log.lines().nth(first).unwrap_or_default();
    assert!(
        line.contains("waiting for a primary") && line.contains(&run.pair.standby_port.to_string()),
        "the standby line names neither the server nor what the relay waits for: {line}"
    );

    // Meanwhile: not ready, saying why, the gauge up, nothing sent.
    assert!(metric_becomes(&addr, WAITING_GAUGE, 1.0).await);
    let (code, body) = http::get(&addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("DatabaseReadOnly"), "{body}");
    tokio::time::sleep(STANDBY_WATCH.saturating_sub(watch_start.elapsed())).await;
    let log = relay.log_text();
    let lines: Vec<&str> = log.lines().skip(first).collect();
    println!(
        "relay on a standby: {} log lines in {STANDBY_WATCH:?} from the first standby line",
        lines.len()
    );
    assert!(
        lines.len() <= STANDBY_WATCH_MAX_LINES,
        "{} log lines in {STANDBY_WATCH:?} on a standby (at most {STANDBY_WATCH_MAX_LINES}):\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert_eq!(run.consumer.total(), 0, "something was sent from a standby");
    assert_eq!(metric(&addr, WAITING_GAUGE).await, Some(1.0));
    assert!(
        metric(&addr, REFUSALS).await.is_some_and(|n| n >= 1.0),
        "{REFUSALS} did not count the standby"
    );

    run.pair.promote().await;
    let promoted = Instant::now();
    wait_until_drained("after the promotion", &mut relay, &standby, table).await;
    println!(
        "relay on a standby: drained {:.1?} after the promotion",
        promoted.elapsed()
    );
    assert!(metric_becomes(&addr, WAITING_GAUGE, 0.0).await);
    let (code, body) = http::get(&addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    // Nothing was sent before the promotion, and nothing failed after it: no duplicate.
    run.assert_all_delivered(
        "relay started on a standby, then promoted",
        &mut relay,
        &standby,
        0,
    )
    .await;
}

/// The synchronous standby's outage and the COMMIT bound the relay is given for it.
const OUTAGE: Duration = Duration::from_secs(8);
const COMMIT_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synchronous_standby_stopped_bounds_the_commit_and_loses_nothing() {
    let run = Scenario::start("pgfo_sync", 10_000).await;
    let (name, table, consumer) = (&run.name, &run.table, &run.consumer);
    let primary = run.pair.primary_url();
    let args = relay_args(name, &primary, &["--commit-timeout", "2s"]);
    let mut relay = process::spawn_relay(name, &args);
    wait_for_delivery(&mut relay, consumer, run.rows / 5).await;
    run.pair.stop_standby().await;
    let log_before = relay.log_text().lines().count();
    let sent_before = consumer.distinct();
    assert!(
        (sent_before as u64) < run.rows,
        "the relay finished before the standby stopped"
    );

    // Every COMMIT now waits for the standby (the primary holds its rows committed locally,
    // not yet visible). No row may show as marked unless the broker has it.
    let mut conn = db::connect_to(&primary).await;
    let outage_end = Instant::now() + OUTAGE;
    while Instant::now() < outage_end {
        let marked = db::processed_ids(&mut conn, table).await;
        // The consumer may lag the broker by a few deliveries.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let unsent = marked.iter().filter(|id| !consumer.has(id)).count();
        assert_eq!(unsent, 0, "rows marked that never reached the broker");
        assert!(
            relay.child.try_wait().unwrap().is_none(),
            "the relay exited:\n{}",
            log_tail(&relay)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A COMMIT that did not return in time was dropped, and said so.
    let log = relay.log_text();
    let said = log
        .lines()
        .skip(log_before)
        .any(|line| line.to_lowercase().contains("commit"));
    assert!(
        said,
        "nothing logged of a COMMIT that did not return within {COMMIT_TIMEOUT:?}:\n{}",
        log_tail(&relay)
    );
    let sent_during = consumer.distinct() - sent_before;
    println!(
        "synchronous standby stopped for {OUTAGE:?}: {sent_during} ids first sent meanwhile \
         (their COMMITs waited for the standby)"
    );

    run.pair.start_standby().await;
    assert!(
        run.pair
            .wait_until_synchronous(Duration::from_secs(30))
            .await,
        "{}",
        run.pair.log(Server::Standby)
    );
    // A COMMIT given up on leaves its batch not settled: at most one batch per worker per
    // COMMIT timeout of the outage, and the one each had when it began, can go again.
    let rounds = (OUTAGE.as_secs() / COMMIT_TIMEOUT.as_secs()) + 1;
    run.assert_all_delivered(
        "synchronous standby stopped",
        &mut relay,
        &primary,
        IN_FLIGHT * rounds,
    )
    .await;
}

/// Runs a relay that must exit, and returns its exit code (`None` when it still ran after 20 s:
/// it is then killed) and its log.
async fn run_expecting_exit(name: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut relay = process::spawn_relay(name, args);
    let code = match tokio::time::timeout(Duration::from_secs(20), relay.child.wait()).await {
        Ok(status) => status.expect("wait for outbox-relay").code(),
        Err(_) => None,
    };
    (code, relay.log_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_attrs_a_relay_cannot_use_are_refused_and_the_default_finds_the_primary() {
    let run = Scenario::start("pgfo_attrs", 2_000).await;
    let (name, pair) = (&run.name, &run.pair);
    let secret = "Sb7-not-in-logs";
    for attrs in ["read-only", "standby"] {
        let url = format!(
            "postgres://postgres:{secret}@127.0.0.1:{},127.0.0.1:{}/test?target_session_attrs={attrs}",
            pair.primary_port, pair.standby_port
        );
        let (code, log) = run_expecting_exit(
            &format!("{name}_{attrs}"),
            &process::run_args(name, name, &["--database-url", &url]),
        )
        .await;
        assert_eq!(
            code,
            Some(2),
            "target_session_attrs={attrs}:\n{}",
            tail(&log)
        );
        assert!(log.contains("target_session_attrs"), "{}", tail(&log));
        assert!(!log.contains(secret), "the password in:\n{log}");
    }
    assert_eq!(run.consumer.total(), 0);

    // No attrs with several hosts means read-write: the standby, named first, is passed over.
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/test",
        pair.standby_port, pair.primary_port
    );
    let primary = pair.primary_url();
    let mut relay = process::spawn_relay(name, &relay_args(name, &url, &[]));
    let addr = relay.metrics_addr().await;
    wait_until_drained("standby named first", &mut relay, &primary, &run.table).await;
    assert!(
        metric(&addr, REFUSALS).await.is_some_and(|n| n >= 1.0),
        "{REFUSALS} did not count the standby named first"
    );
    assert_eq!(metric(&addr, WAITING_GAUGE).await, Some(0.0));
    run.assert_all_delivered("standby first in a multi-host URL", &mut relay, &primary, 0)
        .await;
}
