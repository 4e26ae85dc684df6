//! The limits table: per relay, the share of its OutboxRelay's `spec.relay.maxRate` that each
//! pod may publish. The operator writes it (maxRate divided among the pods it runs, see the
//! operator's `rate_share`), before it adds pods and after it removed them; the pods read it at
//! start and at every report, and hold the smaller of it and their own `--max-rate`.
//!
//! A table of its own rather than a value in the pod template, which would roll every pod at
//! each scale. It sits next to the report table, in the outbox table's schema, and is created
//! by the same migration step. A relay started by hand may be given a share the same way: one
//! row per relay name.

use sqlx::{AssertSqlSafe, PgConnection};

use crate::table::ident::TableName;

pub fn create_table_sql(limits: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
           relay text PRIMARY KEY, \
           per_pod_rate double precision NOT NULL CHECK (per_pod_rate > 0), \
           max_rate double precision, \
           replicas integer, \
           updated_at timestamptz NOT NULL DEFAULT now())",
        limits.quoted()
    )
}

/// One relay's row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateShare {
    /// Messages per second each pod may publish.
    pub per_pod_rate: f64,
    /// The relay-wide limit it was divided from, and among how many pods: for people reading
    /// the table.
    pub max_rate: f64,
    pub replicas: i32,
}

/// The per-pod share written for `relay`; None when there is no row, or no limits table yet (a
/// table migrated by an earlier version: no share can have been written then). Two statements,
/// so a missing table never fails the caller's transaction.
pub async fn read_share(
    conn: &mut PgConnection,
    limits: &TableName,
    relay: &str,
    persistent: bool,
) -> Result<Option<f64>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(limits.quoted())
        .persistent(persistent)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(None);
    }
    let sql = format!(
        "SELECT per_pod_rate FROM {} WHERE relay = $1",
        limits.quoted()
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(relay)
        .persistent(persistent)
        .fetch_optional(&mut *conn)
        .await
}

/// Writes `relay`'s share, or removes its row (`None`: no limit).
pub async fn write_share(
    conn: &mut PgConnection,
    limits: &TableName,
    relay: &str,
    share: Option<RateShare>,
) -> Result<(), sqlx::Error> {
    let t = limits.quoted();
    match share {
        Some(share) => {
            let sql = format!(
                "INSERT INTO {t} (relay, per_pod_rate, max_rate, replicas, updated_at) \
                 VALUES ($1, $2, $3, $4, now()) ON CONFLICT (relay) DO UPDATE SET \
                 per_pod_rate = EXCLUDED.per_pod_rate, max_rate = EXCLUDED.max_rate, \
                 replicas = EXCLUDED.replicas, updated_at = now()"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(relay)
                .bind(share.per_pod_rate)
                .bind(share.max_rate)
                .bind(share.replicas)
                .execute(&mut *conn)
                .await?;
        }
        None => delete_share(conn, limits, relay).await?,
    }
    Ok(())
}

/// Removes `relay`'s row, if the table exists.
pub async fn delete_share(
    conn: &mut PgConnection,
    limits: &TableName,
    relay: &str,
) -> Result<(), sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(limits.quoted())
        .fetch_one(&mut *conn)
        .await?;
    if exists {
        let sql = format!("DELETE FROM {} WHERE relay = $1", limits.quoted());
        sqlx::query(AssertSqlSafe(sql))
            .bind(relay)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
