//! The reference article's starting point: claim a batch, then for each row one awaited
//! publish and one UPDATE; one worker. Kept deliberately naive: it is the baseline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, Row};
use uuid::Uuid;

use crate::fixture::Fixture;
use crate::measure::{Measurement, sample_in_process};

/// The article's batch size.
const BATCH: i64 = 1000;

async fn relay_naively(
    database_url: String,
    amqp_url: String,
    table: String,
    exchange: String,
    processed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut db = PgConnection::connect(&database_url).await?;
    let broker = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = broker.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let claim = format!(
        "SELECT id, type, content::text FROM {table} WHERE processed_on_utc IS NULL \
         ORDER BY occurred_on_utc LIMIT $1 FOR UPDATE SKIP LOCKED"
    );
    let mark = format!("UPDATE {table} SET processed_on_utc = now() WHERE id = $1");
    while !stop.load(Ordering::Relaxed) {
        let mut tx = db.begin().await?;
        let rows = sqlx::query(AssertSqlSafe(claim.clone()))
            .bind(BATCH)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let id: Uuid = row.try_get(0)?;
            let kind: String = row.try_get(1)?;
            let content: String = row.try_get(2)?;
            let properties = BasicProperties::default()
                .with_message_id(id.to_string().into())
                .with_type(kind.as_str().into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    exchange.as_str().into(),
                    kind.as_str().into(),
                    BasicPublishOptions::default(),
                    content.as_bytes(),
                    properties,
                )
                .await?;
            confirm.await?;
            sqlx::query(AssertSqlSafe(mark.clone()))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            processed.fetch_add(1, Ordering::Relaxed);
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        tx.commit().await?;
    }
    broker.close(200, "done".into()).await?;
    Ok(())
}

/// Runs the naive loop on the fixture for `window`, or until its `pending` rows are done.
pub async fn run(
    fixture: &Fixture,
    amqp_url: &str,
    exchange: &str,
    window: Duration,
    pending: u64,
) -> anyhow::Result<Measurement> {
    let processed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = tokio::spawn(relay_naively(
        fixture.database_url.clone(),
        amqp_url.to_string(),
        fixture.table.name.quoted(),
        exchange.to_string(),
        processed.clone(),
        stop.clone(),
    ));
    let measured = sample_in_process(&processed, window, Some(pending)).await;
    stop.store(true, Ordering::Relaxed);
    worker.await??;
    measured
}
