//! The migration against the real PostgreSQL: idempotent, repairs INVALID indexes, safe when
//! run concurrently, and never makes large payloads uninsertable.

use outbox_relay::table::OutboxTable;
use outbox_relay::table::migrate::{
    IndexAction, MigrateError, MigrationOptions, index_name, migrate,
};
use outbox_tests::{db, process, unique};
use rand::Rng;
use sqlx::PgConnection;

async fn index_state(
    conn: &mut PgConnection,
    table: &OutboxTable,
    options: &MigrationOptions,
) -> Option<(bool, String)> {
    sqlx::query_as("SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indexrelid = to_regclass($1)")
        .bind(index_name(table, options).quoted())
        .fetch_optional(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn migration_is_idempotent() {
    let name = unique("mig");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 100).await;
    let options = MigrationOptions::default();
    let first = migrate(&mut conn, &table, &options).await.unwrap();
    assert_eq!(first.index, IndexAction::Created);
    assert!(first.autovacuum_changed);
    let second = migrate(&mut conn, &table, &options).await.unwrap();
    assert_eq!(second.index, IndexAction::AlreadyValid);
    // Whether autovacuum runs is the server's setting; the report must say what it is.
    let server_off: bool = sqlx::query_scalar(
        "SELECT bool_or(setting = 'off') FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(second.server_autovacuum_off, server_off);
    assert!(!second.reports_table_created);
    assert!(first.frontier_created, "the relays' shared claim frontier");
    assert!(!second.frontier_created);
    assert!(!second.autovacuum_changed);
    let (valid, def) = index_state(&mut conn, &table, &options).await.unwrap();
    assert!(valid);
    assert!(
        def.contains("(occurred_on_utc) INCLUDE (id) WHERE (processed_on_utc IS NULL)"),
        "{def}"
    );
    let reloptions: Vec<String> =
        sqlx::query_scalar("SELECT unnest(reloptions) FROM pg_class WHERE oid = to_regclass($1)")
            .bind(table.name.quoted())
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(
        reloptions.contains(&"autovacuum_vacuum_scale_factor=0".to_string()),
        "{reloptions:?}"
    );
}

#[tokio::test]
async fn an_invalid_index_is_dropped_and_rebuilt() {
    let name = unique("inval");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 100).await;
    let options = MigrationOptions::default();
    // A failed concurrent build leaves an INVALID index behind under the name the migration
    // uses: a UNIQUE index over duplicate values fails after the catalog entry exists.
    db::exec(
        &mut conn,
        &format!("UPDATE {} SET type = 'same'", table.name.quoted()),
    )
    .await;
    let failed = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE UNIQUE INDEX CONCURRENTLY {} ON {} (type)",
        index_name(&table, &options).quoted(),
        table.name.quoted()
    )))
    .execute(&mut conn)
    .await;
    assert!(failed.is_err());
    assert_eq!(
        index_state(&mut conn, &table, &options).await.map(|s| s.0),
        Some(false)
    );

    let report = migrate(&mut conn, &table, &options).await.unwrap();
    assert_eq!(report.index, IndexAction::RebuiltInvalid);
    assert!(report.lines()[0].contains("INVALID"));
    let (valid, def) = index_state(&mut conn, &table, &options).await.unwrap();
    assert!(valid);
    assert!(def.contains("WHERE (processed_on_utc IS NULL)"), "{def}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_are_safe() {
    let name = unique("conc");
    let table = db::table(&name);
    let _conn = db::seeded_table(&table, 200_000).await;
    let options = MigrationOptions::default();
    let run = || {
        let table = table.clone();
        let options = options.clone();
        async move {
            let mut conn = db::connect().await;
            migrate(&mut conn, &table, &options).await
        }
    };
    let (a, b) = tokio::join!(run(), run());
    let outcomes = [a, b];
    let succeeded = outcomes.iter().filter(|r| r.is_ok()).count();
    assert!(succeeded >= 1);
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Ok(_) | Err(MigrateError::LockBusy)),
            "{outcome:?}"
        );
    }
    let mut conn = db::connect().await;
    assert_eq!(
        index_state(&mut conn, &table, &options).await.map(|s| s.0),
        Some(true)
    );

    // Two CLI migrations at once both succeed: the second waits for the lock and finds the work done.
    let name2 = unique("conc_cli");
    let table2 = db::table(&name2);
    let _conn2 = db::seeded_table(&table2, 200_000).await;
    let url = outbox_tests::database_url();
    let args = [
        "migrate",
        "--database-url",
        url.as_str(),
        "--table",
        name2.as_str(),
    ];
    let (first, second) = tokio::join!(
        process::run_relay_command(&args),
        process::run_relay_command(&args)
    );
    assert_eq!(first.0, 0, "{}", first.2);
    assert_eq!(second.0, 0, "{}", second.2);
}

