//! Bad input: every case exits 2 with a one-line error naming the option, never prints a
//! password, and leaves the database untouched.

use outbox_tests::ports::{PG_PORT, RABBITMQ_PORT};
use outbox_tests::{db, process, unique};

const PASSWORD: &str = "S3cret!Pw";

fn db_url() -> String {
    // Trust authentication ignores the password, so the URL works and still carries a secret.
    format!("postgres://postgres:S3cret%21Pw@127.0.0.1:{PG_PORT}/test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_names_the_field_and_writes_nothing() {
    let schema = unique("bad");
    let table_name = format!("{schema}.outbox");
    let table = db::table(&table_name);
    let mut conn = db::seeded_table(&table, 25).await;
    // A second table whose id is not a uuid.
    let wrong = format!("{schema}.wrong_ids");
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {schema}.wrong_ids (id bigint PRIMARY KEY, type text, content jsonb, occurred_on_utc timestamptz, processed_on_utc timestamptz, error text)"
        ),
    )
    .await;
    let config_dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&config_dir).unwrap();
    let unknown_key = config_dir.join("unknown.yaml");
    std::fs::write(
        &unknown_key,
        format!("table: {table_name}\nbatch_sise: 10\n"),
    )
    .unwrap();
    let truncated = config_dir.join("truncated.yaml");
    std::fs::write(&truncated, "table: [outbox\ncolumns:\n  id").unwrap();
    let wrong_shape = config_dir.join("shape.yaml");
    std::fs::write(&wrong_shape, "- table\n- outbox\n").unwrap();

    let url = db_url();
    let amqp = const_format::formatcp!("amqp://guest:S3cret!Pw@127.0.0.1:{RABBITMQ_PORT}/%2f");
    let unknown_key = unknown_key.to_string_lossy().into_owned();
    let truncated = truncated.to_string_lossy().into_owned();
    let wrong_shape = wrong_shape.to_string_lossy().into_owned();
    let missing_table = format!("{schema}.missing");
    let with_urls = |db: &str, broker: &str, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--database-url",
            db,
            "--amqp-url",
            broker,
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let base = |extra: &[&str]| with_urls(&url, amqp, extra);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&["--table", "outbox; drop table x"]), "--table"),
        (base(&["--table", "tab le"]), "--table"),
        (base(&["--table", "tablé"]), "--table"),
        (base(&["--table", &"t".repeat(64)]), "--table"),
        (base(&["--table", ""]), "--table"),
        (base(&["--table", &missing_table]), "--table"),
        (
            base(&["--table", &table_name, "--payload-column", "nope"]),
            "--payload-column",
        ),
        (
            base(&["--table", &table_name, "--error-column", "x\"y"]),
            "--error-column",
        ),
        (
            base(&["--table", &wrong, "--batch-size", "10"]),
            "--id-column",
        ),
        (
            base(&["--table", &table_name, "--batch-size", "0"]),
            "--batch-size",
        ),
        (
            base(&["--table", &table_name, "--batch-size", "-5"]),
            "--batch-size",
        ),
        (
            base(&["--table", &table_name, "--batch-size", "99999999999"]),
            "--batch-size",
        ),
        (
            base(&["--table", &table_name, "--workers", "0"]),
            "--workers",
        ),
        (
            base(&["--table", &table_name, "--max-attempts", "-1"]),
            "--max-attempts",
        ),
        (
            base(&["--table", &table_name, "--mode", "archive"]),
            "--mode",
        ),
        (
            base(&["--table", &table_name, "--publish-timeout", "soon"]),
            "--publish-timeout",
        ),
        (
            with_urls(
                "mysql://root:S3cret!Pw@h/db",
                amqp,
                &["--table", &table_name],
            ),
            "--database-url",
        ),
        (
            with_urls("postgres://:S3cret!Pw@/db", amqp, &["--table", &table_name]),
            "--database-url",
        ),
        (
            with_urls(&url, "amqp://", &["--table", &table_name]),
            "--amqp-url",
        ),
        (
            with_urls(
                &url,
                "ftp://guest:S3cret!Pw@host",
                &["--table", &table_name],
            ),
            "--amqp-url",
        ),
        (base(&["--config", &unknown_key]), "batch_sise"),
        (base(&["--config", &truncated]), "--config"),
        (base(&["--config", &wrong_shape]), "--config"),
        (
            vec![
                "migrate".into(),
                "--database-url".into(),
                url.clone(),
                "--table".into(),
                "a b".into(),
            ],
            "--table",
        ),
        (
            vec![
                "seed".into(),
                "--database-url".into(),
                url.clone(),
                "--table".into(),
                table_name.clone(),
                "--rows".into(),
                "0".into(),
            ],
            "--rows",
        ),
        (
            vec![
                "lag".into(),
                "--database-url".into(),
                url.clone(),
                "--table".into(),
                table_name.clone(),
                "--cap".into(),
                "0".into(),
            ],
            "--cap",
        ),
    ];

    let rows_before = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM {}", table.name.quoted()),
    )
    .await;
    for (args, field) in &cases {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = process::run_relay_command(&argv).await;
        assert_eq!(code, 2, "{args:?} exited {code}: {stderr}");
        assert!(
            stderr.contains(field),
            "{args:?}: error does not name {field}: {stderr}"
        );
        assert!(
            stderr.trim().lines().count() <= 3,
            "{args:?}: error is not short: {stderr}"
        );
        for text in [&stdout, &stderr] {
            assert!(
                !text.contains(PASSWORD) && !text.contains("S3cret%21Pw"),
                "{args:?} printed a password: {text}"
            );
        }
    }

    // Nothing was written: same rows, nothing processed, no index, no report table.
    let t = table.name.quoted();
    assert_eq!(
        db::scalar_i64(&mut conn, &format!("SELECT count(*) FROM {t}")).await,
        rows_before
    );
    assert_eq!(db::pending(&mut conn, &table).await, rows_before);
    let indexes = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM pg_indexes WHERE schemaname = '{schema}' AND indexname LIKE '%pending%'"),
    )
    .await;
    assert_eq!(indexes, 0);
    let reports = db::scalar_i64(&mut conn, &format!("SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}' AND tablename = 'outbox_relay_reports'")).await;
    assert_eq!(reports, 0);
}
