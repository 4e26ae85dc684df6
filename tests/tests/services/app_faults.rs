//! Application-level faults through Toxiproxy (tests/src/toxiproxy.rs): latency on the
//! database path, a bandwidth cap on the broker path, a broker connection closed in the middle
//! of a frame, a broker stream that stops without closing. A network namespace
//! (partition.rs) is too coarse for these; Toxiproxy cannot do what partition.rs does (its own
//! kernel answers the relay's keepalives). Each test has its own Toxiproxy server, table,
//! exchange and queue.

use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use outbox_relay::table::OutboxTable;
use outbox_tests::broker::Consumer;
use outbox_tests::process::RelayProcess;
use outbox_tests::toxiproxy::{Stream, Toxic, Toxiproxy};
use outbox_tests::{broker, db, http, metrics, process, unique};
use sqlx::PgConnection;

/// The relay's /metrics text.
async fn metrics_text(relay: &RelayProcess) -> String {
    http::get(&relay.metrics_addr().await, "/metrics").await.1
}

/// A metric's value, 0 when the relay has not written it.
fn value(text: &str, series: &str) -> f64 {
    metrics::value(text, series).unwrap_or(0.0)
}

/// Rows marked processed that the consumer has not received: a row settled without a confirm.
/// The consumer may lag the broker by a few deliveries in flight, so a row missing is looked
/// at again a second later.
async fn marked_unreceived(
    conn: &mut PgConnection,
    table: &OutboxTable,
    consumer: &Consumer,
) -> usize {
    let marked = db::processed_ids(conn, table).await;
    if marked.iter().all(|id| consumer.has(id)) {
        return 0;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    marked.iter().filter(|id| !consumer.has(id)).count()
}

/// The relay's claims on `table` now: the age in seconds of each of its sessions (told apart by
/// `application`) idle inside a transaction that holds the table's row locks.
async fn claims_held(conn: &mut PgConnection, table: &OutboxTable, application: &str) -> Vec<f64> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM clock_timestamp() - a.xact_start)::float8
           FROM pg_stat_activity a
          WHERE a.application_name = $1 AND a.state LIKE 'idle in transaction%'
            AND EXISTS (SELECT 1 FROM pg_locks l
                         WHERE l.pid = a.pid AND l.relation = $2::text::regclass
                           AND l.mode <> 'AccessShareLock')",
    )
    .bind(application)
    .bind(table.name.quoted())
    .fetch_all(&mut *conn)
    .await
    .expect("pg_stat_activity")
}

/// Locks any session other than this one holds on `table` (the relay's, once it has exited,
/// must be none).
async fn locks_on(conn: &mut PgConnection, table: &OutboxTable) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
          WHERE relation = $1::text::regclass AND pid <> pg_backend_pid()",
    )
    .bind(table.name.quoted())
    .fetch_one(&mut *conn)
    .await
    .expect("pg_locks")
}

/// `url` with `application_name` set, so the relay's sessions can be told apart.
fn with_application_name(url: &str, name: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.query_pairs_mut().append_pair("application_name", name);
    url.to_string()
}

/// The lines of `log` that contain `needle`.
fn count_lines(log: &str, needle: &str) -> usize {
    log.lines().filter(|line| line.contains(needle)).count()
}

