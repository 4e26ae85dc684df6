//! Issue 53, the broker's alarms: a RabbitMQ memory or disk alarm while the relay is mid-stream
//! holds no claim past the publish timeout. The relay gives its claims back, claims nothing
//! while the alarm lasts (said once; `/readyz` unready with `BrokerBlocked`), and relays
//! everything once it lifts. On the three-node RabbitMQ 3.10 cluster (`outbox_tests::rabbit_cluster`),
//! under its lease: an alarm blocks every publisher of its cluster, so it is never
//! raised on the tests' shared RabbitMQ.
//!
//! What RabbitMQ 3.10 was seen to do here (`rabbitmqctl list_connections name state` sampled
//! against a relay of 4 workers):
//! - Raising is immediate: `set_vm_memory_high_watermark 0` or `set_disk_free_limit 1000GB`
//!   and `rabbitmqctl status` lists the alarm; setting the value back lifts it within a second.
//! - A connection is told `connection.blocked` only once it publishes during the alarm. Until
//!   then it is `blocking` and told nothing: an idle relay (or one started during the alarm)
//!   looks unblocked, to itself and to `/readyz`, until its first publish.
//! - The broker stops reading a connection it blocked, and lapin, once told, writes nothing on
//!   it (publishes, heartbeats, the close) until `connection.unblocked`. A batch being
//!   published when the alarm came got no confirm while it lasted.
//! - When it lifts, the blocked connections are unblocked and take publishes at once; none is
//!   closed by the broker. The messages of a publish that timed out during the alarm are
//!   enqueued then, and their rows go again: one duplicate per message (500 per timed-out
//!   batch here).
//!
//! Measured with the relay of f1f5d68 (before the whole publish was bounded and a blocked
//! connection stopped every worker's claims): the workers' sessions stayed idle in their
//! transactions to the end of the watch, 17.4 s after the alarm (the server's 30 s
//! idle-in-transaction timeout would have ended them), each worker waited out a confirm
//! timeout in turn and replaced its connection, nothing said the broker blocked publishing
//! within 18 s, and `/readyz` answered 200 throughout. The bounds below fail on that.

use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use lapin::types::FieldTable;
use outbox_relay::table::OutboxTable;
use outbox_tests::rabbit_cluster::{self, Lease, Resource, node_url};
use outbox_tests::{broker, db, http, metrics, process, unique, wait};
use sqlx::PgConnection;

const ROWS: u64 = 60_000;
/// The relay's `--max-rate`: 20 s for the rows, so that the relay is mid-stream when the
/// alarm comes on a fast machine too (`rabbitmqctl` takes a second or more on a busy one).
const MAX_RATE: &str = "3000";
/// The relay's `--publish-timeout`: short, so the bound is too.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// The cluster node the relay and the consumer use, and where the alarm is raised.
const NODE: usize = 1;
/// By then after the alarm no claim may be held: the publish timeout and some slack.
const SETTLED: Duration = PUBLISH_TIMEOUT.saturating_add(Duration::from_secs(3));
/// How long the relay is watched holding nothing after [`SETTLED`].
const WATCHED: Duration = Duration::from_secs(10);
/// The longest a claim may be seen held (its transaction's age) after the alarm.
const LONGEST_CLAIM: Duration = PUBLISH_TIMEOUT.saturating_add(Duration::from_secs(2));

const BLOCKED_LINE: &str = "the broker blocks publishing";
const UNBLOCKED_LINE: &str = "the broker takes publishes again";

/// What one look at the relay saw, `at` after the alarm.
#[derive(Debug)]
struct Sample {
    at: Duration,
    /// The relay's sessions idle inside a transaction that holds the table's row locks: (pid,
    /// age of the transaction in s).
    in_transaction: Vec<(i32, f64)>,
    /// Locks the relay's sessions hold on the table, as `pid:mode`, a reading query's
    /// AccessShareLock aside (the backlog reporter counts the table every second).
    locks: Vec<String>,
    pending: i64,
    blocked_gauge: Option<f64>,
    readyz: (u16, String),
}

impl Sample {
    fn holds_nothing(&self) -> bool {
        self.in_transaction.is_empty() && self.locks.is_empty()
    }

    fn longest_claim(&self) -> f64 {
        self.in_transaction
            .iter()
            .map(|&(_, age)| age)
            .fold(0.0, f64::max)
    }
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.readyz.1.split("\r\n\r\n").nth(1).unwrap_or_default();
        write!(
            f,
            "[{:>5.1}s] pending={} idle_in_tx={:?} locks={:?} blocked_gauge={:?} readyz={} {:?}",
            self.at.as_secs_f64(),
            self.pending,
            self.in_transaction,
            self.locks,
            self.blocked_gauge,
            self.readyz.0,
            body.lines().next().unwrap_or_default()
        )
    }
}