#[tokio::test]
async fn the_blocking_lock_is_never_taken() {
    let name = unique("busy");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10).await;
    // Another session holds the migration lock; the migration must answer at once.
    let mut holder = db::connect().await;
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-relay:migrate:{}", table.name.quoted()))
        .execute(&mut holder)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let result = migrate(&mut conn, &table, &MigrationOptions::default()).await;
    assert!(matches!(result, Err(MigrateError::LockBusy)), "{result:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

fn incompressible(len: usize) -> String {
    let mut rng = rand::rng();
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

async fn insert_large(conn: &mut PgConnection, table: &OutboxTable) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (id, type, content, occurred_on_utc) VALUES (gen_random_uuid(), 'big', jsonb_build_object('blob', $1::text), now())",
        table.name.quoted()
    )))
    .bind(incompressible(10 * 1024))
    .execute(conn)
    .await
    .map(|_| ())
}

#[tokio::test]
async fn a_ten_kilobyte_payload_can_still_be_inserted_after_migration() {
    let name = unique("big");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10).await;
    migrate(&mut conn, &table, &MigrationOptions::default())
        .await
        .unwrap();
    insert_large(&mut conn, &table)
        .await
        .expect("a 10 KB row must insert with the default index");

    // The article's covering index is why the default keeps the payload out of the index.
    let covering_name = unique("cover");
    let covering = db::table(&covering_name);
    let mut conn2 = db::seeded_table(&covering, 10).await;
    let options = MigrationOptions {
        covering_index: true,
        ..Default::default()
    };
    migrate(&mut conn2, &covering, &options).await.unwrap();
    let err = insert_large(&mut conn2, &covering)
        .await
        .expect_err("the covering index refuses large rows");
    assert!(err.to_string().contains("index row"), "{err}");
}

/// Creates the reference columns with an id that nothing keeps unique, plus `extra` (an index
/// or constraint statement, `{t}` for the table), and runs `outbox-relay migrate` on it.
async fn migrate_cli_with_id(name: &str, extra: &str) -> (i32, String, String, PgConnection) {
    let mut conn = db::connect().await;
    let t = format!("\"{name}\"");
    db::exec(
        &mut conn,
        &format!(
            "CREATE TABLE {t} (id uuid NOT NULL, type varchar(255) NOT NULL, content jsonb, \
             occurred_on_utc timestamptz NOT NULL, processed_on_utc timestamptz NULL, error text NULL)"
        ),
    )
    .await;
    if !extra.is_empty() {
        db::exec(&mut conn, &extra.replace("{t}", &t)).await;
    }
    let url = outbox_tests::database_url();
    let (code, stdout, stderr) =
        process::run_relay_command(&["migrate", "--database-url", &url, "--table", name]).await;
    (code, stdout, stderr, conn)
}

