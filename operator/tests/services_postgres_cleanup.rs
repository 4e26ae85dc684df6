//! The cleanup of a deleted OutboxRelay on the local PostgreSQL: `delete` removes what the
//! migration created (index, NOTIFY trigger and function, the relay's report rows, the
//! autovacuum settings it set) and releases the claim; `retain` only releases the claim; the
//! outbox rows are never touched. Each test has a schema of its own.

use outbox_operator::reconcile::database::claims::{Claim, Release, claim_table};
use outbox_operator::reconcile::database::postgres::PostgresDatabase;
use outbox_operator::reconcile::database::{
    CleanupRequest, CleanupRun, MigrationRun, RelayDatabase,
};
use outbox_operator::reconcile::input::validate::{RelayPlan, validate};
use outbox_operator::{Error, OutboxRelaySpec};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::DatabaseTarget;

mod common;

use common::{CANARY, OwnSchema, connect, database_url, execute};

const RELAY: &str = "shop/orders";

fn target() -> DatabaseTarget {
    DatabaseTarget::from_url(SecretUrl::parse(&database_url(), UrlKind::Postgres).unwrap())
}

async fn scalar<T>(sql: String) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut connect().await)
        .await
        .unwrap()
}

fn plan(table: &str, notify: bool) -> RelayPlan {
    let spec: OutboxRelaySpec = serde_json::from_value(serde_json::json!({
        "database": {"urlSecretRef": {"name": "db"}, "table": table, "notifyTrigger": notify},
        "broker": {"urlSecretRef": {"name": "amqp"}},
    }))
    .unwrap();
    validate(&spec).unwrap()
}

/// An outbox table with three rows, migrated as the operator does (NOTIFY trigger on), claimed
/// by [`RELAY`], with a report row of [`RELAY`] and one of another relay sharing the schema's
/// report table.
async fn migrated_table() -> (OwnSchema, String, RelayPlan) {
    let own_schema = OwnSchema::create().await;
    let schema = own_schema.name();
    let table = format!("{schema}.outbox");
    execute(format!(
        "CREATE TABLE {table} (id uuid PRIMARY KEY, \
         type varchar(255) NOT NULL, content jsonb NOT NULL, occurred_on_utc timestamptz NOT NULL, \
         processed_on_utc timestamptz NULL, error text NULL); \
         INSERT INTO {table} SELECT gen_random_uuid(), 't', '{{}}', now(), NULL, NULL \
         FROM generate_series(1, 3)"
    ))
    .await;
    let plan = plan(&table, true);
    let run = PostgresDatabase::default()
        .migrate(&target(), &plan, RELAY)
        .await
        .unwrap();
    assert!(matches!(run, MigrationRun::Migrated(_)), "{run:?}");
    let claim = claim_table(&mut connect().await, &plan.table.name, RELAY)
        .await
        .unwrap();
    assert_eq!(claim, Claim::Held);
    execute(format!(
        "INSERT INTO {schema}.outbox_relay_reports (relay, pod) \
         VALUES ('{RELAY}', 'orders-1'), ('{RELAY}', 'orders-2'), ('shop/billing', 'billing-1')"
    ))
    .await;
    (own_schema, table, plan)
}

/// What the migration left on `table`, as the cleanup should find or leave it.
#[derive(Debug, PartialEq)]
struct Leftovers {
    index: bool,
    trigger: bool,
    function: bool,
    report_rows: i64,
    other_report_rows: i64,
    autovacuum_settings: i64,
    claims: i64,
    outbox_rows: i64,
}

async fn leftovers(schema: &str, table: &str) -> Leftovers {
    Leftovers {
        index: scalar(format!(
            "SELECT to_regclass('{schema}.outbox_pending_idx') IS NOT NULL"
        ))
        .await,
        trigger: scalar(format!(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{table}'::regclass \
             AND tgname = 'outbox_outbox_notify')"
        ))
        .await,
        function: scalar(format!(
            "SELECT to_regprocedure('{schema}.outbox_outbox_notify()') IS NOT NULL"
        ))
        .await,
        report_rows: scalar(format!(
            "SELECT count(*) FROM {schema}.outbox_relay_reports WHERE relay = '{RELAY}'"
        ))
        .await,
        other_report_rows: scalar(format!(
            "SELECT count(*) FROM {schema}.outbox_relay_reports WHERE relay <> '{RELAY}'"
        ))
        .await,
        autovacuum_settings: scalar(format!(
            "SELECT count(*) FROM pg_class, unnest(reloptions) o \
             WHERE oid = '{table}'::regclass AND o LIKE 'autovacuum%'"
        ))
        .await,
        claims: scalar(format!("SELECT count(*) FROM {schema}.outbox_relay_claims")).await,
        outbox_rows: scalar(format!("SELECT count(*) FROM {table}")).await,
    }
}