async fn sample(
    conn: &mut PgConnection,
    table: &OutboxTable,
    application: &str,
    metrics_addr: &str,
    at: Duration,
) -> Sample {
    // Only a transaction holding the table's row locks is a claim: the reporter's short
    // transactions (its report row, its rate share) are idle in transaction for an instant
    // between their statements, and a sample can land on one.
    let in_transaction: Vec<(i32, f64)> = sqlx::query_as(
        "SELECT a.pid, extract(epoch FROM clock_timestamp() - a.xact_start)::float8
           FROM pg_stat_activity a
          WHERE a.application_name = $1 AND a.state LIKE 'idle in transaction%'
            AND EXISTS (SELECT 1 FROM pg_locks l
                         WHERE l.pid = a.pid AND l.relation = $2::text::regclass
                           AND l.mode <> 'AccessShareLock')
          ORDER BY a.pid",
    )
    .bind(application)
    .bind(table.name.quoted())
    .fetch_all(&mut *conn)
    .await
    .expect("pg_stat_activity");
    let locks: Vec<String> = sqlx::query_scalar(
        "SELECT l.pid::text || ':' || l.mode
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.relation = $1::text::regclass AND a.application_name = $2
            AND l.mode <> 'AccessShareLock'
          ORDER BY l.pid, l.mode",
    )
    .bind(table.name.quoted())
    .bind(application)
    .fetch_all(&mut *conn)
    .await
    .expect("pg_locks");
    let pending = db::pending(conn, table).await;
    let text = http::get(metrics_addr, "/metrics").await.1;
    Sample {
        at,
        in_transaction,
        locks,
        pending,
        blocked_gauge: metrics::value(&text, "outbox_relay_broker_blocked"),
        readyz: http::get(metrics_addr, "/readyz").await,
    }
}

/// When each line of the relay's log that contains `needle` was written.
fn logged_at(log: &str, needle: &str) -> Vec<chrono::DateTime<chrono::Utc>> {
    log.lines()
        .filter(|line| line.contains(needle))
        .filter_map(|line| chrono::DateTime::parse_from_rfc3339(line.split(' ').next()?).ok())
        .map(|at| at.with_timezone(&chrono::Utc))
        .collect()
}

