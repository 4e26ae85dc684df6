//! Lag reports: every pod reports its rate, exactly one measures the backlog, stopped pods
//! remove their row, and the same figures are on /metrics.

use std::time::Duration;

use outbox_relay::table::reports::{read_reports, summarize};
use outbox_tests::http::{get as http_get, metrics_addr};
use outbox_tests::{db, process, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_measures_every_pod_reports_and_stopped_pods_leave() {
    let name = unique("reports");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 1_234).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    // The exchange does not exist, so nothing is relayed and the backlog stays put; the
    // reporter works without the broker.
    let missing_exchange = unique("nowhere");
    let args = |pod: &'static str| {
        vec![
            "run".to_string(),
            "--table".into(),
            name.clone(),
            "--exchange".into(),
            missing_exchange.clone(),
            "--report-interval".into(),
            "500ms".into(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            "--pod-name".into(),
            pod.into(),
        ]
    };
    let a_args = args("pod-a");
    let b_args = args("pod-b");
    let mut a = process::spawn_relay(
        &format!("{name}-a"),
        &a_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut b = process::spawn_relay(
        &format!("{name}-b"),
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    let reports_table = table.reports_table();
    let both = outbox_tests::wait::holds("both relays reported", Duration::from_secs(20), || {
        let (t, n) = (reports_table.clone(), name.clone());
        async move {
            read_reports(&mut db::connect().await, &t, &n, 30.0)
                .await
                .unwrap()
                .len()
                == 2
        }
    })
    .await;
    assert!(
        both,
        "both pods should report:\n{}\n{}",
        a.log_text(),
        b.log_text()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reports = read_reports(&mut conn, &reports_table, &name, 30.0)
        .await
        .unwrap();
    let measuring: Vec<_> = reports.iter().filter(|r| r.backlog.is_some()).collect();
    assert_eq!(measuring.len(), 1, "exactly one pod measures: {reports:?}");
    let lag = summarize(&reports);
    assert_eq!(lag.backlog.unwrap().pending, 1_234);
    assert!(!lag.backlog.unwrap().capped);
    assert_eq!(lag.reporting_pods, 2);

    // The measuring pod shows the backlog on /metrics; both say they are not ready (no broker).
    let measurer_log = if measuring[0].pod == "pod-a" {
        a.log_text()
    } else {
        b.log_text()
    };
    let addr = metrics_addr(&measurer_log).expect("the relay logs its metrics address");
    let (code, metrics) = http_get(&addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("outbox_relay_backlog 1234"), "{metrics}");
    assert_eq!(http_get(&addr, "/healthz").await.0, 200);
    let (ready, body) = http_get(&addr, "/readyz").await;
    assert_eq!(ready, 503, "{body}");
    assert!(body.contains("broker: not connected"), "{body}");

    // A stopping pod removes its row; the other one takes over the measuring.
    let measurer_is_a = measuring[0].pod == "pod-a";
    let (stopping, staying) = if measurer_is_a {
        (&mut a, "pod-b")
    } else {
        (&mut b, "pod-a")
    };
    assert_eq!(stopping.terminate(Duration::from_secs(20)).await, Some(0));
    let took_over = outbox_tests::wait::holds(
        "the other relay measures the backlog",
        Duration::from_secs(20),
        || {
            let (t, n) = (reports_table.clone(), name.clone());
            async move {
                let reports = read_reports(&mut db::connect().await, &t, &n, 30.0)
                    .await
                    .unwrap();
                reports.len() == 1 && reports[0].pod == staying && reports[0].backlog.is_some()
            }
        },
    )
    .await;
    assert!(took_over, "the remaining pod should measure");
    for relay in [&mut a, &mut b] {
        if relay.child.try_wait().unwrap().is_none() {
            relay.terminate(Duration::from_secs(20)).await;
        }
    }
}

#[tokio::test]
async fn reports_of_pods_that_stopped_reporting_age_out() {
    let name = unique("aging");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .unwrap();
    let reports = table.reports_table().quoted();
    db::exec(
        &mut conn,
        &format!(
            "INSERT INTO {reports} (relay, pod, reported_at, publish_rate) VALUES
               ('{name}', 'fresh', now(), 5), ('{name}', 'stale', now() - interval '30 seconds', 7),
               ('{name}', 'dead', now() - interval '1 hour', 9)"
        ),
    )
    .await;
    let seen = read_reports(&mut conn, &table.reports_table(), &name, 10.0)
        .await
        .unwrap();
    assert_eq!(
        seen.iter().map(|r| r.pod.as_str()).collect::<Vec<_>>(),
        vec!["fresh"]
    );
    assert_eq!(summarize(&seen).publish_rate, 5.0);
    let left = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM {reports} WHERE relay = '{name}'"),
    )
    .await;
    assert_eq!(
        left, 2,
        "rows ten times older than the limit are deleted; stale ones are only ignored"
    );
}
