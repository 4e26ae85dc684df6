//! The RabbitMQ publisher (AMQP 0-9-1, through lapin): one connection and one confirm channel.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
    DefaultConnectionBuilder, ExchangeKind, PublisherConfirm,
};

use super::cloudevents::{self, AMQP091_PREFIX, CloudEvents, SPEC_VERSION, attributes};
use super::routing::ExchangeType;
use super::tls::{BrokerTls, classify, with_password_file};
use super::trace_context::{TRACEPARENT, TRACESTATE, TraceContext};
use super::{
    BatchOutcome, BrokerFailure, ConnectError, Connector, Delivery, Message, Publisher, Rejection,
    Target, Unconfirmed,
};
use crate::connect::secret_url::SecretUrl;
use crate::connect::tcp_keepalive;

/// What became of one publish before returned messages are matched up.
enum Settled {
    NotSent,
    TimedOut,
    /// Boxed: a confirmation can carry a whole returned message, most carry nothing.
    Done(Box<Result<Confirmation, lapin::Error>>),
}

/// Publisher settings that do not depend on the row.
#[derive(Debug, Clone)]
pub struct AmqpSettings {
    pub exchange: String,
    pub dead_letter_exchange: Option<String>,
    pub confirms: bool,
    pub mandatory: bool,
    pub timeout: Duration,
    /// The heartbeat asked for, unless the URL names one (`?heartbeat=`): the lower of it and
    /// the broker's is used, and two missed ones end the connection.
    pub heartbeat: Duration,
    pub content_type: String,
    pub connection_name: String,
    pub declare_exchange: Option<ExchangeType>,
    pub tls: BrokerTls,
    /// Read at each connect; its password replaces the URL's.
    pub password_file: Option<PathBuf>,
    /// CloudEvents binary content mode; None when off.
    pub cloudevents: Option<CloudEvents>,
}

/// Opens [`AmqpPublisher`]s: the URL and the settings every worker of a process shares.
#[derive(Debug, Clone)]
pub struct AmqpConnector {
    pub url: SecretUrl,
    pub settings: AmqpSettings,
}

impl Connector for AmqpConnector {
    type Publisher = AmqpPublisher;

    async fn connect(&self) -> Result<AmqpPublisher, ConnectError> {
        AmqpPublisher::connect(&self.url, self.settings.clone()).await
    }

    fn endpoint(&self) -> &(dyn Display + Sync) {
        &self.url
    }
}

/// RabbitMQ publisher: one connection and one confirm channel.
pub struct AmqpPublisher {
    connection: Connection,
    channel: Channel,
    exchange: ShortString,
    dead_letter_exchange: Option<ShortString>,
    settings: AmqpSettings,
    content_type: ShortString,
    opened_at: Instant,
}

/// Longest wait for a polite close; a blocked or dead connection is then just dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

impl AmqpPublisher {
    /// A batch none of whose publishes could be written before the deadline: nothing is known
    /// of any message. A blocked connection is kept (see the confirm timeout); another one is
    /// replaced.
    fn nothing_taken(&self, count: usize, publish_time: Duration) -> BatchOutcome {
        let broken =
            (!self.is_blocked()).then_some(BrokerFailure::ConfirmTimeout(self.settings.timeout));
        BatchOutcome {
            deliveries: vec![Delivery::Unknown(Unconfirmed::Timeout); count],
            broken,
            publish_time,
        }
    }

