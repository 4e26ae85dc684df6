//! The ceiling: the same messages published straight to the broker with confirms, no database.
//! Each connection has one confirm channel and publishes batches pipelined, then awaits every
//! confirm, exactly as the relay does, so the only thing missing is the table.
//!
//! Under AMQP 1.0 the ceiling is the relay's own publisher (`outbox_relay::broker::amqp10`) fed
//! from memory: batches of unsettled transfers, every outcome awaited, as a worker sends them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_relay::broker::amqp10::{Amqp10Publisher, Amqp10Settings};
use outbox_relay::broker::{Delivery, Message, Publisher, Target};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
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

/// The same loop over AMQP 1.0, to `address`, through the relay's publisher.
async fn publish_amqp10_until_stopped(
    url: SecretUrl,
    address: String,
    payloads: Arc<Vec<Vec<u8>>>,
    published: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let settings = Amqp10Settings {
        address,
        timeout: Duration::from_secs(10),
        content_type: "application/json".into(),
        container_id: format!("outbox-bench ceiling {}", Uuid::now_v7()),
        tls: Default::default(),
        password_file: None,
        cloudevents: None,
    };
    let mut publisher = Amqp10Publisher::connect(&url, settings)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<Uuid> = (0..BATCH).map(|_| Uuid::now_v7()).collect();
        let timestamp = Some(chrono::Utc::now().timestamp() as u64);
        let messages: Vec<Message<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Message {
                id,
                kind: ARTICLE_TYPE,
                routing_key: ARTICLE_TYPE,
                payload: &payloads[(next + i) % payloads.len()],
                timestamp,
                headers: None,
                error: None,
                trace: Default::default(),
                occurred_at: None,
                partition_key: None,
            })
            .collect();
        let outcome = publisher.publish_batch(Target::Main, &messages).await;
        if let Some(broken) = outcome.broken {
            anyhow::bail!("the AMQP 1.0 publisher failed: {broken}");
        }
        if let Some(refused) = outcome
            .deliveries
            .iter()
            .find(|d| **d != Delivery::Confirmed)
        {
            anyhow::bail!("the broker did not accept a message: {refused:?}");
        }
        next += BATCH;
        published.fetch_add(BATCH as u64, Ordering::Relaxed);
    }
    publisher.close().await;
    Ok(())
}

/// Where the ceiling publishes.
#[derive(Debug, Clone)]
pub enum Route {
    /// AMQP 0-9-1: this exchange.
    Exchange { amqp_url: String, exchange: String },
    /// AMQP 1.0: this address.
    Address { url: String, address: String },
}

/// Publishes over `connections` connections for `window` and measures the confirmed rate.
pub async fn run(
    route: &Route,
    payloads: Arc<Vec<Vec<u8>>>,
    connections: usize,
    window: Duration,
) -> anyhow::Result<Measurement> {
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut publishers = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (payloads, published, stop) = (payloads.clone(), published.clone(), stop.clone());
        publishers.push(match route {
            Route::Exchange { amqp_url, exchange } => tokio::spawn(publish_until_stopped(
                amqp_url.clone(),
                exchange.clone(),
                payloads,
                published,
                stop,
            )),
            Route::Address { url, address } => {
                let url = SecretUrl::parse(url, UrlKind::Amqp)
                    .map_err(|e| anyhow::anyhow!("the AMQP 1.0 URL: {e}"))?;
                tokio::spawn(publish_amqp10_until_stopped(
                    url,
                    address.clone(),
                    payloads,
                    published,
                    stop,
                ))
            }
        });
    }
    let measured = sample_in_process(&published, window, None).await;
    stop.store(true, Ordering::Relaxed);
    for result in join_all(publishers).await {
        result??;
    }
    measured
}
