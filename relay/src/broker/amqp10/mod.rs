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
use std::time::{Duration, Instant};

use fe2o3_amqp::link::{SendError, SenderAttachError};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition, SenderSettleMode};
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Data, Header, Message as AmqpMessage, MessageId, Outcome, Properties,
    Source, Target as LinkTarget,
};
use fe2o3_amqp::types::primitives::{Array, Binary, SimpleValue, Symbol, Timestamp};
use fe2o3_amqp::{Sendable, Sender, Session};
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

mod connect;

use connect::unavailable;

use super::{
    BatchOutcome, BrokerFailure, ConnectError, Connector, Delivery, Message, Publisher, Rejection,
    Target, Unconfirmed,
};
use crate::secret_url::SecretUrl;

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
}

impl Amqp10Publisher {
    pub async fn connect(url: &SecretUrl, settings: Amqp10Settings) -> Result<Self, ConnectError> {
        // The user and password of the URL go through SASL PLAIN (Service Bus: the policy name
        // and its key). Errors name no URL.
        let mut connection = connect::open(url, &settings.container_id).await?;
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
        let mut broken = None;
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let sendable = Sendable::from(amqp_message(settings, message));
            // Waits for link credit when the broker grants less than a batch: flow control,
            // bounded by the same deadline as the confirms.
            tokio::select! {
                sent = tokio::time::timeout_at(deadline, sender.send_batchable(sendable)) => match sent {
                    Ok(Ok(delivery)) => pending.push(delivery),
                    Ok(Err(e)) => {
                        broken = Some(BrokerFailure::Publish(Arc::new(e)));
                        break;
                    }
                    Err(_) => {
                        broken = Some(BrokerFailure::ConfirmTimeout(settings.timeout));
                        break;
                    }
                },
                end = &mut closed => {
                    broken = Some(BrokerFailure::Publish(connection_lost(end)));
                    break;
                }
            }
        }
        let publish_time = started.elapsed();
        let sent = pending.len();
        let mut outcomes: Vec<Option<Delivery>> = vec![None; sent];
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
                    Some((index, outcome)) => outcomes[index] = Some(delivery_of(outcome)),
                    None => break,
                },
                end = &mut closed => {
                    broken = Some(BrokerFailure::Confirm(connection_lost(end)));
                }
                () = &mut expired => {
                    // A late disposition on this link would be ambiguous: the link is replaced.
                    broken = Some(BrokerFailure::ConfirmTimeout(settings.timeout));
                }
            }
        }
        // What had arrived when the wait ended still counts; the rest is unknown.
        while let Some(Some((index, outcome))) = waiting.next().now_or_never() {
            outcomes[index] = Some(delivery_of(outcome));
        }
        let timed_out = matches!(broken, Some(BrokerFailure::ConfirmTimeout(_)));
        let mut released = 0;
        let mut deliveries: Vec<Delivery> = outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Some(delivery) => delivery,
                None if timed_out => Delivery::Unknown(Unconfirmed::Timeout),
                None => Delivery::Unknown(Unconfirmed::BrokerUnavailable),
            })
            .inspect(|delivery| {
                if *delivery == Delivery::Unknown(Unconfirmed::Released) {
                    released += 1;
                }
            })
            .collect();
        if broken.is_none()
            && deliveries.iter().any(|delivery| {
                matches!(delivery, Delivery::Unknown(Unconfirmed::BrokerUnavailable))
            })
        {
            broken = Some(BrokerFailure::Confirm(Arc::new(std::io::Error::other(
                "the link failed while awaiting outcomes",
            ))));
        }
        // Messages never handed over (the send failed or timed out first).
        deliveries.resize(
            messages.len(),
            Delivery::Unknown(Unconfirmed::BrokerUnavailable),
        );
        if released > 0 {
            broken.get_or_insert(BrokerFailure::Released(released));
        }
        *failed |= broken.is_some();
        BatchOutcome {
            deliveries,
            broken,
            publish_time,
        }
    }
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
/// creation-time = occurred-at, the headers as application properties; durable.
fn amqp_message(settings: &Amqp10Settings, message: &Message<'_>) -> AmqpMessage<Data> {
    let mut properties = Properties::builder()
        .message_id(MessageId::String(message.id.to_string()))
        .subject(message.kind.to_string())
        .content_type(Symbol::from(settings.content_type.as_str()))
        .build();
    properties.creation_time = message
        .timestamp
        .map(|seconds| Timestamp::from_milliseconds(seconds as i64 * 1000));
    let mut application = ApplicationProperties::builder();
    if let Some(headers) = message.headers {
        for (name, value) in headers {
            application = application.insert(name.clone(), simple_value(value));
        }
    }
    if let Some(error) = message.error {
        application = application.insert("x-outbox-error", SimpleValue::from(error));
    }
    AmqpMessage::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .properties(properties)
        .application_properties(application.build())
        .data(Binary::from(message.payload.to_vec()))
        .build()
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
        Ok(Outcome::Rejected(rejected)) => Delivery::Rejected(Rejection::Refused {
            error: rejected
                .error
                .as_ref()
                .map_or("no reason given".to_string(), error_text),
        }),
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

/// A refused attach says why: an unknown address is the user's to fix, not an outage.
fn attach_error(address: &str, error: SenderAttachError) -> ConnectError {
    match error {
        SenderAttachError::RemoteClosedWithError(e)
            if e.condition == ErrorCondition::AmqpError(AmqpError::NotFound) =>
        {
            ConnectError::AddressNotFound {
                address: address.to_string(),
                detail: e.description.unwrap_or_else(|| "amqp:not-found".into()),
            }
        }
        other => unavailable(other),
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

    #[test]
    fn outcomes_map_to_the_relays_deliveries() {
        use fe2o3_amqp::types::messaging::{Accepted, Modified, Rejected, Released};
        assert_eq!(
            delivery_of(Ok(Outcome::Accepted(Accepted {}))),
            Delivery::Confirmed
        );
        let refused = delivery_of(Ok(Outcome::Rejected(Rejected { error: None })));
        assert!(matches!(
            refused,
            Delivery::Rejected(Rejection::Refused { .. })
        ));
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