/// The scenario, for either alarm: a relay of 4 workers mid-stream on node 1, the alarm raised
/// there; the bounds while it lasts; every row delivered once it is cleared.
async fn an_alarm_mid_stream_holds_no_claim(resource: Resource) {
    let started = Instant::now();
    let _cluster = Lease::take().await;
    let what = resource.name();
    let name = unique(&format!("alarm{what}"));
    // The setting to restore, read now: the raise is then one command.
    let mut alarm = rabbit_cluster::Alarm::prepare(NODE, resource).await;
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, ROWS).await;
    let url = node_url(NODE);
    // Declares the exchange and the queue before the relay connects to the exchange.
    let consumer =
        broker::consume_at(&url, &name, ExchangeKind::Fanout, "", FieldTable::default()).await;
    // The relay's sessions, told apart from every other one by their application_name.
    let mut database = url::Url::parse(&outbox_tests::database_url()).expect("a URL");
    database
        .query_pairs_mut()
        .append_pair("application_name", &name);
    let timeout = format!("{}s", PUBLISH_TIMEOUT.as_secs());
    let args = process::run_args(
        &name,
        &name,
        &[
            "--workers",
            "4",
            "--publish-timeout",
            &timeout,
            "--max-rate",
            MAX_RATE,
        ],
    );
    let mut relay = process::spawn_relay_with_env(
        &name,
        &args,
        &[("DATABASE_URL", database.as_str()), ("AMQP_URL", &url)],
    );
    let metrics_addr = relay.metrics_addr().await;
    assert!(
        wait::holds("relaying", Duration::from_secs(60), || async {
            db::pending(&mut db::connect().await, &table).await <= (ROWS - 3_000) as i64
        })
        .await,
        "{}",
        relay.log_text()
    );

    let alarm_utc = chrono::Utc::now();
    alarm.raise().await;
    let raised = Instant::now();
    // Every bound counts from here, the samples' zero too: `rabbitmqctl` takes seconds on a
    // busy machine, and the alarm holds only from some moment before it returns.
    let raised_utc = chrono::Utc::now();
    eprintln!(
        "{what} alarm raised in {:.1}s, {:.0}s into the test, {} rows pending",
        (chrono::Utc::now() - alarm_utc).as_seconds_f64(),
        started.elapsed().as_secs_f64(),
        db::pending(&mut conn, &table).await
    );
    let mut samples = Vec::new();
    while raised.elapsed() < SETTLED + WATCHED {
        samples.push(sample(&mut conn, &table, &name, &metrics_addr, raised.elapsed()).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let listed = rabbit_cluster::alarms(NODE).await;
    assert!(listed.iter().any(|r| r == what), "alarms {listed:?}");
    let log = relay.log_text();
    let text = http::get(&metrics_addr, "/metrics").await.1;
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("outbox_relay_publish_failures_total{"))
        .collect();
    eprintln!("{what}: during the alarm {failures:?}");

    // The bounds while the alarm lasts, gathered: the scenario goes on to the clear and the
    // delivery whatever they say (its numbers are the report), and fails at its end.
    let mut broken: Vec<String> = Vec::new();
    let watched: Vec<&Sample> = samples.iter().filter(|s| s.at >= SETTLED).collect();
    assert!(watched.len() >= 15, "too few samples: {}", watched.len());
    // (a) Claims given back within the publish timeout, and none taken while it lasts.
    let longest = samples
        .iter()
        .map(Sample::longest_claim)
        .fold(0.0, f64::max);
    let last_held = samples.iter().rev().find(|s| !s.holds_nothing());
    eprintln!(
        "{what}: longest claim seen after the alarm {longest:.1}s; the last seen {:?} after it",
        last_held.map(|s| s.at)
    );
    if let Some(held) = watched.iter().find(|s| !s.holds_nothing()) {
        broken.push(format!(
            "(a) a claim still held {:.1}s after the alarm (bound {SETTLED:?}); the last seen at \
             {:.1}s: {held}",
            held.at.as_secs_f64(),
            last_held.map_or(0.0, |s| s.at.as_secs_f64())
        ));
    }
    if longest > LONGEST_CLAIM.as_secs_f64() {
        broken.push(format!(
            "(a) a session {longest:.1}s idle in its transaction (bound {LONGEST_CLAIM:?})"
        ));
    }
    // (b) Nothing is relayed while it lasts, and the relay was mid-stream.
    let pending = watched[0].pending;
    assert!(pending > 0, "{what}: the relay finished before the alarm");
    if watched.iter().any(|s| s.pending != pending) {
        broken.push("(b) rows relayed during the alarm".into());
    }
    // (c) Unready, and saying why.
    if let Some(s) = watched.iter().find(|s| {
        let (code, text) = &s.readyz;
        !(*code == 503
            && text.contains("not ready (BrokerBlocked)")
            && text.contains("broker: connected, blocked by an alarm")
            && s.blocked_gauge.is_some_and(|v| v >= 1.0))
    }) {
        broken.push(format!(
            "(c) not unready for the alarm {:.1}s after it",
            s.at.as_secs_f64()
        ));
    }
    // (d) Said once for the process, within the bound.
    let said = logged_at(&log, BLOCKED_LINE);
    match said.first() {
        Some(first) if said.len() == 1 => {
            let after = (*first - raised_utc).as_seconds_f64();
            eprintln!("{what}: {BLOCKED_LINE:?} said {after:.1}s after the alarm");
            if after > SETTLED.as_secs_f64() {
                broken.push(format!(
                    "(d) {BLOCKED_LINE:?} said {after:.1}s after the alarm (bound {SETTLED:?})"
                ));
            }
        }
        _ => broken.push(format!("(d) {} {BLOCKED_LINE:?} lines", said.len())),
    }
    let shown = samples
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");

    // Cleared: everything relayed, every id at the consumer, the lift said once.
    let cleared_utc = chrono::Utc::now();
    alarm.clear().await;
    let cleared = Instant::now();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(40)).await,
        "{what}: rows pending 40 s after the alarm was cleared:\n{}",
        relay.log_text()
    );
    let drained = cleared.elapsed();
    let ids = db::all_ids(&mut conn, &table).await;
    assert!(
        wait::holds(
            "every id reached the consumer",
            Duration::from_secs(30),
            || async { ids.iter().all(|id| consumer.has(id)) }
        )
        .await,
        "{what}: {} ids lost",
        ids.iter().filter(|id| !consumer.has(id)).count()
    );
    let (code, _) = http::get(&metrics_addr, "/readyz").await;
    let text = http::get(&metrics_addr, "/metrics").await.1;
    let log = relay.log_text();
    assert_eq!(
        relay.terminate(Duration::from_secs(30)).await,
        Some(0),
        "{log}"
    );
    let duplicates = consumer.total() - ids.len() as u64;
    let allowed = metrics::unconfirmed(&text);
    let resumed = logged_at(&log, UNBLOCKED_LINE)
        .first()
        .map(|at| (*at - cleared_utc).as_seconds_f64());
    eprintln!(
        "{what}: {UNBLOCKED_LINE:?} said {resumed:.1?}s after the clear; drained {:.1}s after \
         it; {} rows, {duplicates} duplicates ({allowed} counted unconfirmed); {:.0}s in all",
        drained.as_secs_f64(),
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        broken.is_empty(),
        "{what}: {}\n--- samples after the alarm:\n{shown}\n--- relay log:\n{log}",
        broken.join("\n")
    );
    assert_eq!(code, 200, "{what}: unready after the alarm:\n{log}");
    assert_eq!(
        metrics::value(&text, "outbox_relay_broker_blocked"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(logged_at(&log, BLOCKED_LINE).len(), 1, "{log}");
    assert_eq!(logged_at(&log, UNBLOCKED_LINE).len(), 1, "{log}");
    assert!(
        duplicates <= allowed,
        "{what}: {duplicates} duplicates, more than the {allowed} sent unconfirmed"
    );
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_holds_no_claim_past_the_publish_timeout() {
    an_alarm_mid_stream_holds_no_claim(Resource::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_alarm_holds_no_claim_past_the_publish_timeout() {
    an_alarm_mid_stream_holds_no_claim(Resource::Disk).await;
}
