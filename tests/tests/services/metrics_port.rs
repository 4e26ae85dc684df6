//! The metrics address of a local relay: loopback by default, a free port when the default is
//! taken (competing relays on one host are the scaling model), exit 2 when a given one is.

use std::time::Duration;

use outbox_tests::{db, http, process, unique};

/// `run` arguments without `--metrics-addr`, so the default applies.
fn default_addr_args<'a>(table: &'a str, exchange: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--table",
        table,
        "--exchange",
        exchange,
        "--declare-exchange",
        "topic",
        "--poll-interval",
        "50ms",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_with_the_default_address_both_run_on_loopback() {
    // Hold the default port, as a first relay (or anything else) on this host would; if
    // something else holds it already the situation is the same.
    let _holder = std::net::TcpListener::bind(outbox_relay::defaults::METRICS_ADDR);
    let name = unique("mport");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 0).await;
    let exchange = unique("mport_x");
    let args = default_addr_args(&name, &exchange);
    let mut relays = [
        process::spawn_relay(&format!("{name}-a"), &args),
        process::spawn_relay(&format!("{name}-b"), &args),
    ];
    let mut addrs = Vec::new();
    for relay in &relays {
        let addr = relay.metrics_addr().await;
        let log = relay.log_text();
        assert!(
            log.contains("the default metrics port 9090 is taken")
                && log.contains(&format!(
                    "serving on port {}",
                    addr.rsplit(':').next().unwrap()
                )),
            "{log}"
        );
        // Loopback, not every interface.
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        assert_ne!(addr, "127.0.0.1:9090");
        let (code, _) = http::get(&addr, "/healthz").await;
        assert_eq!(code, 200, "{log}");
        addrs.push(addr);
    }
    assert_ne!(addrs[0], addrs[1]);
    for relay in &mut relays {
        assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    }
}

#[tokio::test]
async fn a_given_metrics_address_that_is_taken_exits_2() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let name = unique("mtaken");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 0).await;
    let db_url = outbox_tests::database_url();
    let amqp_url = outbox_tests::amqp_url();
    let mut args = default_addr_args(&name, "outbox");
    args.extend([
        "--database-url",
        db_url.as_str(),
        "--amqp-url",
        amqp_url.as_str(),
        "--metrics-addr",
        taken.as_str(),
    ]);
    let (code, _, stderr) =
        tokio::time::timeout(Duration::from_secs(20), process::run_relay_command(&args))
            .await
            .expect("the relay exits at once");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("invalid --metrics-addr: cannot listen on {taken}")),
        "{stderr}"
    );
}
