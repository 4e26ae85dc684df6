//! A consumer on the real RabbitMQ that records every message id it receives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::table::OutboxTable;
use sqlx::PgConnection;
use uuid::Uuid;

/// Longest wait for a consumer's clean-up at the end of a test.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);

/// What the consumer saw: id → times received, plus headers of interest.
#[derive(Default, Debug)]
pub struct Received {
    pub counts: HashMap<Uuid, u32>,
    pub total: u64,
    pub without_id: u64,
    pub types: HashMap<Uuid, String>,
    /// Body length of each message.
    pub sizes: HashMap<Uuid, usize>,
    /// Every id in the order the queue delivered it, repeats included.
    pub arrivals: Vec<Uuid>,
    /// When each of `arrivals` came, in the same order: the gaps a fault leaves in delivery.
    pub arrived_at: Vec<std::time::Instant>,
    /// The headers of each message that had any, as text (strings as themselves, other
    /// values in their debug form); messages without headers cost nothing here.
    pub headers: HashMap<Uuid, HashMap<String, String>>,
}

pub struct Consumer {
    pub queue: String,
    pub received: Arc<Mutex<Received>>,
    connection: Connection,
}

/// Declares a durable queue `name` on the tests' RabbitMQ (for AMQP 1.0 senders, which need an
/// existing queue: at /amq/queue/NAME on RabbitMQ 3.x, /queues/NAME on 4.x).
pub async fn declare_queue(name: &str) {
    let url = crate::amqp_url();
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            let broker = crate::test_broker::TestBroker::current().name();
            panic!("{broker} must run at {url} (make services): {e}")
        });
    let channel = connection.create_channel().await.unwrap();
    durable_queue(&channel, name).await;
    let _ = connection.close(0, "declared".into()).await;
}

async fn durable_queue(channel: &lapin::Channel, name: &str) {
    durable_queue_with(channel, name, FieldTable::default()).await;
}

async fn durable_queue_with(channel: &lapin::Channel, name: &str, arguments: FieldTable) {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap();
}

async fn durable_exchange(
    channel: &lapin::Channel,
    name: &str,
    kind: ExchangeKind,
    arguments: FieldTable,
) {
    channel
        .exchange_declare(
            name.into(),
            kind,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap();
}

async fn bind(channel: &lapin::Channel, queue: &str, exchange: &str, key: &str) {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Declares a durable exchange of `kind` and a queue bound to it with `binding_key`, then
/// consumes it, recording ids.
pub async fn consume(exchange: &str, kind: ExchangeKind, binding_key: &str) -> Consumer {
    consume_at(
        &crate::amqp_url(),
        exchange,
        kind,
        binding_key,
        FieldTable::default(),
    )
    .await
}

/// [`consume`] of an exchange the test creates only now, while a relay retries against it. The
/// exchange cannot exist before its queue is bound to it, so a publish that lands in between is
/// routed nowhere and lost; here an alternate exchange, bound to the same queue beforehand,
/// takes whatever the new exchange cannot route yet. Every message reaches the queue once.
pub async fn consume_new_exchange(
    exchange: &str,
    kind: ExchangeKind,
    binding_key: &str,
) -> Consumer {
    let alternate = format!("{exchange}_unrouted");
    consume_with(
        &crate::amqp_url(),
        exchange,
        kind,
        binding_key,
        Some(&alternate),
        FieldTable::default(),
    )
    .await
}

/// [`consume`] on the broker at `url`, the queue declared with `queue_arguments` (e.g.
/// `x-queue-type: quorum` on a cluster).
pub async fn consume_at(
    url: &str,
    exchange: &str,
    kind: ExchangeKind,
    binding_key: &str,
    queue_arguments: FieldTable,
) -> Consumer {
    consume_with(url, exchange, kind, binding_key, None, queue_arguments).await
}

/// Declares the queue, then (with `alternate`) a fanout exchange bound to it that takes what
/// `exchange` cannot route, then `exchange` bound to the queue with `binding_key`, and consumes.
async fn consume_with(
    url: &str,
    exchange: &str,
    kind: ExchangeKind,
    binding_key: &str,
    alternate: Option<&str>,
    queue_arguments: FieldTable,
) -> Consumer {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("connect the consumer to the broker: {e}"));
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("{exchange}_q");
    durable_queue_with(&channel, &queue, queue_arguments).await;
    let mut exchange_arguments = FieldTable::default();
    if let Some(alternate) = alternate {
        durable_exchange(
            &channel,
            alternate,
            ExchangeKind::Fanout,
            FieldTable::default(),
        )
        .await;
        bind(&channel, &queue, alternate, "").await;
        exchange_arguments.insert(
            "alternate-exchange".into(),
            lapin::types::AMQPValue::LongString(alternate.into()),
        );
    }
    durable_exchange(&channel, exchange, kind, exchange_arguments).await;
    bind(&channel, &queue, exchange, binding_key).await;
    channel
        .basic_qos(2000, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let received = Arc::new(Mutex::new(Received::default()));
    let sink = received.clone();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = deliveries.next().await {
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .and_then(|id| Uuid::parse_str(id.as_str()).ok());
            let mut seen = sink.lock().unwrap();
            seen.total += 1;
            match id {
                Some(id) => {
                    *seen.counts.entry(id).or_default() += 1;
                    seen.arrivals.push(id);
                    seen.arrived_at.push(std::time::Instant::now());
                    seen.sizes.insert(id, delivery.data.len());
                    if let Some(kind) = delivery.properties.kind() {
                        seen.types.insert(id, kind.to_string());
                    }
                    if let Some(headers) = delivery.properties.headers() {
                        seen.headers.insert(id, header_texts(headers));
                    }
                }
                None => seen.without_id += 1,
            }
        }
    });
    Consumer {
        queue,
        received,
        connection,
    }
}