    pub async fn connect(url: &SecretUrl, settings: AmqpSettings) -> Result<Self, ConnectError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(settings.connection_name.clone().into());
        let url = &with_password_file(url, settings.password_file.as_deref())?;
        let builder = DefaultConnectionBuilder::new().map_err(unavailable)?;
        let builder = match url.expose().parse::<AMQPUri>() {
            Ok(mut uri) => {
                uri.query.heartbeat = uri.query.heartbeat.or(Some(heartbeat_secs(&settings)));
                builder.with_uri(uri)
            }
            // lapin parses it again and says what is wrong.
            Err(_) => builder.with_uri_str(url.expose().to_string()),
        };
        let connection = builder
            .with_properties(properties)
            .with_tls_config(settings.tls.for_lapin()?)
            .connect()
            .await
            .map_err(|e| classify(&e, &settings.tls, url).unwrap_or_else(|| unavailable(e)))?;
        // lapin opens its socket itself; the heartbeat covers the AMQP side, this the TCP one.
        tcp_keepalive::arm_new_sockets();
        let channel = match open_channel(&connection, &settings, url).await {
            Ok(channel) => channel,
            Err(e) => {
                // Politely, so the broker does not log an abruptly closed connection per retry;
                // bounded, so a broker that stopped answering does not hold up the backoff.
                let close = connection.close(200, "relay cannot publish".into());
                let _ = tokio::time::timeout(settings.timeout, close).await;
                return Err(e);
            }
        };
        Ok(Self {
            exchange: settings.exchange.clone().into(),
            dead_letter_exchange: settings.dead_letter_exchange.clone().map(Into::into),
            content_type: settings.content_type.clone().into(),
            connection,
            channel,
            settings,
            opened_at: Instant::now(),
        })
    }

    fn properties(&self, message: &Message<'_>) -> BasicProperties {
        properties(
            &self.content_type,
            self.settings.cloudevents.as_ref(),
            message,
        )
    }
}

/// The AMQP properties of a message: message_id, type, content_type, persistent, timestamp,
/// and the headers (the headers column's, the trace context, the CloudEvents attributes, the
/// dead letter's error).
fn properties(
    content_type: &ShortString,
    cloudevents: Option<&CloudEvents>,
    message: &Message<'_>,
) -> BasicProperties {
    let id = message.id.to_string();
    let mut headers = message.headers.map(header_table);
    if let Some(context) = &message.trace.context {
        trace_headers(headers.get_or_insert_default(), context, "");
    }
    if let Some(settings) = cloudevents {
        cloud_event_headers(headers.get_or_insert_default(), settings, message, &id);
    }
    let mut properties = BasicProperties::default()
        .with_message_id(id.into())
        .with_type(message.kind.into())
        .with_content_type(content_type.clone())
        .with_delivery_mode(2);
    if let Some(ts) = message.timestamp {
        properties = properties.with_timestamp(ts);
    }
    if let Some(error) = message.error {
        headers
            .get_or_insert_default()
            .insert("x-outbox-error".into(), AMQPValue::LongString(error.into()));
    }
    if let Some(headers) = headers {
        properties = properties.with_headers(headers);
    }
    properties
}

/// The publishing channel: its exchanges checked (or declared), confirms on when asked for.
async fn open_channel(
    connection: &Connection,
    settings: &AmqpSettings,
    url: &SecretUrl,
) -> Result<Channel, ConnectError> {
    let channel = connection.create_channel().await.map_err(unavailable)?;
    ensure_exchange(&channel, &settings.exchange, settings.declare_exchange)
        .await
        .map_err(|e| declare_error(e, &settings.exchange, url))?;
    if let Some(dlx) = &settings.dead_letter_exchange {
        let kind = settings.declare_exchange.map(|_| ExchangeType::Fanout);
        ensure_exchange(&channel, dlx, kind)
            .await
            .map_err(|e| declare_error(e, dlx, url))?;
    }
    if settings.confirms {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
    }
    Ok(channel)
}

/// The heartbeat in AMQP's whole seconds (at least one: 0 would turn it off).
fn heartbeat_secs(settings: &AmqpSettings) -> u16 {
    u16::try_from(settings.heartbeat.as_secs())
        .unwrap_or(u16::MAX)
        .max(1)
}

fn unavailable(error: lapin::Error) -> ConnectError {
    ConnectError::Unavailable(Arc::new(error))
}

/// A failed declare of `exchange`: the broker closes the channel with 404 NOT_FOUND when a
/// passive declare finds no such exchange.
fn declare_error(error: lapin::Error, exchange: &str, url: &SecretUrl) -> ConnectError {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(reply)
            if matches!(reply.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)) =>
        {
            ConnectError::ExchangeNotFound {
                exchange: exchange.to_string(),
                vhost: vhost(url),
            }
        }
        _ => unavailable(error),
    }
}

/// The vhost the URL connects to, as lapin reads it. The connection was made with this URL, so
/// it parses; the parser's error would quote the URL, password and all, so it is never shown.
fn vhost(url: &SecretUrl) -> String {
    url.expose()
        .parse::<AMQPUri>()
        .map_or_else(|_| "/".to_string(), |uri| uri.vhost)
}

