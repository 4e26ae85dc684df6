//! Load generation: `outbox-relay seed`. Bulk loads use COPY (the reference article seeded
//! 2,000,000 rows that way); `--rate` inserts steadily in small transactions, like a service.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::table::outbox::OutboxTable;

/// The reference article's message type.
pub const ARTICLE_TYPE: &str = "Messaging.Contracts.OrderCreatedIntegrationEvent";

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
    if let Some(col) = &c.partition_key {
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
/// backslashes are doubled as COPY requires.
fn copy_line(out: &mut Vec<u8>, id: Uuid, kind: &str, body: &str, occurred: &str) {
    out.extend_from_slice(id.to_string().as_bytes());
    out.push(b'\t');
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(body.replace('\\', "\\\\").as_bytes());
    out.push(b'\t');
    out.extend_from_slice(occurred.as_bytes());
    out.push(b'\n');
}

/// Bulk-loads `rows` rows with COPY in chunks, calling `progress` after each chunk.
pub async fn copy_rows(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rows: u64,
    payload_bytes: usize,
    mut progress: impl FnMut(u64),
) -> Result<(), sqlx::Error> {
    let c = &table.columns;
    let statement = format!(
        "COPY {} ({}, {}, {}, {}) FROM STDIN",
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
            copy_line(
                &mut buffer,
                id,
                ARTICLE_TYPE,
                &payload(id, payload_bytes),
                &occurred.to_rfc3339(),
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
/// transactions every 10 ms, like a service writing its outbox. Returns rows inserted.
pub async fn insert_at_rate(
    conn: &mut PgConnection,
    table: &OutboxTable,
    rate: f64,
    rows: u64,
    payload_bytes: usize,
    mut progress: impl FnMut(u64),
) -> Result<u64, sqlx::Error> {
    let c = &table.columns;
    let sql = format!(
        "INSERT INTO {} ({}, {}, {}, {}) SELECT u.id, $2, u.body::jsonb, clock_timestamp() \
         FROM unnest($1::uuid[], $3::text[]) AS u(id, body)",
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
            let bodies: Vec<String> = ids.iter().map(|id| payload(*id, payload_bytes)).collect();
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(&ids)
                .bind(ARTICLE_TYPE)
                .bind(&bodies)
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