#[tokio::test]
async fn an_id_without_a_unique_index_is_refused() {
    let table = db::table(&unique("noid"));
    let name = table.name.to_string();
    let (code, _, stderr, mut conn) = migrate_cli_with_id(&name, "").await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "column id of table {name} has no primary key or unique index"
        )) && stderr.contains("add PRIMARY KEY (id)"),
        "{stderr}"
    );
    // Refused before anything was built.
    let options = MigrationOptions::default();
    assert_eq!(index_state(&mut conn, &table, &options).await, None);

    // Neither a composite unique key nor a partial unique index keeps the id unique.
    for extra in [
        "CREATE UNIQUE INDEX ON {t} (id, type)",
        "CREATE UNIQUE INDEX ON {t} (id) WHERE processed_on_utc IS NULL",
    ] {
        let name = unique("weakid");
        let (code, _, stderr, _) = migrate_cli_with_id(&name, extra).await;
        assert_eq!(code, 2, "{extra}: {stderr}");
    }
}

#[tokio::test]
async fn an_id_with_a_unique_index_is_accepted() {
    for extra in [
        "CREATE UNIQUE INDEX ON {t} (id)",
        "ALTER TABLE {t} ADD CONSTRAINT {t}_id_unique UNIQUE (id)",
    ] {
        let name = unique("uniqid");
        let extra = extra.replace("{t}_id_unique", &format!("\"{name}_u\""));
        let (code, stdout, stderr, _) = migrate_cli_with_id(&name, &extra).await;
        assert_eq!(code, 0, "{extra}: {stderr}");
        assert!(stdout.contains("created"), "{stdout}");
    }
}

/// A concurrent index build is slow by nature (here it waits on a writer's open transaction):
/// `migrate` says what it does in its own words, and sqlx's "slow statement" warning stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_index_build_prints_no_slow_statement_warning() {
    let name = unique("slowmig");
    let table = db::table(&name);
    let mut writer = db::seeded_table(&table, 1_000).await;
    // An open writing transaction: CREATE INDEX CONCURRENTLY waits for it to end.
    db::exec(&mut writer, "BEGIN").await;
    outbox_relay::tools::seed::copy_rows(&mut writer, &table, 1, 50, |_| {})
        .await
        .unwrap();
    let migration = tokio::spawn({
        let name = name.clone();
        async move {
            let started = std::time::Instant::now();
            let outcome = process::run_relay_command_with_env(
                &["migrate", "--table", &name],
                &[
                    ("DATABASE_URL", &outbox_tests::database_url()),
                    ("RUST_LOG", "info"),
                ],
            )
            .await;
            (outcome, started.elapsed())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    db::exec(&mut writer, "COMMIT").await;
    let ((code, stdout, stderr), took) = migration.await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    // It did wait: the statement ran past sqlx's 1 s slow-statement threshold.
    assert!(
        took.as_millis() >= 2_000,
        "the build did not wait ({took:?})"
    );
    assert!(!stderr.contains("slow statement"), "{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
}

/// The first migrations of several outbox tables in a fresh schema run at once (a team creating
/// its OutboxRelays together): the report table they share is made once, and no migration
/// fails on the `CREATE TABLE IF NOT EXISTS` race (a unique violation on pg_type).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_migrations_of_a_schemas_tables_at_once_share_one_report_table() {
    let schema = unique("fresh");
    let mut admin = db::connect().await;
    db::exec(&mut admin, &format!("CREATE SCHEMA {schema}")).await;
    let tables: Vec<OutboxTable> = (0..6)
        .map(|i| db::table(&format!("{schema}.outbox_{i}")))
        .collect();
    for table in &tables {
        db::seeded_table(table, 0).await;
    }
    let runs = tables.iter().map(|table| async move {
        let mut conn = db::connect().await;
        migrate(&mut conn, table, &MigrationOptions::default()).await
    });
    let outcomes = futures::future::join_all(runs).await;
    let mut created = 0;
    for outcome in &outcomes {
        match outcome {
            Ok(report) => created += usize::from(report.reports_table_created),
            Err(error) => panic!("a concurrent first migration failed: {error:?}"),
        }
    }
    assert_eq!(
        created, 1,
        "the report table was said to be created {created} times"
    );
    db::exec(&mut admin, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
