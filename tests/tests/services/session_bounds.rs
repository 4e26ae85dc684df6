//! Every relay session tells the server its bounds at connect (relay/src/database/
//! session_bounds.rs): the settings are in force on the real server, a URL's own `options` keep
//! their values, and a session that idles inside a transaction past its bound is ended by the
//! server, its row locks released; and the relay's own TCP connections, to PostgreSQL and to the
//! broker, probe a silent peer within the same bound (relay/src/connect/tcp_keepalive.rs). The
//! partition scenarios (partition.rs) show the keepalives at work.

use std::time::{Duration, Instant};

use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::{self, DatabaseTarget, SessionBounds};
use outbox_tests::{db, process, sockets, unique};
use sqlx::{Connection, PgConnection, Row};

fn target(url: &str) -> DatabaseTarget {
    DatabaseTarget::from_url(SecretUrl::parse(url, UrlKind::Postgres).expect("a URL"))
}

async fn setting(conn: &mut PgConnection, name: &str) -> String {
    sqlx::query("SELECT current_setting($1)")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("SHOW {name}: {e}"))
        .get(0)
}

#[tokio::test]
async fn a_new_session_carries_the_bounds_and_the_urls_own_options_win() {
    let url = outbox_tests::database_url();
    // Over TCP (the keepalive settings read 0 on a Unix socket).
    let mut conn = database::connect(&target(&url)).await.expect("connect");
    for (name, want) in [
        ("idle_in_transaction_session_timeout", "30s"),
        ("tcp_keepalives_idle", "5"),
        ("tcp_keepalives_interval", "3"),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", "15000"),
    ] {
        assert_eq!(setting(&mut conn, name).await, want, "{name}");
    }
    conn.close().await.ok();

    let separator = if url.contains('?') { '&' } else { '?' };
    let with_options =
        format!("{url}{separator}options=-c%20idle_in_transaction_session_timeout%3D7000");
    let mut conn = database::connect(&target(&with_options))
        .await
        .expect("connect with options");
    assert_eq!(
        setting(&mut conn, "idle_in_transaction_session_timeout").await,
        "7s",
        "the URL's options must win"
    );
    assert_eq!(setting(&mut conn, "tcp_keepalives_idle").await, "5");

    // Without bounds (a transaction pool): the server's own values stay.
    let mut plain = database::connect(&target(&url).with_session_bounds(None))
        .await
        .expect("connect without bounds");
    assert_eq!(
        setting(&mut plain, "idle_in_transaction_session_timeout").await,
        "0"
    );
}

#[tokio::test]
async fn a_session_idle_in_its_transaction_past_the_bound_is_ended_and_its_locks_go() {
    let mut admin = db::connect().await;
    let table = "session_bounds_idle";
    db::exec(
        &mut admin,
        &format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id int primary key); \
             INSERT INTO {table} VALUES (1)"
        ),
    )
    .await;
    let bounds = SessionBounds {
        idle_in_transaction: Duration::from_secs(1),
        ..SessionBounds::default()
    };
    let target = target(&outbox_tests::database_url()).with_session_bounds(Some(bounds));
    let mut stalled = database::connect(&target).await.expect("connect");
    let mut tx = stalled.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {table} FOR UPDATE"
    )))
    .fetch_all(&mut *tx)
    .await
    .expect("claim");

    // Another session cannot take the row while the claim is held, and can once the server
    // ended the stalled session.
    let started = Instant::now();
    let taken = loop {
        let free: i64 = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM (SELECT id FROM {table} FOR UPDATE SKIP LOCKED) t"
        )))
        .fetch_one(&mut admin)
        .await
        .expect("count")
        .get(0);
        if free == 1 || started.elapsed() > Duration::from_secs(10) {
            break free;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    assert_eq!(taken, 1, "the row was still locked after {took:?}");
    assert!(
        took >= Duration::from_millis(800),
        "released after {took:?}, before the bound"
    );
    // The stalled batch cannot settle: its session is gone.
    let settle = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
        .execute(&mut *tx)
        .await;
    assert!(
        settle.is_err(),
        "a settle after the server ended the session"
    );
    drop(tx);
    db::exec(&mut admin, &format!("DROP TABLE {table}")).await;
}

/// The port a URL names (both test URLs name theirs).
fn port_of(url: &str) -> u16 {
    url::Url::parse(url)
        .expect("a URL")
        .port()
        .expect("the test URLs name their port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_own_connections_notice_a_silent_peer_within_the_dead_client_bound() {
    let name = unique("keepalive");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 0).await;
    let exchange = unique("keepalive_x");
    let args = process::run_args(
        &name,
        &exchange,
        &[
            "--declare-exchange",
            "topic",
            "--workers",
            "2",
            "--dead-client-timeout",
            "9s",
        ],
    );
    let relay = process::spawn_relay(&name, &args);
    let pid = relay.pid();
    let database_port = port_of(&outbox_tests::database_url());
    let broker_port = port_of(&outbox_tests::amqp_url());

    // Two workers' sessions and the reporter's, and a broker connection per worker; each armed
    // right after its connect, so one caught in its handshake is looked at again.
    let mut last_seen = Vec::new();
    let armed = outbox_tests::wait::until(
        "every connection of the relay to PostgreSQL and the broker has its keepalives",
        Duration::from_secs(30),
        || {
            last_seen = sockets::tcp_connections_of(pid)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| [database_port, broker_port].contains(&c.peer.port()))
                .collect();
            let to = |port: u16| last_seen.iter().filter(|c| c.peer.port() == port).count();
            let ready = to(database_port) >= 3
                && to(broker_port) >= 2
                && last_seen.iter().all(|c| c.keepalive);
            async move { ready }
        },
    )
    .await;
    assert!(
        armed.is_ok(),
        "{armed:?}: {last_seen:#?}\n{}",
        relay.log_text()
    );

    // 9 s: the first probe after 3 s, three more 2 s apart; 9 s with data in flight.
    for connection in &last_seen {
        assert_eq!(connection.idle, Duration::from_secs(3), "{connection:?}");
        assert_eq!(
            connection.interval,
            Duration::from_secs(2),
            "{connection:?}"
        );
        assert_eq!(connection.probes, 3, "{connection:?}");
        assert_eq!(
            connection.user_timeout,
            Some(Duration::from_secs(9)),
            "{connection:?}"
        );
    }
}