fn header_texts(headers: &FieldTable) -> HashMap<String, String> {
    headers
        .inner()
        .iter()
        .map(|(name, value)| {
            let text = match value {
                lapin::types::AMQPValue::LongString(text) => {
                    String::from_utf8_lossy(text.as_bytes()).into_owned()
                }
                other => format!("{other:?}"),
            };
            (name.to_string(), text)
        })
        .collect()
}

impl Consumer {
    /// The headers message `id` arrived with (first arrival), if it had any.
    pub fn headers(&self, id: &Uuid) -> Option<HashMap<String, String>> {
        self.received.lock().unwrap().headers.get(id).cloned()
    }

    pub fn total(&self) -> u64 {
        self.received.lock().unwrap().total
    }

    pub fn distinct(&self) -> usize {
        self.received.lock().unwrap().counts.len()
    }

    /// Waits until at least `n` messages arrived or the timeout passes; returns the total.
    pub async fn wait_for(&self, n: u64, timeout: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.total() < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.total()
    }

    /// Ids received more than once, with their counts.
    pub fn duplicates(&self) -> Vec<(Uuid, u32)> {
        self.received
            .lock()
            .unwrap()
            .counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| (*id, *n))
            .collect()
    }

    /// Every id in arrival order, repeats included.
    pub fn arrivals(&self) -> Vec<Uuid> {
        self.received.lock().unwrap().arrivals.clone()
    }

    /// The longest pause between two deliveries, and when (after the first delivery) it
    /// began; zero with fewer than two.
    pub fn longest_gap(&self) -> (Duration, Duration) {
        let seen = self.received.lock().unwrap();
        let Some(first) = seen.arrived_at.first().copied() else {
            return (Duration::ZERO, Duration::ZERO);
        };
        seen.arrived_at
            .windows(2)
            .map(|pair| (pair[1] - pair[0], pair[0] - first))
            .max()
            .unwrap_or_default()
    }

    /// The replay header of `id`'s last replayed delivery; None when none was a replay.
    pub fn replay_of(&self, id: &Uuid) -> Option<String> {
        let received = self.received.lock().unwrap();
        received.headers.get(id)?.get("x-outbox-replay").cloned()
    }

    pub fn has(&self, id: &Uuid) -> bool {
        self.received.lock().unwrap().counts.contains_key(id)
    }

    /// Each of the `n` rows of `table` arrived exactly once: waits up to a minute for `n`
    /// messages, then checks that the table holds `n` ids, none came twice and none is missing.
    /// Call it once the relays have stopped, so a late duplicate has had its chance to show.
    pub async fn assert_each_id_once(&self, conn: &mut PgConnection, table: &OutboxTable, n: u64) {
        assert_eq!(
            self.wait_for(n, Duration::from_secs(60)).await,
            n,
            "messages received"
        );
        let duplicates = self.duplicates();
        assert!(
            duplicates.is_empty(),
            "{} ids arrived more than once, e.g. {:?}",
            duplicates.len(),
            &duplicates[..3.min(duplicates.len())]
        );
        let ids = crate::db::all_ids(conn, table).await;
        assert_eq!(ids.len() as u64, n, "rows in {}", table.name);
        let missing = ids.iter().filter(|id| !self.has(id)).count();
        assert_eq!(missing, 0, "ids that never arrived");
    }

    /// Deletes the queue and closes the connection, giving up after [`CLOSE_TIMEOUT`].
    ///
    /// Clean-up only, so it must never hang a test: once a lapin I/O loop has lost its socket
    /// (seen once in an e2e run: the broker logged the client closing the TCP connection),
    /// a pending channel or close reply is never resolved, and the test that awaited it held
    /// the e2e scenario lock forever. A queue left behind is harmless: names are unique.
    pub async fn close(self) {
        let queue = self.queue.clone();
        let cleanup = async move {
            if let Ok(channel) = self.connection.create_channel().await {
                let _ = channel
                    .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = self.connection.close(200, "test done".into()).await;
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, cleanup).await.is_err() {
            eprintln!(
                "closing the consumer of {queue} timed out after {CLOSE_TIMEOUT:?}; left as is"
            );
        }
    }
}

/// Closes every broker connection whose client-provided name contains `needle` (the relay
/// names its connections `outbox-relay <relay> <pod>`), like an operator cutting them.
pub fn close_connections_named(needle: &str) -> usize {
    let broker = crate::test_broker::TestBroker::current();
    let output = broker
        .rabbitmqctl()
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl must be installed");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut closed = 0;
    for line in text.lines().filter(|l| l.contains(needle)) {
        let Some(pid) = line.split_whitespace().next() else {
            continue;
        };
        let status = broker
            .rabbitmqctl()
            .args(["-q", "close_connection", pid, "test cuts the connection"])
            .status()
            .expect("rabbitmqctl close_connection");
        if status.success() {
            closed += 1;
        }
    }
    closed
}
