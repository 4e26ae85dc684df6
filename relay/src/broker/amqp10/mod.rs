//! The AMQP 1.0 publisher (through fe2o3-amqp): per worker one connection, one session and
//! one sender link to the target address.
//!
//! A batch goes out the way the 0-9-1 publisher sends one: every message as an unsettled,
//! batchable transfer without waiting in between, then every disposition awaited within the
//! publish timeout, so a batch costs one round trip. The outcomes map onto the relay's:
//! `accepted` confirms; `rejected` is the broker's refusal and spends an attempt; `released`
//! and `modified` mean the broker did not take the message, so the row stays pending, no
//! attempt is spent, and the worker backs off as after an outage (the link is replaced); a
//! link or connection error is an outage.

use std::fmt::Display;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fe2o3_amqp::link::delivery::DeliveryFut;
use fe2o3_amqp::link::{SendError, SenderAttachError, SessionStopReason};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition, SenderSettleMode};
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Data, Header, Message as AmqpMessage, MessageId, Outcome, Properties,
    Source, Target as LinkTarget,
};
use fe2o3_amqp::types::primitives::{Array, Binary, OrderedMap, SimpleValue, Symbol, Timestamp};
use fe2o3_amqp::{Sendable, Sender, Session};
use futures::future::FusedFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

pub mod address;
mod connect;

use connect::unavailable;

use super::cloudevents::{AMQP10_PREFIX, CloudEvents, SPEC_VERSION, attributes};
use super::trace_context::{TRACEPARENT, TRACESTATE};
use super::{
    BatchOutcome, BrokerFailure, ConnectError, Connector, Delivery, Message, Publisher, Refusal,
    Rejection, Target, Unconfirmed,
};
use crate::broker::tls::BrokerTls;
use crate::connect::secret_url::SecretUrl;

/// The longest wait for the broker's answer to each step of a close.
pub const CLOSE_STEP: Duration = Duration::from_secs(2);

/// Publisher settings that do not depend on the row.
#[derive(Debug, Clone)]
pub struct Amqp10Settings {
    /// The target address: a queue or topic.
    pub address: String,
    pub timeout: Duration,
    pub content_type: String,
    /// The container id the broker shows for the connection, e.g. `outbox-relay orders pod-1`.
    pub container_id: String,
    pub tls: BrokerTls,
    /// Read at each connect; its password replaces the URL's.
    pub password_file: Option<std::path::PathBuf>,
    /// CloudEvents binary content mode; None when off.
    pub cloudevents: Option<CloudEvents>,
}

/// Opens [`Amqp10Publisher`]s.
#[derive(Debug, Clone)]
pub struct Amqp10Connector {
    pub url: SecretUrl,
    pub settings: Amqp10Settings,
}

impl Connector for Amqp10Connector {
    type Publisher = Amqp10Publisher;

    async fn connect(&self) -> Result<Amqp10Publisher, ConnectError> {
        Amqp10Publisher::connect(&self.url, self.settings.clone()).await
    }

    fn endpoint(&self) -> &(dyn Display + Sync) {
        &self.url
    }
}

pub struct Amqp10Publisher {
    connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: SessionHandle<()>,
    sender: Sender,
    settings: Amqp10Settings,
    /// A send or disposition failed: the link is no longer trusted.
    failed: bool,
    opened_at: Instant,
}

impl Amqp10Publisher {
    pub async fn connect(url: &SecretUrl, settings: Amqp10Settings) -> Result<Self, ConnectError> {
        // The user and password of the URL go through SASL PLAIN (Service Bus: the policy name
        // and its key). Errors name no URL.
        let mut connection = connect::open(
            url,
            &settings.container_id,
            &settings.tls,
            settings.password_file.as_deref(),
        )
        .await?;
        let mut session = match Session::begin(&mut connection).await {
            Ok(session) => session,
            Err(e) => {
                let _ = connection.close().await;
                return Err(unavailable(e));
            }
        };
        // The outcomes this sender understands: a broker that may answer `modified` (Artemis
        // for a full address, with its option on) only does so when the source lists it.
        let source = Source::builder()
            .outcomes(Array::from(
                [
                    "amqp:accepted:list",
                    "amqp:rejected:list",
                    "amqp:released:list",
                    "amqp:modified:list",
                ]
                .map(Symbol::from)
                .to_vec(),
            ))
            .build();
        // `queue`: send to a queue at the address (anycast). Artemis otherwise makes a new
        // address multicast, where a message nobody subscribed to is accepted and dropped;
        // brokers that do not know the capability ignore it.
        let target = LinkTarget::builder()
            .address(settings.address.clone())
            .capabilities(Array::from(vec![Symbol::from("queue")]))
            .build();
        let attached = Sender::builder()
            .name(format!("{}-sender", settings.container_id))
            .source(source)
            .target(target)
            .sender_settle_mode(SenderSettleMode::Unsettled)
            .attach(&mut session)
            .await;
        let sender = match attached {
            Ok(sender) => sender,
            Err(e) => {
                let _ = session.end().await;
                let _ = connection.close().await;
                return Err(attach_error(&settings.address, e));
            }
        };
        Ok(Self {
            connection,
            session,
            sender,
            settings,
            failed: false,
            opened_at: Instant::now(),
        })
    }

