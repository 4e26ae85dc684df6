//! Load generation: `outbox-relay seed`. Bulk loads use COPY (the reference article seeded
//! 2,000,000 rows that way); `--rate` inserts steadily in small transactions, like a service.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::table::outbox::OutboxTable;

/// The reference article's message type.
pub const ARTICLE_TYPE: &str = "Messaging.Contracts.OrderCreatedIntegrationEvent";

/// Distinct partition keys of seeded rows when the table maps a partition-key column and no
/// count is given: enough for per-key ordering to run many keys in parallel.
pub const DEFAULT_KEYS: u64 = 1000;

/// The partition key of the `n`-th seeded row: `keys` values taking turns, so the events of
/// one aggregate are interleaved with the others', as a busy service writes them.
pub fn partition_key(n: u64, keys: u64) -> String {
    format!("order-{}", n % keys.max(1))
}

/// SQL creating the reference article's table (and its schema) with the configured column names.
pub fn create_table_sql(table: &OutboxTable) -> Vec<String> {
    let c = &table.columns;
    let mut statements = Vec::new();
    if let Some(schema) = &table.name.schema {
        statements.push(format!("CREATE SCHEMA IF NOT EXISTS {}", schema.quoted()));
    }
    let mut extra = String::new();
    if let Some(col) = &c.routing_key {
        extra.push_str(&format!(", {} text NULL", col.quoted()));
    }
    if let Some(col) = &c.headers {
        extra.push_str(&format!(", {} jsonb NULL", col.quoted()));
    }
    if let Some(col) = &c.attempts {
        extra.push_str(&format!(", {} integer NOT NULL DEFAULT 0", col.quoted()));
    }
    for col in [&c.partition_key, &c.traceparent, &c.tracestate]
        .into_iter()
        .flatten()
    {
        extra.push_str(&format!(", {} text NULL", col.quoted()));
    }
    statements.push(format!(
        "CREATE TABLE IF NOT EXISTS {} ({} uuid PRIMARY KEY, {} varchar(255) NOT NULL, {} jsonb, \
         {} timestamptz NOT NULL DEFAULT now(), {} timestamptz NULL, {} text NULL{extra})",
        table.name.quoted(),
        c.id.quoted(),
        c.kind.quoted(),
        c.payload.quoted(),
        c.occurred_at.quoted(),
        c.processed_at.quoted(),
        c.error.quoted(),
    ));
    statements
}

