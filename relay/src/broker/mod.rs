//! Publishing hides behind two small traits: a [`Connector`] opens a [`Publisher`], which
//! publishes a batch pipelined and then awaits its confirms. The worker and the batch protocol
//! are generic over them, so another broker protocol plugs in without touching the claim loop.
//! Two are implemented: RabbitMQ's AMQP 0-9-1 (through lapin) in [`amqp`], and AMQP 1.0 (Azure
//! Service Bus, ActiveMQ Artemis, RabbitMQ's AMQP 1.0; through fe2o3-amqp) in [`amqp10`].

pub mod amqp;
pub mod amqp10;
pub mod cloudevents;
pub mod headers;
pub mod nodes;
pub mod routing;
pub mod tls;
pub mod trace_context;
pub mod urls;

use std::error::Error;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// The wire protocol of the broker.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BrokerProtocol {
    /// AMQP 0-9-1: RabbitMQ's own protocol, publishing to an exchange.
    #[default]
    Amqp091,
    /// AMQP 1.0: a sender link to an address (a queue or topic).
    Amqp10,
}

impl BrokerProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerProtocol::Amqp091 => "amqp091",
            BrokerProtocol::Amqp10 => "amqp10",
        }
    }
}

/// One message ready to go out; borrowed from the claimed row, so nothing is copied twice.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub id: Uuid,
    pub kind: &'a str,
    pub routing_key: &'a str,
    pub payload: &'a [u8],
    /// Seconds since the epoch (AMQP timestamp).
    pub timestamp: Option<u64>,
    /// The row's headers, a JSON object that [`headers::check`] accepted.
    pub headers: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// Why a dead letter was given up on, sent along as the `x-outbox-error` header.
    pub error: Option<&'a str>,
    /// The row's W3C trace context: sent as the `traceparent` and `tracestate` headers (which
    /// replace any of those names in `headers`).
    pub trace: trace_context::MessageTrace<'a>,
    /// The row's claim position, the CloudEvents `time` attribute.
    pub occurred_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The row's partition key as the claim read it (text; None when unmapped or NULL), the
    /// CloudEvents `subject` attribute.
    pub partition_key: Option<&'a [u8]>,
}

/// Which exchange a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    DeadLetter,
}

/// Why the broker refused the message itself: the message spends an attempt. The text is what
/// the row's error column records. A `basic.nack` is not one: it says the broker cannot take
/// messages now (a quorum queue without a majority, a full queue with `x-overflow:
/// reject-publish`), whatever the message, so it is [`Unconfirmed::Nacked`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Returned by the broker (a mandatory publish nothing was bound for), with its reply.
    #[error("returned by the broker as unroutable: {reply}")]
    Unroutable { reply: String },
    /// An AMQP 1.0 `rejected` outcome, with the broker's error condition and description.
    #[error("rejected by the broker: {error}")]
    Refused { error: String },
}

/// Why nothing is known about a message: the row stays pending and no attempt is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unconfirmed {
    /// Never handed to the broker, or its confirm was lost with the connection.
    #[error("the broker connection failed")]
    BrokerUnavailable,
    /// No confirm arrived within the publish timeout.
    #[error("no confirm within the publish timeout")]
    Timeout,
    /// An AMQP 1.0 `released` or `modified` outcome: the broker did not take the message (for
    /// example a full queue) and said it may be sent again.
    #[error("released by the broker without being taken")]
    Released,
    /// A `basic.nack`, or RabbitMQ 4's AMQP 1.0 `rejected` without a reason: the broker's state
    /// (no quorum, a full queue that rejects publishes), not the message's fault. The row stays
    /// pending, no attempt is spent, the worker pauses.
    #[error("negatively acknowledged (basic.nack) by the broker")]
    Nacked,
}

/// What became of one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The broker confirmed it (or confirms are off and it was written to the socket).
    Confirmed,
    Rejected(Rejection),
    Unknown(Unconfirmed),
}

/// Why a publisher must be replaced before the next batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerFailure {
    #[error("publish failed: {0}")]
    Publish(Arc<dyn Error + Send + Sync>),
    #[error("confirm failed: {0}")]
    Confirm(Arc<dyn Error + Send + Sync>),
    /// A late confirm on the same channel would be ambiguous, so the channel is replaced.
    #[error("no confirm within {0:?}")]
    ConfirmTimeout(Duration),
    /// The broker released messages instead of taking them: back off before sending again,
    /// as after an outage, rather than resend at once into the same refusal.
    #[error("the broker released {0} message(s) without taking them")]
    Released(usize),
    /// Another worker's publish got no confirm just before this one's turn: the path to the
    /// broker is likely gone for every connection (a cut), so this connection is tried again
    /// by reconnecting, with no rows held, rather than by waiting out a publish timeout of its
    /// own with the rows locked.
    #[error("another worker's publish got no confirm just now; reconnecting before publishing")]
    PeerTimedOut,
}

