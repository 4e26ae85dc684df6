//! A counting consumer for demos and benchmarks: declares an exchange and a durable queue bound
//! to it, then drains the queue, counting messages (and distinct message ids when asked).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::broker::routing::ExchangeType;
use crate::connect::secret_url::SecretUrl;

pub struct Topology<'a> {
    pub exchange: &'a str,
    pub kind: ExchangeType,
    pub queue: &'a str,
    pub binding_key: &'a str,
}

fn exchange_kind(kind: ExchangeType) -> ExchangeKind {
    match kind {
        ExchangeType::Fanout => ExchangeKind::Fanout,
        ExchangeType::Topic => ExchangeKind::Topic,
        ExchangeType::Direct => ExchangeKind::Direct,
        ExchangeType::Headers => ExchangeKind::Headers,
    }
}

/// Declares the durable exchange and queue and binds them; idempotent.
pub async fn declare(channel: &Channel, topology: &Topology<'_>) -> Result<(), lapin::Error> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            topology.exchange.into(),
            exchange_kind(topology.kind),
            durable,
            FieldTable::default(),
        )
        .await?;
    let queue_options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(topology.queue.into(), queue_options, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            topology.queue.into(),
            topology.exchange.into(),
            topology.binding_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

#[derive(Debug, Clone, Default)]
pub struct ConsumeSummary {
    pub received: u64,
    pub distinct: Option<u64>,
    pub elapsed: Duration,
}

/// Consumes until `expect` messages arrived, or nothing arrived for `idle_timeout`.
/// `on_message` sees the running count (for a progress line). Acks in batches of 100.
pub async fn consume(
    url: &SecretUrl,
    topology: &Topology<'_>,
    expect: Option<u64>,
    idle_timeout: Duration,
    track_ids: bool,
    mut on_message: impl FnMut(u64),
) -> Result<ConsumeSummary, lapin::Error> {
    let connection = Connection::connect(url.expose(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    declare(&channel, topology).await?;
    channel.basic_qos(1000, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            topology.queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut ids = track_ids.then(HashSet::new);
    let mut received = 0u64;
    let mut first: Option<Instant> = None;
    loop {
        if expect.is_some_and(|n| received >= n) {
            break;
        }
        let next = match tokio::time::timeout(idle_timeout, deliveries.next()).await {
            Ok(Some(delivery)) => delivery?,
            Ok(None) | Err(_) => break,
        };
        first.get_or_insert_with(Instant::now);
        received += 1;
        if let (Some(ids), Some(id)) = (ids.as_mut(), next.properties.message_id()) {
            ids.insert(id.to_string());
        }
        if received.is_multiple_of(100) || expect == Some(received) {
            next.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
        on_message(received);
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(ConsumeSummary {
        received,
        distinct: ids.map(|ids| ids.len() as u64),
        elapsed: first.map(|f| f.elapsed()).unwrap_or_default(),
    })
}