/// Database latency: 20 ms ± 5 ms each way on every connection the relay makes to PostgreSQL.
const DB_LATENCY_MS: u64 = 20;
const DB_JITTER_MS: u64 = 5;
const LATENCY_ROWS: u64 = 3_000;
const LATENCY_BATCH: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_on_the_database_path_costs_round_trips_not_batching_or_correctness() {
    let name = unique("tox_latency");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, LATENCY_ROWS).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let toxiproxy = Toxiproxy::start().await;
    let (url, postgres) = toxiproxy
        .proxy_for_url("postgres", &outbox_tests::database_url())
        .await;
    for (toxic, stream) in [("down", Stream::Downstream), ("up", Stream::Upstream)] {
        postgres
            .add(
                toxic,
                stream,
                Toxic::Latency {
                    latency_ms: DB_LATENCY_MS,
                    jitter_ms: DB_JITTER_MS,
                },
            )
            .await;
    }
    // The toxics act: one statement through the proxy takes a round trip of both latencies.
    let mut through = db::connect_to(&url).await;
    let probe = Instant::now();
    db::scalar_i64(&mut through, "SELECT 1::int8").await;
    let round_trip = probe.elapsed();
    drop(through);
    assert!(
        round_trip >= Duration::from_millis(2 * (DB_LATENCY_MS - DB_JITTER_MS)),
        "a statement through the proxy took {round_trip:?}: the latency toxics do not act"
    );

    let batch = LATENCY_BATCH.to_string();
    let args = process::run_args(&name, &name, &["--batch-size", &batch, "--workers", "2"]);
    let started = Instant::now();
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("DATABASE_URL", &url)]);
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "not drained through the latency:\n{}",
        relay.log_text()
    );
    let drained = started.elapsed();
    let text = metrics_text(&relay).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut conn, &table, LATENCY_ROWS)
        .await;

    // Batching holds: every row claimed once, in about rows / batch claims, not one per row
    // nor a flood of small ones.
    let claims = value(&text, "outbox_relay_batch_size_count");
    let empty = value(&text, "outbox_relay_batch_size_bucket{le=\"0\"}");
    let rows_claimed = value(&text, "outbox_relay_batch_size_sum");
    let full_claims = claims - empty;
    eprintln!(
        "latency {DB_LATENCY_MS}±{DB_JITTER_MS} ms each way (a statement {round_trip:?}): \
         {LATENCY_ROWS} rows drained in {drained:.1?} (relay start included), \
         {full_claims} claims with rows ({claims} in all), {rows_claimed} rows claimed"
    );
    assert_eq!(
        rows_claimed as u64, LATENCY_ROWS,
        "rows claimed: a row claimed twice was given back or settled twice"
    );
    let bound = LATENCY_ROWS.div_ceil(LATENCY_BATCH) + 2;
    assert!(
        full_claims >= 1.0 && full_claims as u64 <= bound,
        "{full_claims} claims with rows for {LATENCY_ROWS} rows of batch {LATENCY_BATCH} \
         (at most {bound}): the latency broke the batching"
    );
    assert_eq!(value(&text, "outbox_relay_publish_failures_total"), 0.0);
    assert_eq!(
        value(&text, "outbox_relay_database_connect_failures_total"),
        0.0
    );

    // Nothing left behind: no row pending, no lock held once the relay is gone, nothing loud.
    assert_eq!(db::pending(&mut conn, &table).await, 0);
    assert_eq!(
        locks_on(&mut conn, &table).await,
        0,
        "locks left on the table"
    );
    let log = relay.log_text();
    let (loud, _) = process::loud_lines(&log);
    assert!(
        loud.is_empty(),
        "the relay warned under latency alone:\n{}",
        loud.join("\n")
    );
    consumer.close().await;
}

/// The broker path's cap: 48 KB/s from the relay to the broker.
const BANDWIDTH_KB: u64 = 48;
const BANDWIDTH_ROWS: u64 = 1_000;
const BANDWIDTH_BATCH: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bandwidth_cap_on_the_broker_path_slows_publishing_and_costs_nothing_else() {
    let name = unique("tox_bandwidth");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, BANDWIDTH_ROWS).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let toxiproxy = Toxiproxy::start().await;
    let (url, rabbit) = toxiproxy
        .proxy_for_url("rabbitmq", &outbox_tests::amqp_url())
        .await;
    rabbit
        .add(
            "cap",
            Stream::Upstream,
            Toxic::Bandwidth {
                rate_kb: BANDWIDTH_KB,
            },
        )
        .await;
    // A batch of 100 (about 30 KB of frames) takes well under a second at the cap: the
    // deadline is never what ends one, so no row may come twice.
    let batch = BANDWIDTH_BATCH.to_string();
    let args = process::run_args(
        &name,
        &name,
        &[
            "--batch-size",
            &batch,
            "--workers",
            "2",
            "--publish-timeout",
            "10s",
        ],
    );
    let started = Instant::now();
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("AMQP_URL", &url)]);
    let mut looks = 0;
    while db::pending(&mut conn, &table).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "not drained under the bandwidth cap:\n{}",
            relay.log_text()
        );
        assert_eq!(
            marked_unreceived(&mut conn, &table, &consumer).await,
            0,
            "rows marked that the broker never had"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained = started.elapsed();
    let text = metrics_text(&relay).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut conn, &table, BANDWIDTH_ROWS)
        .await;
    let body_bytes: usize = consumer.received.lock().unwrap().sizes.values().sum();
    // What had to pass the cap, at the least: each message's body, and around it three frame
    // headers and ends (3 × 8 bytes), basic.publish's arguments (9 bytes and the exchange's
    // name) and the content header (14 bytes and the 37 of the message id).
    let frame_bytes = body_bytes as u64 + BANDWIDTH_ROWS * (24 + 9 + name.len() as u64 + 14 + 37);
    let floor = Duration::from_secs_f64(frame_bytes as f64 / (BANDWIDTH_KB * 1024) as f64);
    let waited = value(
        &text,
        "outbox_relay_stage_duration_seconds_sum{stage=\"publish\"}",
    ) + value(
        &text,
        "outbox_relay_stage_duration_seconds_sum{stage=\"confirm\"}",
    );
    eprintln!(
        "bandwidth {BANDWIDTH_KB} KB/s to the broker: {BANDWIDTH_ROWS} rows (at least \
         {frame_bytes} bytes of frames, the cap's floor {floor:.1?}) drained in {drained:.1?} \
         (relay start included), {waited:.1} s spent publishing and awaiting confirms; {looks} \
         looks found no row marked unconfirmed"
    );
    assert!(
        drained >= floor,
        "drained in {drained:?}, under the cap's floor {floor:?}: the toxic did not act"
    );
    assert_eq!(
        metrics::unconfirmed(&text),
        0,
        "publishes without a confirm"
    );
    let log = relay.log_text();
    let (loud, _) = process::loud_lines(&log);
    assert!(loud.is_empty(), "{}", loud.join("\n"));
    consumer.close().await;
}