pub async fn create_table(conn: &mut PgConnection, table: &OutboxTable) -> Result<(), sqlx::Error> {
    for sql in create_table_sql(table) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// A JSON payload of about `bytes` bytes: the article's `{"OrderId":"…"}` padded as needed.
pub fn payload(id: Uuid, bytes: usize) -> String {
    let base = format!("{{\"OrderId\":\"{id}\"}}");
    if bytes <= base.len() + 10 {
        return base;
    }
    let pad = bytes - base.len() - 10;
    format!("{{\"OrderId\":\"{id}\",\"pad\":\"{}\"}}", "x".repeat(pad))
}

/// Appends one COPY text-format line; JSON never contains tabs or newlines unescaped, and
/// backslashes are doubled as COPY requires. The key, when given, is a seeded `order-N`.
fn copy_line(
    out: &mut Vec<u8>,
    id: Uuid,
    kind: &str,
    body: &str,
    occurred: &str,
    key: Option<&str>,
) {
    out.extend_from_slice(id.to_string().as_bytes());
    out.push(b'\t');
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(body.replace('\\', "\\\\").as_bytes());
    out.push(b'\t');
    out.extend_from_slice(occurred.as_bytes());
    if let Some(key) = key {
        out.push(b'\t');
        out.extend_from_slice(key.as_bytes());
    }
    out.push(b'\n');
}

/// Bulk-loads `rows` rows with COPY in chunks, calling `progress` after each chunk. A mapped
/// partition-key column gets [`DEFAULT_KEYS`] keys.
pub async fn copy_rows(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rows: u64,
    payload_bytes: usize,
    progress: impl FnMut(u64),
) -> Result<(), sqlx::Error> {
    let shape = RowShape {
        payload_bytes,
        keys: DEFAULT_KEYS,
    };
    copy_rows_shaped(conn, table, rows, shape, progress).await
}

/// [`copy_rows`] with the rows' shape given: `shape.keys` distinct partition keys (see
/// [`partition_key`]) when the table maps a partition-key column.
pub async fn copy_rows_shaped(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rows: u64,
    shape: RowShape,
    mut progress: impl FnMut(u64),
) -> Result<(), sqlx::Error> {
    let c = &table.columns;
    let key_column = c
        .partition_key
        .as_ref()
        .map_or(String::new(), |col| format!(", {}", col.quoted()));
    let statement = format!(
        "COPY {} ({}, {}, {}, {}{key_column}) FROM STDIN",
        table.name.quoted(),
        c.id.quoted(),
        c.kind.quoted(),
        c.payload.quoted(),
        c.occurred_at.quoted()
    );
    let start = chrono::Utc::now();
    let mut copy = conn.copy_in_raw(&statement).await?;
    let mut buffer = Vec::with_capacity(1 << 20);
    let mut done = 0u64;
    while done < rows {
        let chunk = (rows - done).min(10_000);
        buffer.clear();
        for i in 0..chunk {
            let id = Uuid::now_v7();
            // Distinct, increasing timestamps keep the claim order well defined.
            let occurred = start + chrono::Duration::microseconds((done + i) as i64);
            let key = c
                .partition_key
                .as_ref()
                .map(|_| partition_key(done + i, shape.keys));
            copy_line(
                &mut buffer,
                id,
                ARTICLE_TYPE,
                &payload(id, shape.payload_bytes),
                &occurred.to_rfc3339(),
                key.as_deref(),
            );
        }
        copy.send(buffer.as_slice()).await?;
        done += chunk;
        progress(done);
    }
    copy.finish().await?;
    Ok(())
}

/// Inserts rows steadily at `rate` rows/s for `duration` (or until `rows` rows), in small
/// transactions every 10 ms, like a service writing its outbox. Returns rows inserted. A
/// mapped partition-key column gets [`DEFAULT_KEYS`] keys.
pub async fn insert_at_rate(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rate: f64,
    rows: u64,
    payload_bytes: usize,
    progress: impl FnMut(u64),
) -> Result<u64, sqlx::Error> {
    let shape = RowShape {
        payload_bytes,
        keys: DEFAULT_KEYS,
    };
    insert_shaped_at_rate(conn, table, rate, rows, shape, progress).await
}

/// What seeded rows look like besides their table.
#[derive(Debug, Clone, Copy)]
pub struct RowShape {
    /// Approximate payload size (see [`payload`]).
    pub payload_bytes: usize,
    /// Distinct partition keys, when the table maps a partition-key column.
    pub keys: u64,
}

/// [`insert_at_rate`] with the rows' shape given.
pub async fn insert_shaped_at_rate(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rate: f64,
    rows: u64,
    shape: RowShape,
    mut progress: impl FnMut(u64),
) -> Result<u64, sqlx::Error> {
    let c = &table.columns;
    let (key_column, key_value) = c.partition_key.as_ref().map_or_else(
        || (String::new(), String::new()),
        |col| (format!(", {}", col.quoted()), ", u.key".to_string()),
    );
    let sql = format!(
        "INSERT INTO {} ({}, {}, {}, {}{key_column}) \
         SELECT u.id, $2, u.body::jsonb, clock_timestamp(){key_value} \
         FROM unnest($1::uuid[], $3::text[], $4::text[]) AS u(id, body, key)",
        table.name.quoted(),
        c.id.quoted(),
        c.kind.quoted(),
        c.payload.quoted(),
        c.occurred_at.quoted()
    );
    let started = Instant::now();
    let tick = Duration::from_millis(10);
    let mut inserted = 0u64;
    while inserted < rows {
        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(rows);
        if due > inserted {
            let count = due - inserted;
            let ids: Vec<Uuid> = (0..count).map(|_| Uuid::now_v7()).collect();
            let bodies: Vec<String> = ids
                .iter()
                .map(|id| payload(*id, shape.payload_bytes))
                .collect();
            let keys: Vec<String> = (inserted..due)
                .map(|n| partition_key(n, shape.keys))
                .collect();
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(&ids)
                .bind(ARTICLE_TYPE)
                .bind(&bodies)
                .bind(&keys)
                .execute(&mut *conn)
                .await?;
            inserted = due;
            progress(inserted);
        }
        tokio::time::sleep(tick).await;
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_reach_the_requested_size() {
        let id = Uuid::nil();
        assert_eq!(payload(id, 0), format!("{{\"OrderId\":\"{id}\"}}"));
        let big = payload(id, 300);
        assert!((295..=305).contains(&big.len()), "{}", big.len());
        assert!(serde_json::from_str::<serde_json::Value>(&big).is_ok());
    }
}