    /// Sends every message unsettled, then awaits the dispositions until `deadline`, or until
    /// the connection closes: fe2o3-amqp 0.18 keeps a pending disposition's channel in the link,
    /// so after a dropped connection the outstanding ones would only end at the publish timeout,
    /// and the worker would learn of the outage seconds late.
    async fn publish_main(&mut self, messages: &[Message<'_>]) -> BatchOutcome {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + self.settings.timeout);
        let Self {
            connection,
            sender,
            settings,
            failed,
            ..
        } = self;
        let closed = connection.on_close().fuse();
        tokio::pin!(closed);
        let (pending, mut broken) =
            send_all(sender, settings, messages, deadline, closed.as_mut()).await;
        let publish_time = started.elapsed();
        let outcomes =
            await_outcomes(pending, deadline, settings.timeout, closed, &mut broken).await;
        let timed_out = matches!(broken, Some(BrokerFailure::ConfirmTimeout(_)));
        let (deliveries, failure) = deliveries_of(outcomes, messages.len(), timed_out);
        let broken = broken.or(failure);
        *failed |= broken.is_some();
        BatchOutcome {
            deliveries,
            broken,
            publish_time,
        }
    }
}

/// The end of a connection's event loop, as `on_close` reports it.
type ConnectionEnd = Result<(), fe2o3_amqp::connection::Error>;

/// A handed-over message's disposition, to come.
type PendingOutcome = DeliveryFut<Result<Outcome, SendError>>;

/// Hands every message to the link unsettled, in order, until one cannot be: the link failed,
/// the connection closed, or `deadline` passed while waiting for link credit (flow control).
/// Returns each handed-over message's pending disposition, and why the sending stopped early.
async fn send_all(
    sender: &mut Sender,
    settings: &Amqp10Settings,
    messages: &[Message<'_>],
    deadline: tokio::time::Instant,
    mut closed: Pin<&mut impl FusedFuture<Output = ConnectionEnd>>,
) -> (Vec<PendingOutcome>, Option<BrokerFailure>) {
    let mut pending = Vec::with_capacity(messages.len());
    for message in messages {
        let sendable = Sendable::from(amqp_message(settings, message));
        let stopped = tokio::select! {
            sent = tokio::time::timeout_at(deadline, sender.send_batchable(sendable)) => match sent {
                Ok(Ok(delivery)) => {
                    pending.push(delivery);
                    continue;
                }
                Ok(Err(e)) => BrokerFailure::Publish(Arc::new(e)),
                Err(_) => BrokerFailure::ConfirmTimeout(settings.timeout),
            },
            end = &mut closed => BrokerFailure::Publish(connection_lost(end)),
        };
        return (pending, Some(stopped));
    }
    (pending, None)
}

/// Awaits the dispositions until all arrived, `deadline` (`timeout` after the start) passes or the connection closes (then
/// `broken` says which); keeps every one that had arrived by then, in message order. Does not
/// wait at all when `broken` is already set.
async fn await_outcomes(
    pending: Vec<PendingOutcome>,
    deadline: tokio::time::Instant,
    timeout: Duration,
    mut closed: Pin<&mut impl FusedFuture<Output = ConnectionEnd>>,
    broken: &mut Option<BrokerFailure>,
) -> Vec<Option<Result<Outcome, SendError>>> {
    let mut outcomes: Vec<Option<_>> = std::iter::repeat_with(|| None)
        .take(pending.len())
        .collect();
    let mut waiting: FuturesUnordered<_> = pending
        .into_iter()
        .enumerate()
        .map(|(index, delivery)| delivery.map(move |outcome| (index, outcome)))
        .collect();
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    while broken.is_none() {
        tokio::select! {
            next = waiting.next() => match next {
                Some((index, outcome)) => outcomes[index] = Some(outcome),
                None => break,
            },
            end = &mut closed => {
                *broken = Some(BrokerFailure::Confirm(connection_lost(end)));
            }
            () = &mut expired => {
                // A late disposition on this link would be ambiguous: the link is replaced.
                *broken = Some(BrokerFailure::ConfirmTimeout(timeout));
            }
        }
    }
    // What had arrived when the wait ended still counts; the rest is unknown.
    while let Some(Some((index, outcome))) = waiting.next().now_or_never() {
        outcomes[index] = Some(outcome);
    }
    outcomes
}

/// Every message's delivery, from the dispositions that arrived (in message order; `outcomes`
/// may be shorter than the batch when sending stopped early), and the failure they show by
/// themselves: a link that failed while awaiting them, or messages the broker released.
/// A missing disposition is a timeout when the wait `timed_out`, otherwise an outage.
fn deliveries_of(
    outcomes: Vec<Option<Result<Outcome, SendError>>>,
    batch: usize,
    timed_out: bool,
) -> (Vec<Delivery>, Option<BrokerFailure>) {
    let missing = if timed_out {
        Unconfirmed::Timeout
    } else {
        Unconfirmed::BrokerUnavailable
    };
    let mut deliveries: Vec<Delivery> = outcomes
        .into_iter()
        .map(|outcome| outcome.map_or(Delivery::Unknown(missing), delivery_of))
        .collect();
    let link_failed = deliveries.contains(&Delivery::Unknown(Unconfirmed::BrokerUnavailable));
    let released = deliveries
        .iter()
        .filter(|delivery| **delivery == Delivery::Unknown(Unconfirmed::Released))
        .count();
    // Messages never handed over (the send failed or timed out first).
    deliveries.resize(batch, Delivery::Unknown(Unconfirmed::BrokerUnavailable));
    let failure = if link_failed {
        Some(BrokerFailure::Confirm(Arc::new(std::io::Error::other(
            "the link failed while awaiting outcomes",
        ))))
    } else if released > 0 {
        Some(BrokerFailure::Released(released))
    } else {
        None
    };
    (deliveries, failure)
}

/// Why the connection's event loop stopped, for the log: the transport's error when it had one.
fn connection_lost(
    end: Result<(), fe2o3_amqp::connection::Error>,
) -> Arc<dyn std::error::Error + Send + Sync> {
    match end {
        Err(e) => Arc::new(e),
        Ok(()) => Arc::new(std::io::Error::other("the broker closed the connection")),
    }
}

/// The AMQP 1.0 message of a row: message-id = the row id, subject = the type,
/// creation-time = occurred-at, the headers as application properties (`traceparent` and
/// `tracestate` from the checked trace context instead), then the CloudEvents attributes in
/// binary mode; durable.
fn amqp_message(settings: &Amqp10Settings, message: &Message<'_>) -> AmqpMessage<Data> {
    let id = message.id.to_string();
    let mut properties = Properties::builder()
        .message_id(MessageId::String(id.clone()))
        .subject(message.kind.to_string())
        .content_type(Symbol::from(settings.content_type.as_str()))
        .build();
    properties.creation_time = message
        .timestamp
        .map(|seconds| Timestamp::from_milliseconds(seconds as i64 * 1000));
    let mut application = ApplicationProperties::default();
    let map = &mut application.0;
    if let Some(headers) = message.headers {
        for (name, value) in headers {
            if name != TRACEPARENT && name != TRACESTATE {
                map.insert(name.clone(), simple_value(value));
            }
        }
    }
    if let Some(context) = &message.trace.context {
        map.insert(TRACEPARENT.into(), SimpleValue::from(context.traceparent));
        if let Some(state) = context.tracestate {
            map.insert(TRACESTATE.into(), SimpleValue::from(state));
        }
    }
    if let Some(cloudevents) = &settings.cloudevents {
        cloud_event_properties(map, cloudevents, message, id);
    }
    if let Some(error) = message.error {
        map.insert("x-outbox-error".into(), SimpleValue::from(error));
    }
    AmqpMessage::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .properties(properties)
        .application_properties(application)
        .data(Binary::from(message.payload.to_vec()))
        .build()
}

/// The CloudEvents attributes as the AMQP protocol binding spells them: `cloudEvents:`
/// application properties, `time` as an AMQP timestamp (milliseconds), `datacontenttype` as the
/// content-type property (set already). The trace context goes as the distributed-tracing
/// extension too (`cloudEvents:traceparent`), beside the bare W3C property.
fn cloud_event_properties(
    map: &mut OrderedMap<String, SimpleValue>,
    settings: &CloudEvents,
    message: &Message<'_>,
    id: String,
) {
    let mut put = |name: &str, value: SimpleValue| {
        map.insert(format!("{AMQP10_PREFIX}{name}"), value);
    };
    put(attributes::SPECVERSION, SimpleValue::from(SPEC_VERSION));
    put(attributes::ID, SimpleValue::String(id));
    put(attributes::TYPE, SimpleValue::from(message.kind));
    put(
        attributes::SOURCE,
        SimpleValue::from(settings.source.as_str()),
    );
    if let Some(time) = message.occurred_at {
        put(
            attributes::TIME,
            SimpleValue::Timestamp(Timestamp::from_milliseconds(time.timestamp_millis())),
        );
    }
    if let Some(subject) = message
        .partition_key
        .and_then(|key| std::str::from_utf8(key).ok())
    {
        put(attributes::SUBJECT, SimpleValue::from(subject));
    }
    if let Some(context) = &message.trace.context {
        put(TRACEPARENT, SimpleValue::from(context.traceparent));
        if let Some(state) = context.tracestate {
            put(TRACESTATE, SimpleValue::from(state));
        }
    }
}

/// A JSON header value as an AMQP 1.0 application property, which holds only simple values:
/// strings, numbers and booleans as themselves, anything else as its JSON text.
fn simple_value(value: &serde_json::Value) -> SimpleValue {
    match value {
        serde_json::Value::String(text) => SimpleValue::from(text.as_str()),
        serde_json::Value::Bool(flag) => SimpleValue::Bool(*flag),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(integer), _) => SimpleValue::Long(integer),
            (None, Some(float)) => SimpleValue::from(float),
            (None, None) => SimpleValue::from(n.to_string()),
        },
        other => SimpleValue::from(other.to_string()),
    }
}