/// Bytes from the relay to the broker before Toxiproxy closes a connection: past the AMQP
/// handshake (well under 1 KB), short of one batch of [`CUT_BATCH`] publishes (each over 100
/// bytes of frames), so it ends inside a publish of the connection's first batch.
const CUT_AFTER_BYTES: u64 = 12_000;
const CUT_ROWS: u64 = 2_000;
const CUT_BATCH: u64 = 200;
/// Connections cut before the toxic goes.
const CUTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_connection_closed_mid_frame_settles_nothing_unconfirmed_and_recovers() {
    let name = unique("tox_midframe");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, CUT_ROWS).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let toxiproxy = Toxiproxy::start().await;
    let (url, rabbit) = toxiproxy
        .proxy_for_url("rabbitmq", &outbox_tests::amqp_url())
        .await;
    rabbit
        .add(
            "cut",
            Stream::Upstream,
            Toxic::LimitData {
                bytes: CUT_AFTER_BYTES,
            },
        )
        .await;
    let batch = CUT_BATCH.to_string();
    let args = process::run_args(
        &name,
        &name,
        &[
            "--batch-size",
            &batch,
            "--workers",
            "1",
            "--publish-timeout",
            "5s",
        ],
    );
    let mut relay = process::spawn_relay_with_env(&name, &args, &[("AMQP_URL", &url)]);
    // Every connection is closed a few KB into its first batch: nothing can settle but what
    // the broker confirmed before the cut.
    let cut_line = "broker connection failed mid-batch";
    let mut cuts = 0;
    let watching = Instant::now();
    while cuts < CUTS {
        assert!(
            watching.elapsed() < Duration::from_secs(40),
            "{cuts} cuts seen in {:?}:\n{}",
            watching.elapsed(),
            relay.log_text()
        );
        assert_eq!(
            marked_unreceived(&mut conn, &table, &consumer).await,
            0,
            "rows marked that the broker never confirmed"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        cuts = count_lines(&relay.log_text(), cut_line);
    }
    let during = watching.elapsed();
    let pending_at_removal = db::pending(&mut conn, &table).await;
    // The cuts fell inside batches: some of their messages reached the broker (and the
    // consumer) without the confirms that would have let the relay settle them.
    let reached_during = consumer.distinct();
    assert!(
        reached_during > 0,
        "no message reached the broker before a cut: the cut fell outside the batches"
    );
    rabbit.remove("cut").await;
    let removed = Instant::now();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(30)).await,
        "the relay did not recover by itself once the toxic was gone:\n{}",
        relay.log_text()
    );
    let recovered = removed.elapsed();
    consumer.wait_for(CUT_ROWS, Duration::from_secs(30)).await;
    let text = metrics_text(&relay).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let ids = db::all_ids(&mut conn, &table).await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    assert_eq!(missing, 0, "rows lost across the cuts");
    let log = relay.log_text();
    let all_cuts = count_lines(&log, cut_line) as u64;
    let duplicates = consumer.total() - CUT_ROWS;
    let unconfirmed = metrics::unconfirmed(&text);
    eprintln!(
        "limit_data {CUT_AFTER_BYTES} B to the broker: {CUTS} cuts in {during:.1?} \
         ({pending_at_removal} of {CUT_ROWS} rows pending at the removal, {reached_during} had \
         reached the broker), drained \
         {recovered:.1?} after it; {all_cuts} batches cut in all, {unconfirmed} messages \
         unconfirmed, {duplicates} duplicates"
    );
    // Only what went out without a confirm may come twice: at most the cut batches.
    assert!(
        duplicates <= unconfirmed && duplicates <= CUT_BATCH * all_cuts,
        "{duplicates} duplicates; {unconfirmed} sent unconfirmed, {all_cuts} cut batches of \
         {CUT_BATCH}"
    );
    assert!(
        count_lines(&log, "reconnected to") >= 1,
        "no reconnect logged:\n{log}"
    );
    // One warning per cut batch, not a flood.
    let (loud, _) = process::loud_lines(&log);
    assert!(
        loud.len() as u64 <= 3 * all_cuts + 3,
        "{} loud lines for {all_cuts} cuts:\n{}",
        loud.len(),
        loud.join("\n")
    );
    consumer.close().await;
}

