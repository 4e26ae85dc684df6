//! Rate limits (issue 47, point 4): `--max-rate` holds a relay to its limit, counted at the
//! broker; the metrics and the lag report show the limit and the time spent waiting for it; a
//! per-pod share written into the limits table (what the operator writes for
//! `spec.relay.maxRate`) is followed within a report interval, under the `--max-rate` ceiling;
//! bad values are refused. These check that the limit is applied; the figure itself is the
//! bench's (`--sweep w2-b500-r5000`).

use std::time::{Duration, Instant};

use const_format::formatcp;
use lapin::ExchangeKind;
use outbox_relay::table::limits::{RateShare, write_share};
use outbox_relay::table::reports::read_reports;
use outbox_tests::http::get as http_get;
use outbox_tests::ports::PG_PORT;
use outbox_tests::{broker, db, metrics, process, unique};

const LIMIT_METRIC: &str = "outbox_relay_rate_limit_messages_per_second";
const WAIT_METRIC: &str = "outbox_relay_rate_limit_wait_seconds_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_rate_holds_the_relay_to_its_limit() {
    let name = unique("rate");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 2_000).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let args = process::run_args(
        &name,
        &name,
        &["--max-rate", "500", "--batch-size", "100", "--workers", "2"],
    );
    let mut relay = process::spawn_relay(&name, &args);

    // Timed from the first message, so the relay's start-up does not count.
    assert!(
        consumer.wait_for(1, Duration::from_secs(30)).await >= 1,
        "{}",
        relay.log_text()
    );
    let first = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_one_second = consumer.total();
    assert_eq!(
        consumer.wait_for(2_000, Duration::from_secs(60)).await,
        2_000
    );
    let took = first.elapsed();
    // 500 msg/s with a burst of one batch (100): 1,900 rows after the first burst need 3.8 s.
    // Unlimited, this relay moves 2,000 rows in a fraction of a second.
    assert!(
        took >= Duration::from_secs(3),
        "2,000 rows at 500 msg/s arrived in {took:?}"
    );
    assert!(
        after_one_second <= 800,
        "{after_one_second} messages in the first second at 500 msg/s"
    );

    let addr = relay.metrics_addr().await;
    let (_, text) = http_get(&addr, "/metrics").await;
    assert_eq!(metrics::value(&text, LIMIT_METRIC), Some(500.0), "{text}");
    let waited = metrics::value(&text, WAIT_METRIC).unwrap_or(0.0);
    assert!(waited > 0.5, "the workers waited {waited} s: {text}");

    // The lag report carries the limit in force, for the operator.
    let reports_table = table.reports_table();
    let reported = outbox_tests::wait::holds(
        "the report names the limit",
        Duration::from_secs(10),
        || {
            let (t, n) = (reports_table.clone(), name.clone());
            async move {
                let reports = read_reports(&mut db::connect().await, &t, &n, 30.0)
                    .await
                    .unwrap();
                reports.first().and_then(|r| r.max_rate) == Some(500.0)
            }
        },
    )
    .await;
    assert!(reported, "{}", relay.log_text());

    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.assert_each_id_once(&mut conn, &table, 2_000).await;
    consumer.close().await;
}

async fn limit_in_force(addr: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics").await;
    metrics::value(&text, LIMIT_METRIC)
}

async fn wait_for_limit(addr: &str, wanted: f64, within: Duration) -> bool {
    let addr = addr.to_string();
    outbox_tests::wait::holds(&format!("the limit becomes {wanted}"), within, || {
        let addr = addr.clone();
        async move { limit_in_force(&addr).await == Some(wanted) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_in_the_limits_table_is_followed_under_the_ceiling() {
    let name = unique("share");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 300).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let limits = table.limits_table();
    let share = |per_pod_rate| {
        Some(RateShare {
            per_pod_rate,
            max_rate: per_pod_rate * 3.0,
            replicas: 3,
        })
    };
    // Written before the pod starts, as the operator does before it adds pods: the pod's first
    // claim is already within it.
    write_share(&mut conn, &limits, &name, share(40.0))
        .await
        .unwrap();
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let args = process::run_args(&name, &name, &["--max-rate", "100"]);
    let mut relay = process::spawn_relay(&name, &args);
    let addr = relay.metrics_addr().await;
    assert!(
        wait_for_limit(&addr, 40.0, Duration::from_secs(10)).await,
        "{}",
        relay.log_text()
    );
    assert!(
        relay
            .log_text()
            .contains("rate limit in force: 40 messages per second"),
        "{}",
        relay.log_text()
    );
    // 300 rows at 40 msg/s take over 6 s: two to three seconds after the first claim, far from
    // all arrived (unlimited, all 300 would have within a fraction of a second).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let early = consumer.total();
    assert!(
        (1..=220).contains(&early),
        "{early} messages in 2 to 3 s at 40 msg/s"
    );

    // A higher share is followed up to --max-rate, within a report interval or two.
    write_share(&mut conn, &limits, &name, share(1_000.0))
        .await
        .unwrap();
    assert!(
        wait_for_limit(&addr, 100.0, Duration::from_secs(3)).await,
        "{}",
        relay.log_text()
    );
    // A lower one, at once; then no row: --max-rate alone.
    write_share(&mut conn, &limits, &name, share(20.0))
        .await
        .unwrap();
    assert!(wait_for_limit(&addr, 20.0, Duration::from_secs(3)).await);
    write_share(&mut conn, &limits, &name, None).await.unwrap();
    assert!(wait_for_limit(&addr, 100.0, Duration::from_secs(3)).await);
    assert_eq!(consumer.wait_for(300, Duration::from_secs(30)).await, 300);
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_the_gauge_says_none_and_nothing_waits() {
    let name = unique("nolimit");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 1_000).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay(&name, &process::run_args(&name, &name, &[]));
    assert_eq!(
        consumer.wait_for(1_000, Duration::from_secs(30)).await,
        1_000
    );
    let addr = relay.metrics_addr().await;
    let (_, text) = http_get(&addr, "/metrics").await;
    assert_eq!(metrics::value(&text, LIMIT_METRIC), Some(0.0), "{text}");
    assert_eq!(metrics::value(&text, WAIT_METRIC), Some(0.0), "{text}");
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(db::pending(&mut conn, &table).await, 0);
    consumer.close().await;
}

#[tokio::test]
async fn bad_rates_exit_2_naming_the_setting() {
    let base = [
        "run",
        "--database-url",
        formatcp!("postgres://postgres:S3cret@127.0.0.1:{PG_PORT}/test"),
        "--amqp-url",
        outbox_tests::AMQP_URL,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    for bad in ["0", "-5", "NaN", "inf", "0.5", "2000000"] {
        let mut args = base.to_vec();
        args.extend(["--max-rate", bad]);
        process::run_relay_refusing_settings(
            &args,
            &[],
            &["invalid --max-rate", "messages per second"],
            "S3cret",
        )
        .await;
    }
    // Not a number at all: clap refuses it, naming the flag; from the environment too.
    let mut args = base.to_vec();
    args.extend(["--max-rate", "fast"]);
    process::run_relay_refusing_settings(&args, &[], &["--max-rate"], "S3cret").await;
    process::run_relay_refusing_settings(
        &base,
        &[("OUTBOX_RELAY_MAX_RATE", "0")],
        &["invalid --max-rate"],
        "S3cret",
    )
    .await;
}