async fn clean_up(plan: &RelayPlan, relay: &str, remove_migration: bool) -> CleanupRun {
    let request = CleanupRequest {
        relay_name: relay.into(),
        remove_migration,
    };
    PostgresDatabase::default()
        .clean_up(&target(), plan, request)
        .await
        .unwrap_or_else(|e| panic!("the cleanup failed: {e}"))
}

#[tokio::test]
async fn delete_removes_what_the_migration_created_and_leaves_the_rows() {
    let (schema, table, plan) = migrated_table().await;
    let before = leftovers(schema.name(), &table).await;
    assert_eq!(
        before,
        Leftovers {
            index: true,
            trigger: true,
            function: true,
            report_rows: 2,
            other_report_rows: 1,
            autovacuum_settings: 6,
            claims: 1,
            outbox_rows: 3,
        }
    );
    // A setting the user changed after the migration is theirs, and stays.
    execute(format!(
        "ALTER TABLE {table} SET (autovacuum_vacuum_threshold = 1234)"
    ))
    .await;

    let run = clean_up(&plan, RELAY, true).await;
    assert_eq!(run.claim, Release::Released);
    let report = run.removed.expect("the migration was undone");
    assert_eq!(report.index_dropped.as_deref(), Some("outbox_pending_idx"));
    assert!(
        report.trigger_dropped && report.function_dropped,
        "{report:?}"
    );
    assert_eq!(report.report_rows_deleted, 2);
    assert_eq!(report.autovacuum_reset.len(), 5, "{report:?}");
    assert_eq!(
        leftovers(schema.name(), &table).await,
        Leftovers {
            index: false,
            trigger: false,
            function: false,
            report_rows: 0,
            other_report_rows: 1,
            autovacuum_settings: 1,
            claims: 0,
            outbox_rows: 3,
        }
    );

    // Another OutboxRelay takes the table at once, without waiting for an expiry.
    let claim = claim_table(&mut connect().await, &plan.table.name, "shop/orders-v2")
        .await
        .unwrap();
    assert_eq!(claim, Claim::Held);
    // A repeated cleanup (a retry after a lost answer) finds nothing left and fails on nothing.
    let again = clean_up(&plan, RELAY, true).await;
    assert_eq!(again.claim, Release::HeldBy("shop/orders-v2".into()));
    assert!(again.removed.is_none(), "{again:?}");
}

#[tokio::test]
async fn retain_only_releases_the_claim() {
    let (schema, table, plan) = migrated_table().await;
    let run = clean_up(&plan, RELAY, false).await;
    assert_eq!(
        run,
        CleanupRun {
            claim: Release::Released,
            removed: None
        }
    );
    assert_eq!(
        leftovers(schema.name(), &table).await,
        Leftovers {
            index: true,
            trigger: true,
            function: true,
            report_rows: 2,
            other_report_rows: 1,
            autovacuum_settings: 6,
            claims: 0,
            outbox_rows: 3,
        }
    );
}

#[tokio::test]
async fn a_relay_that_never_held_the_table_leaves_the_holders_objects_alone() {
    let (schema, table, plan) = migrated_table().await;
    // shop/orders holds the table; a second OutboxRelay on it (refused with
    // TableClaimedByAnotherRelay) is deleted with cleanupPolicy delete.
    let run = clean_up(&plan, "shop/orders-copy", true).await;
    assert_eq!(run.claim, Release::HeldBy(RELAY.into()));
    assert!(run.removed.is_none(), "{run:?}");
    let after = leftovers(schema.name(), &table).await;
    assert!(
        after.index && after.trigger && after.claims == 1,
        "{after:?}"
    );
}

#[tokio::test]
async fn an_unreachable_database_fails_the_attempt_without_the_password() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener); // nothing listens there any more
    let url = format!("postgres://app:{CANARY}@127.0.0.1:{port}/orders?connect_timeout=2");
    let target = DatabaseTarget::from_url(SecretUrl::parse(&url, UrlKind::Postgres).unwrap());
    let request = CleanupRequest {
        relay_name: RELAY.into(),
        remove_migration: true,
    };
    let error = PostgresDatabase::default()
        .clean_up(&target, &plan("outbox", false), request)
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, Error::DatabaseUnreachable(_)), "{error:?}");
    assert!(!error.to_string().contains(CANARY), "{error}");
}
