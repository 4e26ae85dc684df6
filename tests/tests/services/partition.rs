//! A relay cut off by a silent partition (no RST, no FIN) gives its claims back within the bound
//! it told the server at connect (DESIGN.md, "Bounds: no claim outlives its relay"), and the
//! partition fixture itself cuts silently and heals.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use outbox_tests::ordering::{check, expected_order};
use outbox_tests::partition::{Partition, Reach};
use outbox_tests::process::RelayProcess;
use outbox_tests::unix_proxy::UnixProxy;
use outbox_tests::{broker, db, process, unique, wait};
use sqlx::PgConnection;
use tokio::io::AsyncWriteExt as _;

/// PostgreSQL's port on the services address.
const POSTGRES_PORT: u16 = outbox_tests::ports::PG_PORT;

/// Rows the two relays share.
const ROWS: u64 = 60_000;

/// The cut comes once the relays are in full swing and at most this many rows are left, so
/// what relay B has to do alone stays small beside [`ALL_PROCESSED_AFTER_CUT`] on a slow,
/// busy machine (B alone relays thousands of rows a second even in a debug build).
const CUT_AT_PENDING: i64 = 20_000;

/// How long after the cut every row must be processed, relay A still cut off. The server ends
/// the sessions of a client that vanished after the relay's `--dead-client-timeout` (default
/// 15 s: keepalive probes from a third of it on), a stalled transaction after its
/// `--idle-in-transaction-timeout` (default 30 s) at the latest; then B's next claim (its poll,
/// 50 ms here) takes A's rows, two batches of 500, in about a second. Without any bound the
/// server keeps A's claims until its kernel's keepalive gives up: about 2 h.
const ALL_PROCESSED_AFTER_CUT: Duration = Duration::from_secs(40);

/// Rows inserted after the heal, for relay A alone.
const ROWS_AFTER_HEAL: u64 = 1_000;

