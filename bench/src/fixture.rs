//! The outbox table of a measurement: created in the reference article's shape, seeded on the
//! server (generate_series, no client round trips), migrated with the relay's own migration,
//! vacuumed so every measurement starts from the same clean state, and dropped afterwards.

use outbox_relay::table::ident::{Ident, TableName};
use outbox_relay::table::migrate::{MigrationOptions, migrate};
use outbox_relay::table::{DeliveryMode, OutboxTable};
use outbox_relay::tools::seed::ARTICLE_TYPE;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::workload::Workload;

/// Rows inserted per statement while seeding: large enough to be fast, small enough that one
/// transaction does not hold gigabytes of WAL.
const SEED_CHUNK: u64 = 250_000;

/// The partition-key column of a keyed fixture (see [`Fixture::create`]).
pub const KEY_COLUMN: &str = "aggregate_id";

pub struct Fixture {
    pub table: OutboxTable,
    pub workload: Workload,
    pub database_url: String,
    /// How many distinct partition keys the rows have, in [`KEY_COLUMN`]; None: no such column.
    pub keys: Option<u64>,
}

impl Fixture {
    /// Creates, seeds and migrates a fresh table. `migration` chooses the NOTIFY trigger and
    /// whether the queue-friendly autovacuum settings are applied. With `keys`, the rows also
    /// get a partition key in [`KEY_COLUMN`], `keys` distinct values taking turns row by row
    /// (one aggregate's events interleaved with the others', as a busy service writes them).
    pub async fn create(
        database_url: &str,
        name: &str,
        workload: Workload,
        rows: u64,
        mode: DeliveryMode,
        migration: &MigrationOptions,
        keys: Option<u64>,
    ) -> anyhow::Result<Self> {
        Self::create_with_history(database_url, name, workload, rows, 0, mode, migration, keys)
            .await
    }