/// What one disposition means to the relay.
fn delivery_of(outcome: Result<Outcome, SendError>) -> Delivery {
    match outcome {
        Ok(Outcome::Accepted(_)) => Delivery::Confirmed,
        // RabbitMQ 4 answers `rejected` without an error where AMQP 0-9-1 answers a basic.nack
        // (a full queue with x-overflow reject-publish; seen on 4.0.5): the broker's state, not
        // the message's, so it spends no attempt, as a nack does. A rejection that gives its
        // reason (Artemis' full address, Service Bus) is the broker refusing the message.
        Ok(Outcome::Rejected(rejected)) => match rejected.error.as_ref() {
            None => Delivery::Unknown(Unconfirmed::Nacked),
            Some(error) => Delivery::Rejected(Rejection::Refused {
                error: error_text(error),
            }),
        },
        Ok(Outcome::Released(_) | Outcome::Modified(_)) => Delivery::Unknown(Unconfirmed::Released),
        // The link or the connection failed before the outcome arrived.
        Err(_) => Delivery::Unknown(Unconfirmed::BrokerUnavailable),
    }
}

/// `amqp:resource-limit-exceeded: Address "orders" is full.`: the condition's symbol, as the
/// AMQP 1.0 specification names it, and the broker's description.
fn error_text(error: &fe2o3_amqp::types::definitions::Error) -> String {
    let condition = match &error.condition {
        ErrorCondition::AmqpError(e) => Symbol::from(e).0,
        ErrorCondition::ConnectionError(e) => Symbol::from(e).0,
        ErrorCondition::SessionError(e) => Symbol::from(e).0,
        ErrorCondition::LinkError(e) => Symbol::from(e).0,
        ErrorCondition::Custom(symbol) => symbol.0.clone(),
    };
    match &error.description {
        Some(description) => format!("{condition}: {description}"),
        None => condition,
    }
}

