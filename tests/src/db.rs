//! A test's own outbox table on the real PostgreSQL.

use std::time::Duration;

use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::{Ident, TableName};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

pub async fn connect() -> PgConnection {
    PgConnection::connect(&crate::database_url())
        .await
        .expect(const_format::formatcp!(
            "PostgreSQL must run on 127.0.0.1:{} (make services)",
            crate::ports::PG_PORT
        ))
}

/// A connection to the server `url` names (a test's own server: a standby pair, a major).
pub async fn connect_to(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Runs one statement (or several, simple protocol) and panics with the SQL on failure.
pub async fn exec(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_string()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub async fn scalar_i64(conn: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Creates a reference-shaped table (with the given mapping) and loads `rows` rows.
pub async fn seeded_table(table: &OutboxTable, rows: u64) -> PgConnection {
    seed_on(connect().await, table, rows).await
}

/// [`seeded_table`] on the server `url` names rather than the tests' own.
pub async fn seeded_table_in(url: &str, table: &OutboxTable, rows: u64) -> PgConnection {
    seed_on(connect_to(url).await, table, rows).await
}

async fn seed_on(mut conn: PgConnection, table: &OutboxTable, rows: u64) -> PgConnection {
    outbox_relay::tools::seed::create_table(&mut conn, table)
        .await
        .expect("create table");
    if rows > 0 {
        outbox_relay::tools::seed::copy_rows(&mut conn, table, rows, 50, |_| {})
            .await
            .expect("seed rows");
    }
    conn
}

pub fn table(name: &str) -> OutboxTable {
    OutboxTable::new(TableName::parse(name).expect("valid test table name"))
}

/// A table with the attempts column `attempts`, seeded with `rows`: with `--max-attempts 1` a
/// broker's state counted as the message's fault would dead-letter at once.
pub async fn attempts_table(name: &str, rows: u64) -> (OutboxTable, PgConnection) {
    let mut table = table(name);
    table.columns.attempts = Some(Ident::new("attempts").expect("a valid column name"));
    let conn = seeded_table(&table, rows).await;
    (table, conn)
}

/// Rows of an [`attempts_table`] with an error or a spent attempt: refused or dead-lettered.
pub async fn refused_rows(conn: &mut PgConnection, table: &OutboxTable) -> i64 {
    let t = table.name.quoted();
    scalar_i64(
        conn,
        &format!("SELECT count(*) FROM {t} WHERE error IS NOT NULL OR attempts <> 0"),
    )
    .await
}

/// The longest pause between two batches settling, for a fault no consumer watched throughout
/// (a broker failover, where the consumer can only attach afterwards). The relay marks a
/// batch's rows with its transaction's start, so this is the time between the last claim that
/// settled before the fault and the first that settled after it.
pub async fn longest_settling_gap(conn: &mut PgConnection, table: &OutboxTable) -> Duration {
    let (t, processed) = (table.name.quoted(), table.columns.processed_at.quoted());
    let sql = format!(
        "SELECT coalesce(max(gap), 0)::float8 FROM (
           SELECT extract(epoch FROM mark - lag(mark) OVER (ORDER BY mark)) AS gap
             FROM (SELECT DISTINCT {processed} AS mark FROM {t} WHERE {processed} IS NOT NULL) marks
         ) gaps"
    );
    let seconds: f64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    Duration::from_secs_f64(seconds)
}

/// Pending rows (processed-at NULL).
pub async fn pending(conn: &mut PgConnection, table: &OutboxTable) -> i64 {
    scalar_i64(
        conn,
        &format!(
            "SELECT count(*) FROM {} WHERE {} IS NULL",
            table.name.quoted(),
            table.columns.processed_at.quoted()
        ),
    )
    .await
}

/// Ids of rows that are marked processed.
pub async fn processed_ids(conn: &mut PgConnection, table: &OutboxTable) -> Vec<uuid::Uuid> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT {} FROM {} WHERE {} IS NOT NULL",
        table.columns.id.quoted(),
        table.name.quoted(),
        table.columns.processed_at.quoted()
    )))
    .fetch_all(conn)
    .await
    .expect("processed ids")
}

pub async fn all_ids(conn: &mut PgConnection, table: &OutboxTable) -> Vec<uuid::Uuid> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT {} FROM {}",
        table.columns.id.quoted(),
        table.name.quoted()
    )))
    .fetch_all(conn)
    .await
    .expect("ids")
}

/// Waits until no row of `table` is pending; false when `timeout` passed first.
pub async fn wait_until_drained(table: &OutboxTable, timeout: std::time::Duration) -> bool {
    wait_until_drained_in(&crate::database_url(), table, timeout).await
}

/// [`wait_until_drained`] for a table in another database than the tests' own.
pub async fn wait_until_drained_in(
    database_url: &str,
    table: &OutboxTable,
    timeout: std::time::Duration,
) -> bool {
    crate::wait::holds("the table is drained", timeout, || {
        let table = table.clone();
        async move {
            let mut conn = connect_to(database_url).await;
            pending(&mut conn, &table).await == 0
        }
    })
    .await
}

/// A database of the test's own, for what PostgreSQL keeps per database — above all the
/// cleanup horizon, which every other test's transactions would move. Dropped by
/// [`PrivateDatabase::drop_now`] (with FORCE, so sessions left open do not keep it).
pub struct PrivateDatabase {
    pub name: String,
    /// The test server's URL with this database in place of the one `DATABASE_URL` names.
    pub url: String,
}

impl PrivateDatabase {
    pub async fn create(prefix: &str) -> Self {
        let name = crate::unique(prefix);
        exec(&mut connect().await, &format!("CREATE DATABASE {name}")).await;
        let url = crate::database_url_of(&name);
        Self { name, url }
    }

    /// This URL with `user` in place of the test's own role (trust authentication here).
    pub fn url_as(&self, user: &str) -> String {
        let mut url = url::Url::parse(&self.url).expect("a URL");
        url.set_username(user).expect("a URL with a host");
        url.set_password(None).expect("a URL with a host");
        url.to_string()
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }

    pub async fn drop_now(self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        exec(&mut connect().await, &sql).await;
    }
}
