//! Exchanges and queues of a measurement, declared before and deleted after it.

use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::broker::routing::ExchangeType;
use outbox_relay::tools::consume::{Topology, declare};

/// The broker side of one measurement: a durable fanout exchange and, when a consumer drains
/// it, a durable queue bound to it.
#[derive(Debug, Clone)]
pub struct Destination {
    pub exchange: String,
    pub queue: Option<String>,
}

async fn channel(amqp_url: &str) -> anyhow::Result<(Connection, Channel)> {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    Ok((connection, channel))
}

impl Destination {
    pub async fn declare(
        amqp_url: &str,
        exchange: String,
        queue: Option<String>,
    ) -> anyhow::Result<Self> {
        let (connection, channel) = channel(amqp_url).await?;
        match &queue {
            Some(queue) => {
                let topology = Topology {
                    exchange: &exchange,
                    kind: ExchangeType::Fanout,
                    queue,
                    binding_key: "",
                };
                declare(&channel, &topology).await?;
            }
            None => {
                let options = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .exchange_declare(
                        exchange.as_str().into(),
                        ExchangeKind::Fanout,
                        options,
                        FieldTable::default(),
                    )
                    .await?;
            }
        }
        connection.close(200, "declared".into()).await?;
        Ok(Self { exchange, queue })
    }

    /// The AMQP 1.0 address of the destination on RabbitMQ's plugin: the queue when a
    /// consumer drains one, else the exchange (a fanout nobody is bound to, so the broker
    /// drops every message, as in the article).
    pub fn amqp10_address(&self) -> String {
        match &self.queue {
            Some(queue) => format!("/amq/queue/{queue}"),
            None => format!("/exchange/{}", self.exchange),
        }
    }

    /// Deletes the queue (with whatever is left in it) and the exchange.
    pub async fn delete(&self, amqp_url: &str) -> anyhow::Result<()> {
        let (connection, channel) = channel(amqp_url).await?;
        if let Some(queue) = &self.queue {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        connection.close(200, "cleaned up".into()).await?;
        Ok(())
    }
}