/// A refused attach says why: an unknown address is the user's to fix, not an outage. Artemis
/// and Service Bus refuse the link; RabbitMQ 4 ends the whole session with the same condition,
/// so both are read.
fn attach_error(address: &str, error: SenderAttachError) -> ConnectError {
    let refusal = match &error {
        SenderAttachError::RemoteClosedWithError(e)
        | SenderAttachError::SessionStopped(SessionStopReason::RemoteEndedWithError(e)) => e,
        _ => return unavailable(error),
    };
    let detail = refusal.description.clone();
    match &refusal.condition {
        ErrorCondition::AmqpError(AmqpError::NotFound) => ConnectError::AddressNotFound {
            address: address.to_string(),
            detail: detail.unwrap_or_else(|| "amqp:not-found".into()),
        },
        // RabbitMQ 4 with the deprecated v1 address format not permitted
        // (deprecated_features.permit.amqp_address_v1 = false; 4.x's default may change).
        // Tried against 4.0.5 with the feature denied (tests/tests/services/broker_cluster.rs,
        // `on_rabbitmq_4_0_only`): it ends the session, condition amqp:invalid-field,
        // description `Attach rejected: {amqp_address_v1_not_permitted,\n {utf8,\n
        // <<"/exchange/NAME/KEY">>}}` (an Erlang term, its line breaks indented).
        ErrorCondition::AmqpError(AmqpError::InvalidField)
            if detail
                .as_deref()
                .is_some_and(|d| d.contains("amqp_address_v1_not_permitted")) =>
        {
            ConnectError::Refused {
                kind: Refusal::Settings,
                message: format!(
                    "the broker refuses the address {address} in the v1 format (RabbitMQ 4): give \
                     --address (spec.broker.address) in the v2 format, /queues/NAME for a queue \
                     or /exchanges/NAME/ROUTING-KEY for an exchange"
                ),
            }
        }
        _ => unavailable(error),
    }
}

