//! The subcommands around `run`: lag, seed (bulk and steady), migrate's report, and the
//! warning when publisher confirms are turned off.

use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use outbox_tests::{broker, db, process, unique};

#[tokio::test]
async fn lag_prints_backlog_age_and_table_health_as_text_and_json() {
    let name = unique("lag");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 321).await;
    db::exec(
        &mut conn,
        &format!(
            "UPDATE {} SET occurred_on_utc = now() - interval '90 seconds'",
            table.name.quoted()
        ),
    )
    .await;
    let url = outbox_tests::database_url();
    let (code, text, err) =
        process::run_relay_command(&["lag", "--database-url", &url, "--table", &name]).await;
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("backlog: 321\n"), "{text}");
    // The server's own version (the matrix runs this against every major).
    let number = db::scalar_i64(
        &mut conn,
        "SELECT current_setting('server_version_num')::bigint",
    )
    .await;
    let version = format!("{}.{}", number / 10_000, number % 10_000);
    assert!(
        text.contains(&format!("server: PostgreSQL {version}\n")),
        "{text}"
    );
    assert!(text.contains("oldest pending age: 9"), "{text}");
    // The table's health follows; the shared server's horizon belongs to whoever runs now.
    for line in [
        "cleanup horizon: ",
        "tuples: ",
        "autovacuum: on for the server",
    ] {
        assert!(text.contains(line), "{text}");
    }

    let (code, json, _) = process::run_relay_command(&[
        "lag",
        "--database-url",
        &url,
        "--table",
        &name,
        "--json",
        "--cap",
        "100",
    ])
    .await;
    assert_eq!(code, 0);
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["backlog"], 100);
    assert_eq!(value["backlogCapped"], true);
    assert!(value["oldestAgeSeconds"].as_f64().unwrap() >= 90.0);
    assert_eq!(value["tableHealth"]["server_autovacuum"], true, "{value}");
    assert_eq!(value["serverVersion"], version.as_str(), "{value}");
}

#[tokio::test]
async fn seed_loads_in_bulk_and_at_a_steady_rate() {
    let name = unique("seed");
    let url = outbox_tests::database_url();
    let (code, out, err) = process::run_relay_command(&[
        "seed",
        "--database-url",
        &url,
        "--table",
        &name,
        "--create-table",
        "--rows",
        "5000",
        "--payload-bytes",
        "300",
        "--quiet",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("inserted 5000 rows"), "{out}");
    let mut conn = db::connect().await;
    let t = db::table(&name).name.quoted();
    assert_eq!(
        db::scalar_i64(&mut conn, &format!("SELECT count(*) FROM {t}")).await,
        5000
    );
    let size = db::scalar_i64(
        &mut conn,
        &format!("SELECT avg(length(content::text))::bigint FROM {t}"),
    )
    .await;
    assert!((280..=320).contains(&size), "payload size {size}");

    let started = Instant::now();
    let (code, _, err) = process::run_relay_command(&[
        "seed",
        "--database-url",
        &url,
        "--table",
        &name,
        "--rows",
        "400",
        "--rate",
        "200",
        "--quiet",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1800),
        "400 rows at 200/s took only {took:?}"
    );
    assert_eq!(
        db::scalar_i64(&mut conn, &format!("SELECT count(*) FROM {t}")).await,
        5400
    );
}

/// With a partition-key column mapped, seeded rows take turns over `--keys` keys, in bulk and
/// at a rate alike, so per-key ordering can be tried on them.
#[tokio::test]
async fn seed_fills_the_partition_key_over_the_given_keys() {
    let name = unique("seed_keys");
    let url = outbox_tests::database_url();
    let keyed = |extra: &'static [&'static str]| {
        let mut args = vec![
            "seed",
            "--database-url",
            &url,
            "--table",
            &name,
            "--ordering",
            "per-key",
            "--partition-key-column",
            "aggregate_id",
            "--keys",
            "7",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    for extra in [
        &["--create-table", "--rows", "700"][..],
        &["--rows", "70", "--rate", "500"][..],
    ] {
        let args = keyed(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = process::run_relay_command(&args).await;
        assert_eq!(code, 0, "{extra:?}: {err}");
    }
    let mut conn = db::connect().await;
    let t = db::table(&name).name.quoted();
    let per_key: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT aggregate_id, count(*) FROM {t} GROUP BY 1 ORDER BY 1"
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let expected: Vec<(String, i64)> = (0..7).map(|k| (format!("order-{k}"), 110)).collect();
    assert_eq!(per_key, expected);

    let (code, _, err) = process::run_relay_command(&[
        "seed",
        "--database-url",
        &url,
        "--table",
        &name,
        "--rows",
        "1",
        "--keys",
        "0",
    ])
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("invalid --keys: must be at least 1"), "{err}");
}

#[tokio::test]
async fn migrate_says_what_it_did() {
    let name = unique("migcli");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 10).await;
    let (code, out, err) = process::migrate_with_notify(&name).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("created index {name}_pending_idx")),
        "{out}"
    );
    assert!(out.contains("installed the NOTIFY trigger"), "{out}");
    // Again, NOTIFY included: idempotent on every major (no `CREATE OR REPLACE TRIGGER`, which
    // PostgreSQL 13 lacks), and still one trigger.
    let (code, out, err) = process::migrate_with_notify(&name).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("already present and valid"), "{out}");
    let mut conn = db::connect().await;
    let triggers = db::scalar_i64(
        &mut conn,
        &format!(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = '{}'::regclass AND NOT tgisinternal",
            table.name.quoted()
        ),
    )
    .await;
    assert_eq!(triggers, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_off_warns_loudly_and_still_relays() {
    let name = unique("noconf");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 500).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay(
        &name,
        &[
            "run",
            "--table",
            &name,
            "--exchange",
            &name,
            "--publisher-confirms",
            "false",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(consumer.wait_for(500, Duration::from_secs(30)).await, 500);
    assert_eq!(relay.terminate(Duration::from_secs(20)).await, Some(0));
    let log = relay.log_text();
    assert!(log.contains("publisher confirms are OFF"), "{log}");
    assert!(log.contains("WARN"), "{log}");
    consumer.close().await;
}

#[tokio::test]
async fn flags_override_the_environment_which_overrides_the_file() {
    let (file_table, env_table, flag_table) = (unique("file"), unique("env"), unique("flag"));
    for name in [&file_table, &env_table, &flag_table] {
        db::seeded_table(&db::table(name), 1).await;
    }
    let url = outbox_tests::database_url();
    let config = std::env::temp_dir().join(format!("{file_table}.yaml"));
    std::fs::write(
        &config,
        format!("database_url: {url}\ntable: {file_table}\n"),
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();

    let (_, out, err) = process::run_relay_command(&["lag", "--config", &config]).await;
    assert!(out.contains(&format!("table: {file_table}")), "{out}{err}");
    let env = [("OUTBOX_RELAY_TABLE", env_table.as_str())];
    let (_, out, _) =
        process::run_relay_command_with_env(&["lag", "--config", &config], &env).await;
    assert!(out.contains(&format!("table: {env_table}")), "{out}");
    let (_, out, _) = process::run_relay_command_with_env(
        &["lag", "--config", &config, "--table", &flag_table],
        &env,
    )
    .await;
    assert!(out.contains(&format!("table: {flag_table}")), "{out}");
}