/// What a user must fix when a broker connection is refused, as a condition reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The TLS handshake: trust, host name, expiry, client certificate.
    Tls,
    /// The login: user, password, certificate user.
    Auth,
    /// A file or option that cannot be used as given.
    Settings,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Tls => "BrokerTLS",
            Refusal::Auth => "BrokerAuth",
            Refusal::Settings => "BrokerSettings",
        }
    }
}

/// Why a [`Connector`] could not open a publisher. A missing exchange gets its own variant: the
/// broker answered, so "cannot reach the broker" would send the user looking in the wrong place,
/// and only someone declaring the exchange fixes it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "exchange {exchange} does not exist on vhost {vhost}: declare it, or pass --declare-exchange TYPE"
    )]
    ExchangeNotFound { exchange: String, vhost: String },
    /// The AMQP 1.0 broker refused to attach a sender to the address (amqp:not-found).
    #[error(
        "address {address} does not exist on the broker ({detail}): create it, or fix --address"
    )]
    AddressNotFound { address: String, detail: String },
    /// A refusal someone must fix (TLS, login, a file): retried, and shown on `/readyz`.
    #[error("{message}")]
    Refused { kind: Refusal, message: String },
    /// The broker is down or unreachable, or failed otherwise.
    #[error("{0}")]
    Unavailable(Arc<dyn Error + Send + Sync>),
}

impl ConnectError {
    /// The cause as a code: the metric label, and the problem code where one is reported.
    pub fn code(&self) -> &'static str {
        match self {
            ConnectError::ExchangeNotFound { .. } => "ExchangeNotFound",
            ConnectError::AddressNotFound { .. } => "AddressNotFound",
            ConnectError::Refused { kind, .. } => kind.code(),
            ConnectError::Unavailable(_) => "BrokerUnreachable",
        }
    }
}

/// The deliveries of one batch, in the order of the messages, and whether the connection must
/// be replaced before the next batch.
#[derive(Debug)]
pub struct BatchOutcome {
    pub deliveries: Vec<Delivery>,
    pub broken: Option<BrokerFailure>,
    /// Time spent handing the messages to the connection, before waiting for confirms.
    pub publish_time: Duration,
}

impl BatchOutcome {
    /// The outcome of publishing nothing.
    pub fn empty() -> Self {
        Self {
            deliveries: Vec::new(),
            broken: None,
            publish_time: Duration::ZERO,
        }
    }

    /// `count` messages never handed to the broker (it blocks publishing): their rows stay
    /// pending with no attempt spent, and the connection is kept.
    pub fn not_sent(count: usize) -> Self {
        Self {
            deliveries: vec![Delivery::Unknown(Unconfirmed::BrokerUnavailable); count],
            broken: None,
            publish_time: Duration::ZERO,
        }
    }

    /// [`BatchOutcome::not_sent`], with the connection to be replaced for `why`.
    pub fn not_sent_replacing(count: usize, why: BrokerFailure) -> Self {
        Self {
            broken: Some(why),
            ..Self::not_sent(count)
        }
    }
}

/// One open connection to a broker, able to publish batches.
pub trait Publisher: Send {
    /// Publishes every message pipelined, then awaits every confirm within the timeout. Returns
    /// one delivery per message, in order.
    fn publish_batch(
        &mut self,
        target: Target,
        messages: &[Message<'_>],
    ) -> impl Future<Output = BatchOutcome> + Send;

    /// Cheap check that the connection is usable, for readiness and reconnects.
    fn is_connected(&self) -> bool;

    /// When the connection was opened: one opened after another worker's publish timed out has
    /// proven the path to the broker since, so it publishes as usual.
    fn opened_at(&self) -> Instant;

    /// True while the broker refuses to take publishes on this connection (RabbitMQ's
    /// `connection.blocked` under a memory or disk alarm): a publish would only wait, so the
    /// worker claims nothing meanwhile, and holds no rows while it waits.
    fn is_blocked(&self) -> bool {
        false
    }

    /// Closes the connection politely; a publisher dropped without it just goes away.
    fn close(self) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        async {}
    }
}

/// Opens publishers: what a worker keeps to connect and reconnect, so it never names a broker.
pub trait Connector: Clone + Send + Sync + 'static {
    type Publisher: Publisher;

    fn connect(&self) -> impl Future<Output = Result<Self::Publisher, ConnectError>> + Send;

    /// Where it connects to, for logs (never with a password).
    fn endpoint(&self) -> &(dyn Display + Sync);
}