impl Publisher for AmqpPublisher {
    async fn publish_batch(&mut self, target: Target, messages: &[Message<'_>]) -> BatchOutcome {
        let exchange = match target {
            Target::Main => self.exchange.clone(),
            Target::DeadLetter => self
                .dead_letter_exchange
                .clone()
                .unwrap_or_else(|| self.exchange.clone()),
        };
        let options = BasicPublishOptions {
            mandatory: self.settings.mandatory && target == Target::Main,
            immediate: false,
        };
        let started = std::time::Instant::now();
        // lapin's basic_publish resolves only once its frames were written to the socket, so
        // awaiting publishes one by one costs a hop through the I/O loop per message. Its
        // frames are queued on the first poll, though, and join_all polls in order: every
        // message is queued in order (delivery tags too) before the first write is awaited,
        // and the I/O loop writes them in large batches.
        let publishes = messages.iter().map(|message| {
            self.channel.basic_publish(
                exchange.clone(),
                message.routing_key.into(),
                options,
                message.payload,
                self.properties(message),
            )
        });
        let mut broken = None;
        // The deadline covers the writes too: a connection the broker blocks (a memory or disk
        // alarm) takes no frame, and lapin then writes nothing, so the publishes themselves
        // would wait for the alarm to lift with the batch's rows locked.
        let deadline = tokio::time::Instant::now() + self.settings.timeout;
        let Ok(written) = tokio::time::timeout_at(deadline, join_all(publishes)).await else {
            return self.nothing_taken(messages.len(), started.elapsed());
        };
        let confirms: Vec<Option<PublisherConfirm>> = written
            .into_iter()
            .map(|published| match published {
                Ok(confirm) => Some(confirm),
                Err(e) => {
                    broken.get_or_insert_with(|| BrokerFailure::Publish(Arc::new(e)));
                    None
                }
            })
            .collect();

        let publish_time = started.elapsed();
        let mut settled = Vec::with_capacity(messages.len());
        let mut timed_out = false;
        for confirm in confirms {
            settled.push(match confirm {
                // Never handed to the broker.
                None => Settled::NotSent,
                // Past the deadline, take only what has already arrived.
                Some(confirm) if timed_out => confirm
                    .now_or_never()
                    .map_or(Settled::TimedOut, |r| Settled::Done(Box::new(r))),
                Some(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                    Ok(result) => Settled::Done(Box::new(result)),
                    Err(_) => {
                        timed_out = true;
                        Settled::TimedOut
                    }
                },
            });
        }

        // lapin hands a basic.return to whichever confirm it completes next, and one multiple
        // ack completes many confirms, so with many publishes in flight the return may ride
        // on a neighbour's confirm. The returned message carries its message_id (the row id):
        // that, not the confirm it arrived with, says which message came back.
        let mut returned = HashMap::new();
        for outcome in &settled {
            if let Settled::Done(done) = outcome
                && let Ok(Confirmation::Ack(Some(message)) | Confirmation::Nack(Some(message))) =
                    done.as_ref()
                && let Some(id) = message.properties.message_id()
            {
                returned.insert(
                    id.to_string(),
                    format!("{} {}", message.reply_code, message.reply_text),
                );
            }
        }
        let mut deliveries = Vec::with_capacity(messages.len());
        for (message, outcome) in messages.iter().zip(settled) {
            let done = match outcome {
                Settled::NotSent => {
                    deliveries.push(Delivery::Unknown(Unconfirmed::BrokerUnavailable));
                    continue;
                }
                Settled::TimedOut => {
                    deliveries.push(Delivery::Unknown(Unconfirmed::Timeout));
                    continue;
                }
                Settled::Done(done) => *done,
            };
            deliveries.push(match done {
                Ok(Confirmation::Nack(_)) => Delivery::Unknown(Unconfirmed::Nacked),
                Ok(Confirmation::Ack(_) | Confirmation::NotRequested) => {
                    let came_back = (!returned.is_empty())
                        .then(|| returned.get(&message.id.to_string()))
                        .flatten();
                    match came_back {
                        Some(reply) => Delivery::Rejected(Rejection::Unroutable {
                            reply: reply.clone(),
                        }),
                        None => Delivery::Confirmed,
                    }
                }
                Err(e) => {
                    broken.get_or_insert_with(|| BrokerFailure::Confirm(Arc::new(e)));
                    Delivery::Unknown(Unconfirmed::BrokerUnavailable)
                }
            });
        }
        if timed_out && !self.is_blocked() {
            // A late confirm on this channel would be ambiguous; start over on a fresh one. A
            // blocked connection is kept: a new one would look unblocked until it publishes,
            // while this one tells the worker to claim nothing until the alarm lifts.
            broken.get_or_insert(BrokerFailure::ConfirmTimeout(self.settings.timeout));
        }
        BatchOutcome {
            deliveries,
            broken,
            publish_time,
        }
    }

    fn opened_at(&self) -> Instant {
        self.opened_at
    }

    fn is_connected(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }

    fn is_blocked(&self) -> bool {
        self.connection.status().blocked()
    }

    async fn close(self) {
        // Bounded: lapin writes nothing on a connection the broker blocks, the close included.
        let close = self.connection.close(200, "relay shutting down".into());
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, close).await;
    }
}

