//! An AMQP 1.0 consumer on a real broker (RabbitMQ 3.10's AMQP 1.0 plugin, RabbitMQ 4's core
//! AMQP 1.0, ActiveMQ Artemis) that records every message it receives, as a consumer of the
//! relay's messages would see them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use const_format::formatcp;
use fe2o3_amqp::types::messaging::{Body, Message, MessageId, Source};
use fe2o3_amqp::types::primitives::{Array, SimpleValue, Symbol, Value};
use fe2o3_amqp::{Connection, Receiver, Session};
use uuid::Uuid;

use crate::ports::{ARTEMIS_MODIFIED_PORT, ARTEMIS_PORT, ARTEMIS_TLS_PORT};

/// Artemis, on a port of its own (see scripts/services.sh). RabbitMQ's AMQP 1.0 shares its port
/// with AMQP 0-9-1: `crate::test_broker::TestBroker::amqp10_url`, of the broker the tests meet.
pub const ARTEMIS_URL: &str = formatcp!("amqp://outbox:outbox@127.0.0.1:{ARTEMIS_PORT}");
/// The same Artemis, on the acceptor that answers `modified` for a full address.
pub const ARTEMIS_MODIFIED_URL: &str =
    formatcp!("amqp://outbox:outbox@127.0.0.1:{ARTEMIS_MODIFIED_PORT}");
/// The same Artemis inside TLS, as a user whose password has a Service Bus key's characters
/// (`k3y/With+Base64=`), percent-encoded as a URL must carry them.
pub const ARTEMIS_TLS_URL: &str =
    formatcp!("amqps://sas-policy:k3y%2FWith%2BBase64%3D@127.0.0.1:{ARTEMIS_TLS_PORT}");

/// The CA that signed the TLS acceptor's certificate (scripts/services.sh writes it).
pub fn artemis_ca() -> std::path::PathBuf {
    crate::cache_dir().join("artemis/tls-ca.pem")
}

/// An ActiveMQ Artemis broker of one test's own (scripts/services.sh makes and starts it), so
/// the test can crash and restart it without disturbing the tests on the shared broker.
pub struct PrivateArtemis {
    dir: std::path::PathBuf,
    port: u16,
}

impl PrivateArtemis {
    /// Starts the broker in `~/.cache/outbox-relay/artemis/private-NAME` on `port` (made on
    /// first use, kept for the next run).
    pub fn start(name: &str, port: u16) -> Self {
        let dir = artemis_ca()
            .parent()
            .expect("the artemis cache folder")
            .join(format!("private-{name}"));
        let broker = Self { dir, port };
        broker.up();
        broker
    }

    pub fn url(&self) -> String {
        format!("amqp://outbox:outbox@127.0.0.1:{}", self.port)
    }

    /// Starts it again (after [`Self::crash`]); returns once it answers AMQP 1.0.
    pub fn up(&self) {
        self.services(&[
            "artemis-instance",
            self.dir.to_str().unwrap(),
            &self.port.to_string(),
        ]);
    }

    /// SIGKILL: the broker dies as in a crash; what it had written stays in its journal.
    pub fn crash(&self) {
        self.services(&[
            "stop-artemis-instance",
            self.dir.to_str().unwrap(),
            "--kill",
        ]);
    }

    fn services(&self, args: &[&str]) {
        let status = std::process::Command::new(crate::repo_root().join("scripts/services.sh"))
            .args(args)
            .status()
            .expect("run scripts/services.sh");
        assert!(status.success(), "scripts/services.sh {args:?} failed");
    }
}

impl Drop for PrivateArtemis {
    fn drop(&mut self) {
        let _ = std::process::Command::new(crate::repo_root().join("scripts/services.sh"))
            .args([
                "stop-artemis-instance",
                self.dir.to_str().unwrap_or_default(),
            ])
            .status();
    }
}

/// Artemis address prefixes that services.sh configures: a full address after one message
/// (`rejected`, or `modified` on the second acceptor), and addresses it will not create.
pub const ARTEMIS_FULL_PREFIX: &str = "outbox-full.";
pub const ARTEMIS_REFUSED_PREFIX: &str = "outbox-refused.";

/// One received message, as the consumer saw its properties.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub subject: Option<String>,
    pub content_type: Option<String>,
    pub creation_time_ms: Option<i64>,
    pub durable: bool,
    pub application_properties: HashMap<String, String>,
    /// The same properties as a Python AMQP 1.0 client hands them over (strings, numbers,
    /// booleans; timestamps as milliseconds since the epoch), for the CloudEvents SDK.
    pub typed_properties: serde_json::Map<String, serde_json::Value>,
    pub body: Vec<u8>,
}

#[derive(Default, Debug)]
pub struct Received {
    pub counts: HashMap<Uuid, u32>,
    pub total: u64,
    /// Messages whose message-id is not a row id.
    pub foreign: u64,
    pub first: HashMap<Uuid, Seen>,
}