    /// [`Fixture::create`], with `processed` rows already relayed too (in mark mode), dated a
    /// day before the pending ones: a table that has kept its history.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_with_history(
        database_url: &str,
        name: &str,
        workload: Workload,
        rows: u64,
        processed: u64,
        mode: DeliveryMode,
        migration: &MigrationOptions,
        keys: Option<u64>,
    ) -> anyhow::Result<Self> {
        let mut table = OutboxTable::new(TableName::parse(name)?);
        table.mode = mode;
        if keys.is_some() {
            table.columns.partition_key = Some(Ident::new(KEY_COLUMN)?);
        }
        let fixture = Self {
            table,
            workload,
            database_url: database_url.to_string(),
            keys,
        };
        let mut conn = fixture.connect().await?;
        let t = fixture.table.name.quoted();
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {t}")))
            .execute(&mut conn)
            .await?;
        // The primary key is added after the load: one sorted build instead of two million
        // random inserts into a uuid B-tree.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {t} (id uuid NOT NULL, type varchar(255) NOT NULL, content jsonb, \
             occurred_on_utc timestamptz NOT NULL DEFAULT now(), processed_on_utc timestamptz NULL, \
             error text NULL{key})",
            key = match keys {
                Some(_) => format!(", {KEY_COLUMN} text NULL"),
                None => String::new(),
            }
        )))
        .execute(&mut conn)
        .await?;
        fixture.insert(&mut conn, rows).await?;
        fixture.insert_processed(&mut conn, processed).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {t} ADD PRIMARY KEY (id)"
        )))
        .execute(&mut conn)
        .await?;
        migrate(&mut conn, &fixture.table, migration).await?;
        fixture.vacuum_with(&mut conn).await?;
        Ok(fixture)
    }

    pub async fn connect(&self) -> anyhow::Result<PgConnection> {
        Ok(PgConnection::connect(&self.database_url).await?)
    }

    pub fn name(&self) -> String {
        self.table.name.to_string()
    }

    /// Inserts `rows` more pending rows with increasing, distinct claim timestamps.
    pub async fn insert(&self, conn: &mut PgConnection, rows: u64) -> anyhow::Result<()> {
        let (key_column, key_value) = match self.keys {
            Some(keys) => (
                format!(", {KEY_COLUMN}"),
                format!(", 'order-' || (g % {keys})"),
            ),
            None => (String::new(), String::new()),
        };
        let sql = format!(
            "INSERT INTO {} (id, type, content, occurred_on_utc{key_column}) \
             SELECT u, $1, {}, clock_timestamp() + g * interval '1 microsecond'{key_value} \
             FROM (SELECT gen_random_uuid() AS u, g FROM generate_series($2::bigint, $3::bigint) AS g) AS s",
            self.table.name.quoted(),
            self.workload.content_sql()
        );
        insert_in_chunks(conn, &sql, rows).await
    }

    /// Inserts `rows` rows already processed a day ago, in chunks as [`Fixture::insert`] does.
    async fn insert_processed(&self, conn: &mut PgConnection, rows: u64) -> anyhow::Result<()> {
        let sql = format!(
            "INSERT INTO {} (id, type, content, occurred_on_utc, processed_on_utc) \
             SELECT u, $1, {}, o, o + interval '1 second' \
             FROM (SELECT gen_random_uuid() AS u, g, \
                          now() - interval '1 day' + g * interval '1 microsecond' AS o \
                   FROM generate_series($2::bigint, $3::bigint) AS g) AS s",
            self.table.name.quoted(),
            self.workload.content_sql()
        );
        insert_in_chunks(conn, &sql, rows).await
    }

    /// VACUUM ANALYZE: clears the dead index entries an earlier measurement left, so each
    /// measurement starts from the same clean index.
    pub async fn vacuum(&self) -> anyhow::Result<()> {
        let mut conn = self.connect().await?;
        self.vacuum_with(&mut conn).await
    }

    async fn vacuum_with(&self, conn: &mut PgConnection) -> anyhow::Result<()> {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "VACUUM ANALYZE {}",
            self.table.name.quoted()
        )))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Rows still pending.
    pub async fn pending(&self) -> anyhow::Result<i64> {
        let mut conn = self.connect().await?;
        Ok(sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE processed_on_utc IS NULL",
            self.table.name.quoted()
        )))
        .fetch_one(&mut conn)
        .await?)
    }

    /// Rows settled with an error (in mark mode the relay keeps them with their error).
    pub async fn failed(&self) -> anyhow::Result<i64> {
        let mut conn = self.connect().await?;
        Ok(sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE error IS NOT NULL",
            self.table.name.quoted()
        )))
        .fetch_one(&mut conn)
        .await?)
    }

    /// Drops the table and the relay's lag report rows for it.
    pub async fn drop_table(&self) -> anyhow::Result<()> {
        let mut conn = self.connect().await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {} CASCADE",
            self.table.name.quoted()
        )))
        .execute(&mut conn)
        .await?;
        let reports = self.table.reports_table().quoted();
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {reports} WHERE relay = $1"
        )))
        .bind(self.table.name.to_string())
        .execute(&mut conn)
        .await;
        // The NOTIFY trigger's function outlives the table.
        let function = self.table.name.derived("outbox_notify").quoted();
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP FUNCTION IF EXISTS {function}()"
        )))
        .execute(&mut conn)
        .await;
        Ok(())
    }
}

/// Runs `sql` (an INSERT … SELECT over generate_series($2, $3), the type bound as $1) over
/// `rows` rows in [`SEED_CHUNK`]s.
async fn insert_in_chunks(conn: &mut PgConnection, sql: &str, rows: u64) -> anyhow::Result<()> {
    let mut done = 0u64;
    while done < rows {
        let chunk = (rows - done).min(SEED_CHUNK);
        sqlx::query(AssertSqlSafe(sql.to_string()))
            .bind(ARTICLE_TYPE)
            .bind((done + 1) as i64)
            .bind((done + chunk) as i64)
            .execute(&mut *conn)
            .await?;
        done += chunk;
    }
    Ok(())
}

/// Sample payloads generated by the same SQL as the seeded rows, for the no-database ceiling.
pub async fn sample_payloads(
    database_url: &str,
    workload: Workload,
    count: u64,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut conn = PgConnection::connect(database_url).await?;
    let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT ({})::text FROM (SELECT gen_random_uuid() AS u, g FROM generate_series(1, $1::bigint) AS g) AS s",
        workload.content_sql()
    )))
    .bind(count as i64)
    .fetch_all(&mut conn)
    .await?;
    Ok(rows.into_iter().map(String::into_bytes).collect())
}