impl Publisher for Amqp10Publisher {
    async fn publish_batch(&mut self, target: Target, messages: &[Message<'_>]) -> BatchOutcome {
        if messages.is_empty() {
            return BatchOutcome::empty();
        }
        match target {
            Target::Main => self.publish_main(messages).await,
            // Configuration refuses a dead-letter exchange under AMQP 1.0, so the batch
            // protocol never asks; should it, nothing is claimed to have been sent.
            Target::DeadLetter => BatchOutcome {
                deliveries: vec![Delivery::Unknown(Unconfirmed::BrokerUnavailable); messages.len()],
                broken: None,
                publish_time: Duration::ZERO,
            },
        }
    }

    fn opened_at(&self) -> Instant {
        self.opened_at
    }

    fn is_connected(&self) -> bool {
        !self.failed && !self.connection.is_closed() && !self.session.is_ended()
    }

    /// Detach, end, close, each step bounded by [`CLOSE_STEP`]: fe2o3-amqp 0.18 waits for the
    /// broker's answer to each without a limit (and its session task spins while it waits for
    /// `end`), so a broker that stopped answering would hold a reconnecting worker, or a
    /// shutdown, forever. Closing the connection stops the session's task either way.
    async fn close(mut self) {
        let _ = tokio::time::timeout(CLOSE_STEP, self.sender.close()).await;
        let _ = tokio::time::timeout(CLOSE_STEP, self.session.end()).await;
        let _ = tokio::time::timeout(CLOSE_STEP, self.connection.close()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended_session(condition: AmqpError, description: &str) -> SenderAttachError {
        SenderAttachError::SessionStopped(SessionStopReason::RemoteEndedWithError(
            fe2o3_amqp::types::definitions::Error::new(
                condition,
                Some(description.to_string()),
                None,
            ),
        ))
    }

    /// What RabbitMQ 4.0.5 answered (Debian 13's package; for v1, on the tests' 4.0 cluster,
    /// which denies it): it ends the session instead of refusing the link.
    #[test]
    fn rabbitmq_4s_ended_sessions_name_the_address_and_the_format() {
        let missing = attach_error(
            "/queues/orders",
            ended_session(AmqpError::NotFound, "no queue 'orders' in vhost '/'"),
        );
        assert!(
            matches!(&missing, ConnectError::AddressNotFound { address, detail }
                if address == "/queues/orders" && detail.contains("no queue 'orders'")),
            "{missing:?}"
        );
        let v1 = attach_error(
            "/amq/queue/orders",
            ended_session(
                AmqpError::InvalidField,
                "Attach rejected: {amqp_address_v1_not_permitted,\n                     {utf8,\n                         <<\"/amq/queue/orders\">>}}",
            ),
        );
        match v1 {
            ConnectError::Refused {
                kind: Refusal::Settings,
                message,
            } => {
                assert!(message.contains("/amq/queue/orders"), "{message}");
                assert!(message.contains("/queues/NAME"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Any other ended session stays an outage.
        let other = attach_error(
            "/queues/orders",
            ended_session(AmqpError::InternalError, "node down"),
        );
        assert!(matches!(other, ConnectError::Unavailable(_)), "{other:?}");
    }

    #[test]
    fn outcomes_map_to_the_relays_deliveries() {
        use fe2o3_amqp::types::messaging::{Accepted, Modified, Rejected, Released};
        assert_eq!(
            delivery_of(Ok(Outcome::Accepted(Accepted {}))),
            Delivery::Confirmed
        );
        let full = fe2o3_amqp::types::definitions::Error::new(
            AmqpError::ResourceLimitExceeded,
            Some("Address \"orders\" is full.".to_string()),
            None,
        );
        let refused = delivery_of(Ok(Outcome::Rejected(Rejected { error: Some(full) })));
        assert_eq!(
            refused,
            Delivery::Rejected(Rejection::Refused {
                error: "amqp:resource-limit-exceeded: Address \"orders\" is full.".into()
            })
        );
        // RabbitMQ 4's answer where AMQP 0-9-1 nacks: no reason, the broker's state.
        assert_eq!(
            delivery_of(Ok(Outcome::Rejected(Rejected { error: None }))),
            Delivery::Unknown(Unconfirmed::Nacked)
        );
        for not_taken in [
            Outcome::Released(Released {}),
            Outcome::Modified(Modified {
                delivery_failed: Some(true),
                undeliverable_here: None,
                message_annotations: None,
            }),
        ] {
            assert_eq!(
                delivery_of(Ok(not_taken)),
                Delivery::Unknown(Unconfirmed::Released)
            );
        }
        assert_eq!(
            delivery_of(Err(SendError::IllegalDeliveryState)),
            Delivery::Unknown(Unconfirmed::BrokerUnavailable)
        );
    }

    #[test]
    fn a_batch_cut_short_is_settled_by_what_arrived() {
        use fe2o3_amqp::types::messaging::{Accepted, Released};
        let accepted = || Some(Ok(Outcome::Accepted(Accepted {})));
        let unavailable = Delivery::Unknown(Unconfirmed::BrokerUnavailable);

        // Everything arrived: nothing failed.
        let (deliveries, failure) = deliveries_of(vec![accepted(), accepted()], 2, false);
        assert_eq!(deliveries, [Delivery::Confirmed, Delivery::Confirmed]);
        assert!(failure.is_none());

        // The wait timed out after the first disposition; the third message was never sent.
        let (deliveries, _) = deliveries_of(vec![accepted(), None], 3, true);
        assert_eq!(
            deliveries,
            [
                Delivery::Confirmed,
                Delivery::Unknown(Unconfirmed::Timeout),
                unavailable.clone(),
            ]
        );

        // A disposition failed with the link: an outage, even though the wait itself ended well.
        let (deliveries, failure) = deliveries_of(
            vec![accepted(), Some(Err(SendError::IllegalDeliveryState))],
            2,
            false,
        );
        assert_eq!(deliveries, [Delivery::Confirmed, unavailable]);
        assert!(matches!(failure, Some(BrokerFailure::Confirm(_))));

        // Released messages are counted, so the worker backs off.
        let released = || Some(Ok(Outcome::Released(Released {})));
        let (_, failure) = deliveries_of(vec![released(), accepted(), released()], 3, false);
        assert!(matches!(failure, Some(BrokerFailure::Released(2))));
    }

    #[test]
    fn json_headers_become_simple_values() {
        assert_eq!(
            simple_value(&serde_json::json!("eu")),
            SimpleValue::from("eu")
        );
        assert_eq!(simple_value(&serde_json::json!(7)), SimpleValue::Long(7));
        assert_eq!(
            simple_value(&serde_json::json!(true)),
            SimpleValue::Bool(true)
        );
        assert_eq!(
            simple_value(&serde_json::json!({"a": [1]})),
            SimpleValue::from("{\"a\":[1]}")
        );
    }
}