/// Declares the exchange when asked to, otherwise checks that it exists (a passive declare), so
/// a missing exchange is reported at connect instead of as a closed channel mid-batch.
async fn ensure_exchange(
    channel: &Channel,
    name: &str,
    declare: Option<ExchangeType>,
) -> Result<(), lapin::Error> {
    if name.is_empty() {
        return Ok(()); // the default exchange always exists
    }
    let (kind, options) = match declare {
        Some(kind) => (
            match kind {
                ExchangeType::Fanout => ExchangeKind::Fanout,
                ExchangeType::Topic => ExchangeKind::Topic,
                ExchangeType::Direct => ExchangeKind::Direct,
                ExchangeType::Headers => ExchangeKind::Headers,
            },
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
        ),
        None => (
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
        ),
    };
    channel
        .exchange_declare(name.into(), kind, options, FieldTable::default())
        .await
}

/// The row's headers column as the message's headers. `traceparent` and `tracestate` are
/// left out: the message's checked trace context ([`Message::trace`]) says what goes there.
fn header_table(map: &serde_json::Map<String, serde_json::Value>) -> FieldTable {
    table_of(map, |key| key != TRACEPARENT && key != TRACESTATE)
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The W3C headers of a checked trace context, their names after `prefix`.
fn trace_headers(headers: &mut FieldTable, context: &TraceContext<'_>, prefix: &str) {
    headers.insert(
        format!("{prefix}{TRACEPARENT}").into(),
        text(context.traceparent),
    );
    if let Some(state) = context.tracestate {
        headers.insert(format!("{prefix}{TRACESTATE}").into(), text(state));
    }
}

/// The CloudEvents attributes as the RabbitMQ protocol binding spells them (see
/// [`super::cloudevents`]): `ce-` headers, string values; `datacontenttype` is the
/// content-type property. They replace headers of the same names from the row. The trace
/// context goes as the distributed-tracing extension too (`ce-traceparent`), beside the bare
/// W3C header that OpenTelemetry's messaging instrumentations read.
fn cloud_event_headers(
    headers: &mut FieldTable,
    settings: &CloudEvents,
    message: &Message<'_>,
    id: &str,
) {
    let mut put = |name: &str, value: &str| {
        headers.insert(format!("{AMQP091_PREFIX}{name}").into(), text(value));
    };
    put(attributes::SPECVERSION, SPEC_VERSION);
    put(attributes::ID, id);
    put(attributes::TYPE, message.kind);
    put(attributes::SOURCE, &settings.source);
    if let Some(time) = message.occurred_at {
        put(attributes::TIME, &cloudevents::rfc3339(time));
    }
    if let Some(subject) = message
        .partition_key
        .and_then(|key| std::str::from_utf8(key).ok())
    {
        put(attributes::SUBJECT, subject);
    }
    if let Some(context) = &message.trace.context {
        trace_headers(headers, context, AMQP091_PREFIX);
    }
}

/// A JSON object as an AMQP field table, nested objects and arrays included. The names were
/// checked when the row became a message ([`super::headers::check`]), so nothing can fail here.
fn field_table(map: &serde_json::Map<String, serde_json::Value>) -> FieldTable {
    table_of(map, |_| true)
}

/// The entries of `map` whose key `keep` accepts, as an AMQP field table.
fn table_of(
    map: &serde_json::Map<String, serde_json::Value>,
    keep: impl Fn(&str) -> bool,
) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in map.iter().filter(|(key, _)| keep(key)) {
        table.insert(key.as_str().into(), amqp_value(value));
    }
    table
}

