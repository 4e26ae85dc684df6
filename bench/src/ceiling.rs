//! The ceiling: the same messages published straight to the broker with confirms, no database.
//! Each connection has one confirm channel and publishes batches pipelined, then awaits every
//! confirm, exactly as the relay does, so the only thing missing is the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_relay::tools::seed::ARTICLE_TYPE;
use uuid::Uuid;

use crate::measure::{Measurement, sample_in_process};

/// Messages per pipelined batch, the relay's default batch size.
const BATCH: usize = 500;

async fn publish_until_stopped(
    amqp_url: String,
    exchange: String,
    payloads: Arc<Vec<Vec<u8>>>,
    published: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        // Queued in order on the first poll, written in large batches: see the relay's publisher.
        let publishes = (0..BATCH).map(|i| {
            let payload = &payloads[(next + i) % payloads.len()];
            let properties = BasicProperties::default()
                .with_message_id(Uuid::now_v7().to_string().into())
                .with_type(ARTICLE_TYPE.into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2)
                .with_timestamp(chrono::Utc::now().timestamp() as u64);
            channel.basic_publish(
                exchange.as_str().into(),
                ARTICLE_TYPE.into(),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
        });
        let confirms = join_all(publishes)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        next += BATCH;
        for confirm in confirms {
            if !confirm.await?.is_ack() {
                anyhow::bail!("the broker nacked a message");
            }
        }
        published.fetch_add(BATCH as u64, Ordering::Relaxed);
    }
    connection.close(200, "done".into()).await?;
    Ok(())
}

/// Publishes over `connections` connections for `window` and measures the confirmed rate.
pub async fn run(
    amqp_url: &str,
    exchange: &str,
    payloads: Arc<Vec<Vec<u8>>>,
    connections: usize,
    window: Duration,
) -> anyhow::Result<Measurement> {
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..connections)
        .map(|_| {
            tokio::spawn(publish_until_stopped(
                amqp_url.to_string(),
                exchange.to_string(),
                payloads.clone(),
                published.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let measured = sample_in_process(&published, window, None).await;
    stop.store(true, Ordering::Relaxed);
    for result in join_all(publishers).await {
        result??;
    }
    measured
}
