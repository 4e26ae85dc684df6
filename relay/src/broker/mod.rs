//! Publishing hides behind a small trait: publish a batch pipelined, then await its confirms.
//! The batch protocol is generic over it, so another broker protocol plugs in without touching
//! the claim loop. RabbitMQ (AMQP 0-9-1, through lapin) is the one implemented, in [`amqp`].

pub mod amqp;
pub mod headers;
pub mod routing;

use std::future::Future;
use std::time::Duration;

use lapin::types::FieldTable;
use uuid::Uuid;

use crate::metrics::FailureReason;

/// One message ready to go out; borrowed from the claimed row, so nothing is copied twice.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub id: Uuid,
    pub kind: &'a str,
    pub routing_key: &'a str,
    pub payload: &'a [u8],
    /// Seconds since the epoch (AMQP timestamp).
    pub timestamp: Option<u64>,
    pub headers: Option<FieldTable>,
}

/// Which exchange a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    DeadLetter,
}

/// What became of one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The broker confirmed it (or confirms are off and it was written to the socket).
    Confirmed,
    /// The broker refused it: spends an attempt.
    Rejected {
        reason: FailureReason,
        detail: String,
    },
    /// The connection failed or no confirm arrived in time: nothing is known, the row stays
    /// pending and no attempt is spent.
    Unknown { reason: FailureReason },
}

/// The deliveries of one batch, in the order of the messages, and whether the connection must
/// be replaced before the next batch.
#[derive(Debug)]
pub struct BatchOutcome {
    pub deliveries: Vec<Delivery>,
    pub broken: Option<String>,
    /// Time spent handing the messages to the connection, before waiting for confirms.
    pub publish_time: Duration,
}

pub trait Publisher: Send {
    /// Publishes every message pipelined, then awaits every confirm within the timeout.
    fn publish_batch(
        &mut self,
        target: Target,
        messages: &[Message<'_>],
    ) -> impl Future<Output = BatchOutcome> + Send;
    /// Cheap check that the connection is usable, for readiness.
    fn is_connected(&self) -> bool;
}
