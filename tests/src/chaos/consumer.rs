//! The chaos consumer: a separate process that records every message id it receives, one per
//! line, and survives the broker cuts and restarts the chaos run inflicts on it too.
//!
//! It acks after recording, so a cut only causes broker redeliveries; those are flagged
//! `redelivered` and skipped when their id is already recorded, so the file counts what the
//! relay published, not what the broker re-sent.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

pub async fn run(amqp_url: &str, queue: &str, out: &Path) -> anyhow::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    let mut writer = std::io::BufWriter::new(file);
    let mut seen: HashSet<String> = HashSet::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let session = consume_until_error(amqp_url, queue, &mut writer, &mut seen);
        tokio::select! {
            result = session => {
                if let Err(e) = result {
                    eprintln!("consumer: {e}; reconnecting");
                }
                writer.flush()?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ = term.recv() => {
                writer.flush()?;
                return Ok(());
            }
        }
    }
}

async fn consume_until_error(
    amqp_url: &str,
    queue: &str,
    writer: &mut impl Write,
    seen: &mut HashSet<String>,
) -> anyhow::Result<()> {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(500, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut unacked: Option<lapin::Acker> = None;
    let mut count = 0u32;
    loop {
        // While idle, flush and ack what is recorded, so the file is current when the run reads it.
        let next = tokio::time::timeout(Duration::from_millis(200), deliveries.next()).await;
        let delivery = match next {
            Ok(Some(delivery)) => delivery?,
            Ok(None) => anyhow::bail!("consumer stream ended"),
            Err(_) => {
                writer.flush()?;
                if let Some(acker) = unacked.take() {
                    acker.ack(BasicAckOptions { multiple: true }).await?;
                }
                continue;
            }
        };
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        if !(delivery.redelivered && seen.contains(&id)) {
            writeln!(writer, "{id}")?;
            seen.insert(id);
        }
        count += 1;
        if count.is_multiple_of(100) {
            writer.flush()?;
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
            unacked = None;
        } else {
            unacked = Some(delivery.acker);
        }
    }
}