pub struct Consumer {
    pub received: Arc<Mutex<Received>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Attaches a receiver to `address` and records every message until [`Consumer::stop`].
pub async fn consume(url: &str, address: &str) -> Consumer {
    let mut connection = Connection::open(crate::unique("test-consumer"), url)
        .await
        .unwrap_or_else(|e| panic!("AMQP 1.0 broker at {address} (make services): {e}"));
    let mut session = Session::begin(&mut connection).await.unwrap();
    // From the queue at the address (Artemis: anycast), as the relay's sender sends to it.
    let source = Source::builder()
        .address(address.to_string())
        .capabilities(Array::from(vec![Symbol::from("queue")]))
        .build();
    let mut receiver = Receiver::builder()
        .name(crate::unique("receiver"))
        .source(source)
        .attach(&mut session)
        .await
        .unwrap_or_else(|e| panic!("attach a receiver to {address}: {e}"));
    let received = Arc::new(Mutex::new(Received::default()));
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let seen = received.clone();
    let task = tokio::spawn(async move {
        loop {
            let delivery = tokio::select! {
                delivery = receiver.recv::<Body<Value>>() => delivery,
                _ = &mut stopped => break,
            };
            let Ok(delivery) = delivery else { break };
            record(&seen, delivery.message());
            if receiver.accept(&delivery).await.is_err() {
                break;
            }
        }
        let _ = receiver.close().await;
        let _ = session.end().await;
        let _ = connection.close().await;
    });
    Consumer {
        received,
        stop,
        task,
    }
}

fn record(received: &Mutex<Received>, message: &Message<Body<Value>>) {
    let mut received = received.lock().unwrap();
    received.total += 1;
    let properties = message.properties.clone().unwrap_or_default();
    let id = match &properties.message_id {
        Some(MessageId::String(text)) => Uuid::parse_str(text).ok(),
        _ => None,
    };
    let Some(id) = id else {
        received.foreign += 1;
        return;
    };
    *received.counts.entry(id).or_default() += 1;
    let body = match &message.body {
        Body::Data(batch) => batch.iter().flat_map(|data| data.0.to_vec()).collect(),
        _ => Vec::new(),
    };
    let application_properties = message
        .application_properties
        .as_ref()
        .map(|props| {
            props
                .0
                .iter()
                .map(|(name, value)| (name.clone(), simple_text(value)))
                .collect()
        })
        .unwrap_or_default();
    let typed_properties = message
        .application_properties
        .as_ref()
        .map(|props| {
            props
                .0
                .iter()
                .map(|(name, value)| (name.clone(), typed(value)))
                .collect()
        })
        .unwrap_or_default();
    received.first.entry(id).or_insert(Seen {
        subject: properties.subject.clone(),
        content_type: properties.content_type.as_ref().map(|s| s.0.clone()),
        creation_time_ms: properties.creation_time.map(|t| t.milliseconds()),
        durable: message.header.as_ref().is_some_and(|h| h.durable),
        application_properties,
        typed_properties,
        body,
    });
}

fn typed(value: &SimpleValue) -> serde_json::Value {
    match value {
        SimpleValue::String(text) => text.clone().into(),
        SimpleValue::Long(n) => (*n).into(),
        SimpleValue::Bool(flag) => (*flag).into(),
        SimpleValue::Timestamp(t) => t.milliseconds().into(),
        other => format!("{other:?}").into(),
    }
}

fn simple_text(value: &SimpleValue) -> String {
    match value {
        SimpleValue::String(text) => text.clone(),
        SimpleValue::Long(n) => n.to_string(),
        SimpleValue::Bool(flag) => flag.to_string(),
        other => format!("{other:?}"),
    }
}

impl Consumer {
    pub fn total(&self) -> u64 {
        self.received.lock().unwrap().total
    }

    pub fn distinct(&self) -> usize {
        self.received.lock().unwrap().counts.len()
    }

    pub fn duplicates(&self) -> usize {
        self.received
            .lock()
            .unwrap()
            .counts
            .values()
            .filter(|n| **n > 1)
            .count()
    }

    pub fn has(&self, id: &Uuid) -> bool {
        self.received.lock().unwrap().counts.contains_key(id)
    }

    pub fn seen(&self, id: &Uuid) -> Option<Seen> {
        self.received.lock().unwrap().first.get(id).cloned()
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// What the broker at `url` answers a sender attaching to `address`, as the relay's sender
/// attaches (the `queue` capability, unsettled): `Ok` when it attached (then closed), or the
/// error as fe2o3-amqp reports it (`{:?}`: which of link or session ended, the condition, the
/// description), so a test can show the broker's own words.
pub async fn attach_sender(url: &str, address: &str) -> Result<(), String> {
    use fe2o3_amqp::Sender;
    use fe2o3_amqp::types::messaging::Target;

    let mut connection = Connection::open(crate::unique("test-sender"), url)
        .await
        .unwrap_or_else(|e| panic!("AMQP 1.0 broker at {url}: {e}"));
    let mut session = Session::begin(&mut connection).await.unwrap();
    let target = Target::builder()
        .address(address.to_string())
        .capabilities(Array::from(vec![Symbol::from("queue")]))
        .build();
    let attached = Sender::builder()
        .name(crate::unique("sender"))
        .target(target)
        .attach(&mut session)
        .await;
    let outcome = match attached {
        Ok(sender) => {
            let _ = tokio::time::timeout(Duration::from_secs(5), sender.close()).await;
            Ok(())
        }
        Err(e) => Err(format!("{e:?}")),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), session.end()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), connection.close()).await;
    outcome
}
