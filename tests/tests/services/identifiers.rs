//! Any identifier the validator accepts names exactly that object in PostgreSQL: quoting
//! round-trips case, digits and underscores unchanged.

use outbox_relay::table::ident::{Ident, TableName};
use outbox_tests::{db, unique};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
fn fuzz_accepted_identifiers_round_trip_through_postgresql() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let schema = unique("idents");
    let mut conn = runtime.block_on(db::connect());
    runtime.block_on(db::exec(&mut conn, &format!("CREATE SCHEMA {schema}")));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let conn = tokio::sync::Mutex::new(conn);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    runner
        .run(&"[A-Za-z_][A-Za-z0-9_]{0,62}", |name| {
            let ident = Ident::new(&name).expect("the generator only makes valid names");
            let table = TableName::parse(&format!("{schema}.{name}")).unwrap();
            let stored: String = runtime.block_on(async {
                let mut conn = conn.lock().await;
                db::exec(&mut conn, &format!("DROP TABLE IF EXISTS {0}; CREATE TABLE {0} ({1} int)", table.quoted(), ident.quoted()))
                    .await;
                sqlx::query_scalar(
                    "SELECT c.relname::text || '/' || a.attname::text FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid \
                     WHERE c.oid = to_regclass($1) AND a.attnum = 1",
                )
                .bind(table.quoted())
                .fetch_one(&mut *conn)
                .await
                .unwrap()
            });
            prop_assert_eq!(stored, format!("{name}/{name}"));
            Ok(())
        })
        .unwrap();
    runtime.block_on(db::exec(
        &mut conn.blocking_lock(),
        &format!("DROP SCHEMA {schema} CASCADE"),
    ));
}