fn amqp_value(value: &serde_json::Value) -> AMQPValue {
    match value {
        serde_json::Value::Null => AMQPValue::Void,
        serde_json::Value::Bool(b) => AMQPValue::Boolean(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        serde_json::Value::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(amqp_value).collect::<Vec<_>>(),
        )),
        serde_json::Value::Object(map) => AMQPValue::FieldTable(field_table(map)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
        properties
            .headers()
            .as_ref()?
            .inner()
            .get(&ShortString::from(name))
    }

    fn text(value: Option<&AMQPValue>) -> Option<String> {
        match value? {
            AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into()),
            _ => None,
        }
    }

    #[test]
    fn trace_context_and_cloudevents_become_headers() {
        use chrono::TimeZone;
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let row_headers = json!({"tenant": "eu", "traceparent": "stale", "tracestate": "x=1"});
        let map = super::super::headers::check(Some(&row_headers)).unwrap();
        let message = Message {
            id: uuid::Uuid::nil(),
            kind: "OrderCreated",
            routing_key: "orders",
            payload: b"{}",
            timestamp: None,
            headers: map,
            error: None,
            trace: super::super::trace_context::MessageTrace::of(Some(traceparent), Some("rojo=1")),
            occurred_at: Some(chrono::Utc.with_ymd_and_hms(2026, 12, 5, 6, 0, 0).unwrap()),
            partition_key: Some(b"order-7"),
        };
        let json = ShortString::from("application/json");
        let plain = properties(&json, None, &message);
        // The checked context replaces what the headers column said under those names.
        assert_eq!(
            text(header(&plain, "traceparent")).as_deref(),
            Some(traceparent)
        );
        assert_eq!(
            text(header(&plain, "tracestate")).as_deref(),
            Some("rojo=1")
        );
        assert_eq!(text(header(&plain, "tenant")).as_deref(), Some("eu"));
        assert!(header(&plain, "ce-id").is_none());

        let settings = CloudEvents {
            source: "/orders".into(),
        };
        let event = properties(&json, Some(&settings), &message);
        for (name, value) in [
            ("ce-specversion", "1.0"),
            ("ce-id", "00000000-0000-0000-0000-000000000000"),
            ("ce-type", "OrderCreated"),
            ("ce-source", "/orders"),
            ("ce-time", "2026-12-05T06:00:00Z"),
            ("ce-subject", "order-7"),
            ("ce-traceparent", traceparent),
            ("ce-tracestate", "rojo=1"),
        ] {
            assert_eq!(text(header(&event, name)).as_deref(), Some(value), "{name}");
        }
        assert_eq!(
            event.content_type().as_ref().map(|c| c.as_str()),
            Some("application/json")
        );

        // A malformed context: no trace header at all, the rest as before.
        let bad = Message {
            trace: super::super::trace_context::MessageTrace::of(Some("00-nope"), None),
            ..message
        };
        let sent = properties(&json, None, &bad);
        assert!(header(&sent, "traceparent").is_none());
        assert!(header(&sent, "tracestate").is_none());
        assert_eq!(
            bad.trace.dropped.map(|d| d.field.label()),
            Some("traceparent")
        );
    }

    #[test]
    fn json_objects_become_field_tables() {
        let value = json!({"tenant": "a", "n": 3, "ok": true, "tags": ["x"], "nested": {"k": 1.5}});
        let map = super::super::headers::check(Some(&value)).unwrap().unwrap();
        let table = field_table(map);
        let inner = table.inner();
        assert_eq!(
            inner.get(&ShortString::from("n")),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            inner.get(&ShortString::from("ok")),
            Some(&AMQPValue::Boolean(true))
        );
        assert!(matches!(
            inner.get(&ShortString::from("nested")),
            Some(AMQPValue::FieldTable(_))
        ));
        assert!(matches!(
            inner.get(&ShortString::from("tags")),
            Some(AMQPValue::FieldArray(_))
        ));
    }
}