const STOP_ROWS: u64 = 2_000;
const STOP_BATCH: u64 = 200;
const STOP_PUBLISH_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a claim may be seen held after the broker stream stopped: the publish deadline,
/// and room for a busy machine.
const STOP_LONGEST_CLAIM: Duration = STOP_PUBLISH_TIMEOUT.saturating_add(Duration::from_secs(2));
/// How long the relay is watched with the stream stopped.
const STOP_WATCHED: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_stream_that_stops_without_closing_gives_the_batch_back_by_the_deadline() {
    let name = unique("tox_stop");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, STOP_ROWS).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let toxiproxy = Toxiproxy::start().await;
    let (url, rabbit) = toxiproxy
        .proxy_for_url("rabbitmq", &outbox_tests::amqp_url())
        .await;
    let database = with_application_name(&outbox_tests::database_url(), &name);
    let batch = STOP_BATCH.to_string();
    let timeout = format!("{}s", STOP_PUBLISH_TIMEOUT.as_secs());
    // A slow trickle, so the stream stops with most rows still to go.
    let args = process::run_args(
        &name,
        &name,
        &[
            "--batch-size",
            &batch,
            "--workers",
            "1",
            "--publish-timeout",
            &timeout,
            "--max-rate",
            "400",
        ],
    );
    let mut relay = process::spawn_relay_with_env(
        &name,
        &args,
        &[("AMQP_URL", &url), ("DATABASE_URL", &database)],
    );
    assert!(
        consumer.wait_for(STOP_BATCH, Duration::from_secs(30)).await >= STOP_BATCH,
        "{}",
        relay.log_text()
    );
    // Confirms (and everything else the broker says) stop; the connection stays open.
    rabbit
        .add("stop", Stream::Downstream, Toxic::Timeout { timeout_ms: 0 })
        .await;
    let stopped = Instant::now();
    eprintln!(
        "the broker's replies stop at {} (for the logs)",
        chrono::Utc::now()
    );
    let mut longest = 0.0f64;
    let mut held_last: Option<Duration> = None;
    while stopped.elapsed() < STOP_WATCHED {
        let held = claims_held(&mut conn, &table, &name).await;
        if !held.is_empty() {
            held_last = Some(stopped.elapsed());
            longest = held.iter().copied().fold(longest, f64::max);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pending_stopped = db::pending(&mut conn, &table).await;
    assert_eq!(
        marked_unreceived(&mut conn, &table, &consumer).await,
        0,
        "rows marked without a confirm"
    );
    rabbit.remove("stop").await;
    let removed = Instant::now();
    eprintln!("the broker's replies come back at {}", chrono::Utc::now());
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "not drained after the stream came back:\n{}",
        relay.log_text()
    );
    let recovered = removed.elapsed();
    consumer.wait_for(STOP_ROWS, Duration::from_secs(30)).await;
    let text = metrics_text(&relay).await;
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let ids = db::all_ids(&mut conn, &table).await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    assert_eq!(missing, 0, "rows lost across the stop");
    let duplicates = consumer.total() - STOP_ROWS;
    let unconfirmed = metrics::unconfirmed(&text);
    eprintln!(
        "timeout 0 on the broker's replies: longest claim {longest:.1} s, the last seen \
         {held_last:.1?} after the stop ({pending_stopped} rows pending); drained \
         {recovered:.1?} after the removal; {unconfirmed} unconfirmed, {duplicates} duplicates"
    );
    assert!(
        longest <= STOP_LONGEST_CLAIM.as_secs_f64(),
        "a claim held {longest:.1} s with the broker silent (bound {STOP_LONGEST_CLAIM:?})"
    );
    assert!(
        held_last.is_none_or(|at| at <= STOP_LONGEST_CLAIM),
        "a claim still held {held_last:?} after the stop"
    );
    assert!(
        pending_stopped > 0,
        "every row settled with the broker silent"
    );
    assert!(
        duplicates <= unconfirmed && duplicates <= STOP_BATCH,
        "{duplicates} duplicates, {unconfirmed} unconfirmed, batch {STOP_BATCH}"
    );
    consumer.close().await;
}