/// How long relay A may take after the heal to relay [`ROWS_AFTER_HEAL`] by itself: its broken
/// connections fail on their first use, or when the server's RST answers their retransmits,
/// and it connects again.
const RELAYED_AFTER_HEAL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_cuts_silently_keeps_connections_open_and_heals() {
    let partition = Partition::create();
    let address = partition.address();
    let mut conn = db::connect().await;
    assert_eq!(
        partition.reach(POSTGRES_PORT, Duration::from_secs(5)).await,
        Reach::Connected,
        "PostgreSQL from inside {} before the cut",
        partition.name()
    );

    // An idle session from inside, open across the cut.
    let application = unique("partition_probe");
    let mut psql = partition
        .command("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
        .arg(partition.database_url())
        .env("PGAPPNAME", &application)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run psql inside the partition");
    let mut input = psql.stdin.take().expect("stdin is piped");
    input.write_all(b"SELECT 1;\n").await.unwrap();
    input.flush().await.unwrap();
    let session = wait::for_value(
        "psql's session from inside shows in pg_stat_activity, idle after its statement",
        Duration::from_secs(10),
        || {
            let application = application.clone();
            async move {
                let mut conn = db::connect().await;
                session_named(&mut conn, &application, address).await
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    // Its last answer acknowledged, the connection is quiet: nothing in flight either way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    partition.cut();
    let cut_at = Instant::now();
    let during = Instant::now();
    // Longer than an ARP failure (about 3 s), which would say "No route to host".
    assert_eq!(
        partition.reach(POSTGRES_PORT, Duration::from_secs(5)).await,
        Reach::Hung,
        "a connection attempt during the cut must vanish, neither connect nor fail"
    );
    assert!(during.elapsed() >= Duration::from_millis(4900));
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(cut_at.elapsed())).await;
    // No RST and no FIN reached either end: the server still has the session, psql still runs.
    assert_eq!(
        session_named(&mut conn, &application, address).await,
        Some(session),
        "the server's session from inside, {:?} into the cut",
        cut_at.elapsed()
    );
    assert!(
        psql.try_wait().unwrap().is_none(),
        "psql inside ended during the cut"
    );
    let sockets = partition.host_sockets();
    eprintln!(
        "{:?} into the cut: session {session} still on the server, host sockets {sockets:?}",
        cut_at.elapsed()
    );
    assert!(
        sockets.iter().any(|s| s.starts_with("ESTAB")),
        "{sockets:?}"
    );

    partition.heal();
    assert_eq!(
        partition.reach(POSTGRES_PORT, Duration::from_secs(5)).await,
        Reach::Connected,
        "PostgreSQL from inside after the heal"
    );
    // The session open across the cut carries on: a statement, then a clean exit.
    input.write_all(b"SELECT 2;\n\\q\n").await.unwrap();
    drop(input);
    let status = tokio::time::timeout(Duration::from_secs(10), psql.wait())
        .await
        .expect("psql ends within 10 s of the heal")
        .unwrap();
    assert!(status.success(), "psql after the heal: {status}");
    assert!(
        wait::holds(
            "the session from inside ends with psql",
            Duration::from_secs(5),
            || {
                let application = application.clone();
                async move {
                    let mut conn = db::connect().await;
                    session_named(&mut conn, &application, address)
                        .await
                        .is_none()
                }
            }
        )
        .await
    );

    // Two partitions at once never share a slot.
    let other = Partition::create();
    assert_ne!(other.address(), address);
    drop(other);

    // Dropped: the pair, the blackhole route and the namespace are gone.
    let name = partition.name().to_string();
    let blackhole = format!("10.213.{}.0/29", address.octets()[2]);
    drop(partition);
    assert!(
        !Path::new("/run/netns").join(&name).exists(),
        "namespace {name}"
    );
    let link = std::process::Command::new("ip")
        .args(["link", "show", "dev", &name])
        .output()
        .unwrap();
    assert!(!link.status.success(), "link {name} is still there");
    let routes = std::process::Command::new("ip")
        .args(["route", "show", "exact", &blackhole])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&routes.stdout).trim(),
        "",
        "{blackhole}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_mid_batch_gives_its_claims_back_to_its_peer() {
    let name = unique("partition");
    let table = db::table(&name);
    let started = Instant::now();
    let conn = db::seeded_table(&table, ROWS).await;
    eprintln!(
        "{ROWS} rows seeded in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let args = process::run_args(&name, &name, &["--batch-size", "500", "--workers", "2"]);
    database_cut(&name, &table, conn, args, None).await;
}

/// With `--ordering per-key` the cut relay's lanes are advisory locks of the sessions the
/// server ends: its keys go to the peer with them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_mid_batch_gives_its_keys_to_its_peer_in_order() {
    let name = unique("partition_keys");
    let (table, conn) = crate::per_key_ordering::keyed_table(&name, ROWS, 1_000).await;
    let args = crate::per_key_ordering::ordered_args(&name, &[]);
    database_cut(
        &name,
        &table,
        conn,
        args,
        Some(crate::per_key_ordering::KEY),
    )
    .await;
}

/// Relay A in a partition, relay B beside it, on one table; A's whole path is cut while it holds
/// claims: B processes every row within the bound (with `key_column`, every key in order), no
/// session of A's outlives it, and after the heal A relays new rows by itself on new sessions.
async fn database_cut(
    name: &str,
    table: &outbox_relay::table::OutboxTable,
    mut conn: PgConnection,
    args: Vec<&str>,
    key_column: Option<&str>,
) {
    let partition = Partition::create();
    let a_address = partition.address();
    let started = Instant::now();
    let consumer = broker::consume(name, ExchangeKind::Fanout, "").await;
    let mut a = partition.spawn_relay(&format!("{name}_a"), &args);
    let mut b = process::spawn_relay(&format!("{name}_b"), &args);

    // Cut while A holds claims: one of its sessions inside a transaction that locked rows.
    let mut attempt = 0;
    let (cut_at, old_sessions) = loop {
        attempt += 1;
        assert!(attempt <= 3, "A held no claim at any of three cuts");
        until_a_holds_a_claim(table, &RelayA::From(a_address), &a, &b).await;
        partition.cut();
        let cut_at = Instant::now();
        // What was on its way still lands; then A's sessions stay as the cut left them.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sessions = sessions_from(&mut conn, a_address).await;
        if sessions.iter().any(Session::holds_claim) {
            break (cut_at, sessions);
        }
        eprintln!("A held no claim just after cut {attempt} ({sessions:?}); healing, then again");
        partition.heal();
    };
    let pending_at_cut = db::pending(&mut conn, table).await;
    eprintln!(
        "cut {:.1}s into the test with {pending_at_cut} rows pending; A's sessions: \
         {old_sessions:?}",
        started.elapsed().as_secs_f64()
    );

    // (a) Every row is processed within the bound, A still cut off.
    let mut last_report = Instant::now();
    let drained = wait::holds(
        "every row is processed, relay A still cut off",
        ALL_PROCESSED_AFTER_CUT.saturating_sub(cut_at.elapsed()),
        || {
            let table = table.clone();
            let report = last_report.elapsed() >= Duration::from_secs(5);
            if report {
                last_report = Instant::now();
            }
            async move {
                let mut conn = db::connect().await;
                let pending = db::pending(&mut conn, &table).await;
                if report {
                    let sessions = sessions_from(&mut conn, a_address).await;
                    eprintln!(
                        "{:>4.1}s into the cut: {pending} pending; A's sessions: {sessions:?}",
                        cut_at.elapsed().as_secs_f64()
                    );
                }
                pending == 0
            }
        },
    )
    .await;
    let drained_after = cut_at.elapsed();
    if !drained {
        let pending = db::pending(&mut conn, table).await;
        let sessions = sessions_from(&mut conn, a_address).await;
        // A's orphaned sessions would keep their locks for hours: end them before failing.
        end_sessions_from(&mut conn, a_address).await;
        panic!(
            "{pending} rows still pending {drained_after:?} after the cut (bound \
             {ALL_PROCESSED_AFTER_CUT:?}): the server kept relay A's claims, its sessions \
             {sessions:?}\nA:\n{}\nB:\n{}",
            tail(&a.log_text()),
            tail(&b.log_text())
        );
    }
    eprintln!(
        "every row processed {:.1}s after the cut",
        drained_after.as_secs_f64()
    );

    // (b) No session of A's is left on the server by then.
    let gone = wait::holds(
        "no session from relay A is left on the server",
        ALL_PROCESSED_AFTER_CUT.saturating_sub(cut_at.elapsed()),
        || async move {
            let mut conn = db::connect().await;
            sessions_from(&mut conn, a_address).await.is_empty()
        },
    )
    .await;
    if !gone {
        let sessions = sessions_from(&mut conn, a_address).await;
        end_sessions_from(&mut conn, a_address).await;
        panic!(
            "relay A's sessions still on the server {:?} after the cut: {sessions:?}",
            cut_at.elapsed()
        );
    }
    eprintln!(
        "A's sessions gone from the server {:.1}s after the cut",
        cut_at.elapsed().as_secs_f64()
    );

    // (c) Every id reached the consumer at least once; A's batches that the broker confirmed
    // but A never marked came again from B.
    let ids = db::all_ids(&mut conn, table).await;
    assert_eq!(ids.len() as u64, ROWS);
    assert_every_id_arrives(&consumer, &ids).await;
    eprintln!(
        "{} messages for {ROWS} rows: {} ids came more than once",
        consumer.total(),
        consumer.duplicates().len()
    );
    if let Some(key) = key_column {
        let report = check(
            &consumer.arrivals(),
            &expected_order(&mut conn, table, key).await,
        );
        report.assert_in_order(ROWS);
        eprintln!("every key in order; {} repeats", report.repeats);
    }

    // After the heal, A alone relays new rows, on new sessions.
    let stopping = Instant::now();
    assert_eq!(
        b.terminate(Duration::from_secs(30)).await,
        Some(0),
        "B stops\n{}",
        tail(&b.log_text())
    );
    eprintln!(
        "relay B stopped in {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    partition.heal();
    let healed_at = Instant::now();
    outbox_relay::tools::seed::copy_rows(&mut conn, table, ROWS_AFTER_HEAL, 50, |_| {})
        .await
        .expect("insert rows after the heal");
    assert!(
        db::wait_until_drained(table, RELAYED_AFTER_HEAL).await,
        "relay A did not relay {ROWS_AFTER_HEAL} new rows alone within {RELAYED_AFTER_HEAL:?} \
         of the heal ({} pending); its sessions: {:?}\nA:\n{}",
        db::pending(&mut conn, table).await,
        sessions_from(&mut conn, a_address).await,
        tail(&a.log_text())
    );
    eprintln!(
        "A alone relayed {ROWS_AFTER_HEAL} new rows {:.1}s after the heal",
        healed_at.elapsed().as_secs_f64()
    );
    let old: HashSet<i32> = old_sessions.iter().map(|s| s.pid).collect();
    let now = sessions_from(&mut conn, a_address).await;
    assert!(
        now.iter().all(|s| !old.contains(&s.pid)),
        "relay A's sessions from before the cut are back on the server: {now:?} (before: {old_sessions:?})"
    );
    eprintln!("A's sessions after the heal (all new): {now:?}");
    let ids = db::all_ids(&mut conn, table).await;
    assert_eq!(ids.len() as u64, ROWS + ROWS_AFTER_HEAL);
    assert_every_id_arrives(&consumer, &ids).await;
    let stopping = Instant::now();
    let stopped = a.terminate(Duration::from_secs(30)).await;
    eprintln!(
        "relay A stopped with {stopped:?} in {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    consumer.close().await;
}

/// The publish deadline of the broker-cut scenarios: a batch awaiting confirms when the cut
/// comes is given back at most this long after it was sent.
const CUT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after the broker cut relay A may still hold a claim: the publish deadline of a batch
/// sent just before it, and the rollback's round trip.
const CLAIMS_BACK_AFTER_BROKER_CUT: Duration = Duration::from_secs(8);

/// By when relay A says it cannot reach the broker: the publish deadline, the bounded close of
/// the dead connection (5 s), a backoff and a node's connect timeout (15 s), with room to spare.
const SAID_AFTER_BROKER_CUT: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_from_the_broker_mid_batch_gives_its_claims_back() {
    let name = unique("broker_cut");
    let table = db::table(&name);
    let conn = db::seeded_table(&table, ROWS).await;
    let args = process::run_args(&name, &name, &["--batch-size", "500", "--workers", "2"]);
    broker_cut(&name, &table, conn, args, None).await;
}

/// With `--ordering per-key`, a relay that cannot reach the broker must not keep its keys: its
/// lanes (advisory locks on its database session, which the cut leaves alive) go to the peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_from_the_broker_gives_its_keys_to_its_peer_in_order() {
    let name = unique("broker_cut_keys");
    let (table, conn) = crate::per_key_ordering::keyed_table(&name, ROWS, 1_000).await;
    let args = crate::per_key_ordering::ordered_args(&name, &[]);
    broker_cut(
        &name,
        &table,
        conn,
        args,
        Some(crate::per_key_ordering::KEY),
    )
    .await;
}

/// Relay A reaches PostgreSQL through a Unix socket (a path the cut does not touch) and the
/// broker through the partition; relay B reaches both directly. The broker alone is cut while A
/// holds a claim: A gives its claims back within the publish deadline and claims nothing while
/// cut, B relays every row (with `key_column`, every key in order), and after the heal A relays
/// new rows by itself.
async fn broker_cut(
    name: &str,
    table: &outbox_relay::table::OutboxTable,
    mut conn: PgConnection,
    mut args: Vec<&str>,
    key_column: Option<&str>,
) {
    let partition = Partition::create();
    let postgres = UnixProxy::start(
        &format!(".s.PGSQL.{POSTGRES_PORT}"),
        (Ipv4Addr::LOCALHOST, POSTGRES_PORT).into(),
    );
    let a_name = format!("{name}_a");
    // libpq's form for a socket folder: no host in the authority, `host=` the folder.
    let tests_url = url::Url::parse(&outbox_tests::database_url()).expect("DATABASE_URL is a URL");
    let a_database_url = format!(
        "postgres://{}@{}?host={}&application_name={a_name}",
        tests_url.username(),
        tests_url.path(),
        postgres.dir().display()
    );
    let consumer = broker::consume(name, ExchangeKind::Fanout, "").await;
    let timeout = format!("{}s", CUT_PUBLISH_TIMEOUT.as_secs());
    args.extend_from_slice(&["--publish-timeout", &timeout]);
    let mut a =
        partition.spawn_relay_with_env(&a_name, &args, &[("DATABASE_URL", &a_database_url)]);
    let mut b = process::spawn_relay(&format!("{name}_b"), &args);

    // Cut while A holds a claim, most likely one whose batch awaits the broker's confirms.
    until_a_holds_a_claim(table, &RelayA::Named(a_name.clone()), &a, &b).await;
    partition.cut();
    let cut_at = Instant::now();
    eprintln!(
        "broker cut with {} rows pending, A holding {} claims",
        db::pending(&mut conn, table).await,
        claims_of(&mut conn, &a_name, table).await
    );

    // (a) A's claims are given back within the publish deadline, and it claims nothing more
    // while the broker stays away: it does not claim before it is connected.
    let mut last_claim = None;
    while cut_at.elapsed() < ALL_PROCESSED_AFTER_CUT.min(CLAIMS_BACK_AFTER_BROKER_CUT * 3) {
        if claims_of(&mut conn, &a_name, table).await > 0 {
            last_claim = Some(cut_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("A's last claim seen {last_claim:?} after the cut");
    assert!(
        last_claim.is_none_or(|at| at <= CLAIMS_BACK_AFTER_BROKER_CUT),
        "relay A held a claim {last_claim:?} after the broker cut (bound \
         {CLAIMS_BACK_AFTER_BROKER_CUT:?})\nA:\n{}",
        tail(&a.log_text())
    );

    // (b) B relays every row, A still cut off: with per-key ordering, A's keys too.
    let drained = wait::holds(
        "every row is processed, relay A still cut off from the broker",
        ALL_PROCESSED_AFTER_CUT.saturating_sub(cut_at.elapsed()),
        || {
            let table = table.clone();
            async move { db::pending(&mut db::connect().await, &table).await == 0 }
        },
    )
    .await;
    assert!(
        drained,
        "{} rows still pending {:?} after the broker cut\nA:\n{}\nB:\n{}",
        db::pending(&mut conn, table).await,
        cut_at.elapsed(),
        tail(&a.log_text()),
        tail(&b.log_text())
    );
    eprintln!(
        "every row processed {:.1}s after the broker cut",
        cut_at.elapsed().as_secs_f64()
    );
    let ids = db::all_ids(&mut conn, table).await;
    assert_every_id_arrives(&consumer, &ids).await;
    if let Some(key) = key_column {
        let report = check(
            &consumer.arrivals(),
            &expected_order(&mut conn, table, key).await,
        );
        report.assert_in_order(ROWS);
        eprintln!("every key in order; {} repeats", report.repeats);
    }
    // Said once for the process, not per worker per retry (a reminder a minute on at most),
    // once a reconnect has waited out a node's connect timeout.
    let said = wait::holds(
        "relay A says it cannot reach the broker",
        SAID_AFTER_BROKER_CUT.saturating_sub(cut_at.elapsed()),
        || {
            let said = a.log_text().contains("cannot reach the broker");
            async move { said }
        },
    )
    .await;
    let log = a.log_text();
    let times = log.matches("cannot reach the broker").count();
    assert!(said && times <= 2, "A says the cut {times} times:\n{log}");

    // (c) After the heal, A alone relays new rows.
    assert_eq!(
        b.terminate(Duration::from_secs(30)).await,
        Some(0),
        "B stops"
    );
    partition.heal();
    let healed_at = Instant::now();
    outbox_relay::tools::seed::copy_rows(&mut conn, table, ROWS_AFTER_HEAL, 50, |_| {})
        .await
        .expect("insert rows after the heal");
    assert!(
        db::wait_until_drained(table, RELAYED_AFTER_HEAL).await,
        "relay A did not relay {ROWS_AFTER_HEAL} new rows alone within {RELAYED_AFTER_HEAL:?} \
         of the broker's heal ({} pending)\nA:\n{}",
        db::pending(&mut conn, table).await,
        tail(&a.log_text())
    );
    eprintln!(
        "A alone relayed {ROWS_AFTER_HEAL} new rows {:.1}s after the heal",
        healed_at.elapsed().as_secs_f64()
    );
    let ids = db::all_ids(&mut conn, table).await;
    assert_every_id_arrives(&consumer, &ids).await;
    assert_eq!(
        a.terminate(Duration::from_secs(30)).await,
        Some(0),
        "A stops"
    );
    consumer.close().await;
    drop(postgres);
}

/// How a test tells relay A's sessions: by their address, when A reaches the server over the
/// partition's link, or by their application name, when it reaches it over a local socket.
#[derive(Clone)]
enum RelayA {
    From(Ipv4Addr),
    Named(String),
}

impl RelayA {
    async fn holds_claim(
        &self,
        conn: &mut PgConnection,
        table: &outbox_relay::table::OutboxTable,
    ) -> bool {
        match self {
            RelayA::From(address) => sessions_from(conn, *address)
                .await
                .iter()
                .any(Session::holds_claim),
            RelayA::Named(application) => claims_of(conn, application, table).await > 0,
        }
    }
}

/// Waits (60 s at most) until both relays run, at most [`CUT_AT_PENDING`] rows are left and A
/// holds a claim: the moment to cut.
async fn until_a_holds_a_claim(
    table: &outbox_relay::table::OutboxTable,
    relay_a: &RelayA,
    a: &RelayProcess,
    b: &RelayProcess,
) {
    wait::until(
        "both relays run, thousands of rows are processed and A holds a claim",
        Duration::from_secs(60),
        || {
            let (table, relay_a) = (table.clone(), relay_a.clone());
            async move {
                let mut conn = db::connect().await;
                db::pending(&mut conn, &table).await <= CUT_AT_PENDING
                    && relay_a.holds_claim(&mut conn, &table).await
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nA:\n{}\nB:\n{}",
            tail(&a.log_text()),
            tail(&b.log_text())
        )
    });
}

/// How many claims the sessions named `application` hold on `table`: transactions that locked
/// its rows (a lock stronger than a reader's). The reporter's short transactions, which write
/// the report table and only read this one, are not claims.
async fn claims_of(
    conn: &mut PgConnection,
    application: &str,
    table: &outbox_relay::table::OutboxTable,
) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT a.pid) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
          WHERE a.application_name = $1 AND a.backend_xid IS NOT NULL \
            AND l.relation = $2::regclass AND l.mode <> 'AccessShareLock'",
    )
    .bind(application)
    .bind(table.name.quoted())
    .fetch_one(conn)
    .await
    .expect("pg_stat_activity")
}

/// Waits (30 s at most) until every one of `ids` reached the consumer, at least once.
async fn assert_every_id_arrives(consumer: &broker::Consumer, ids: &[uuid::Uuid]) {
    let arrived = wait::holds(
        "every id reached the consumer",
        Duration::from_secs(30),
        || {
            let missing = ids.iter().filter(|id| !consumer.has(id)).count();
            async move { missing == 0 }
        },
    )
    .await;
    let missing = ids.iter().filter(|id| !consumer.has(id)).count();
    assert!(arrived, "{missing} ids never reached the consumer");
}

/// One server session from an address, as pg_stat_activity shows it.
#[derive(Debug, Clone, PartialEq)]
struct Session {
    pid: i32,
    state: String,
    /// A transaction that took an id: one that locked rows (a claim) or wrote.
    has_xid: bool,
    /// Seconds since the state last changed (shown in the reports).
    #[allow(dead_code, reason = "read by Debug, for the reports")]
    in_state_s: f64,
}

impl Session {
    fn holds_claim(&self) -> bool {
        self.has_xid && matches!(self.state.as_str(), "idle in transaction" | "active")
    }
}

/// The sessions whose client is `address`.
async fn sessions_from(conn: &mut PgConnection, address: Ipv4Addr) -> Vec<Session> {
    let rows: Vec<(i32, String, bool, f64)> = sqlx::query_as(
        "SELECT pid, coalesce(state, ''), backend_xid IS NOT NULL, \
                coalesce(extract(epoch FROM now() - state_change), 0)::float8 \
           FROM pg_stat_activity WHERE client_addr = $1::inet ORDER BY pid",
    )
    .bind(address.to_string())
    .fetch_all(conn)
    .await
    .expect("pg_stat_activity");
    rows.into_iter()
        .map(|(pid, state, has_xid, in_state_s)| Session {
            pid,
            state,
            has_xid,
            in_state_s: (in_state_s * 10.0).round() / 10.0,
        })
        .collect()
}

/// Ends the sessions whose client is `address` (a failing test's clean-up: orphaned sessions
/// would hold their row locks for hours).
async fn end_sessions_from(conn: &mut PgConnection, address: Ipv4Addr) {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_addr = $1::inet",
    )
    .bind(address.to_string())
    .execute(conn)
    .await
    .expect("pg_terminate_backend");
}

/// The pid of the session named `application` from `address`, if the server has it and it is
/// idle (its statement answered).
async fn session_named(
    conn: &mut PgConnection,
    application: &str,
    address: Ipv4Addr,
) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
          WHERE application_name = $1 AND client_addr = $2::inet AND state = 'idle'",
    )
    .bind(application)
    .bind(address.to_string())
    .fetch_optional(conn)
    .await
    .expect("pg_stat_activity")
}

/// The last lines of a relay's log, for a failure message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
