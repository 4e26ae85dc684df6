//! A claimed row as the protocol holds it, and what can be wrong with it as a message.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::broker::headers::HeadersError;
use crate::defaults::AMQP_SHORT_STRING_MAX;

/// A claimed row, decoded.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: Uuid,
    pub kind: Option<String>,
    pub payload: Option<Vec<u8>>,
    pub occurred_at: Option<DateTime<Utc>>,
    pub routing_key: Option<String>,
    pub headers: Option<serde_json::Value>,
    pub attempts: i32,
    /// The partition key's bytes (per-key ordering groups by them); None when unmapped or NULL.
    pub partition_key: Option<Vec<u8>>,
    /// The W3C `traceparent` and `tracestate` of the trace-context columns; None when
    /// unmapped, NULL or not UTF-8 (then the headers column may still carry them).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The row's lane under per-key ordering (`runtime::lanes`); None for unordered claims.
    pub lane: Option<i32>,
    /// The error the row had when a settling claim took it (what it keeps if it is put back
    /// untouched; cleared if it is published); None for other claims, or when it had none.
    pub prior_error: Option<String>,
    /// Set when a column could not be read as the message needs it.
    pub malformed: Option<Malformed>,
}

/// A column of the claim that a message needs in a certain shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Type,
    Payload,
    RoutingKey,
}

impl std::fmt::Display for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Column::Type => "type",
            Column::Payload => "payload",
            Column::RoutingKey => "routing key",
        })
    }
}

/// Why a row cannot become a message: it is dead-lettered at once, with this text as its error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("malformed row: the {0} is not valid UTF-8")]
    NotUtf8(Column),
    #[error("malformed row: the {0} column is NULL")]
    Null(Column),
    #[error("malformed row: {column} is {len} bytes; AMQP allows at most {max}", max = AMQP_SHORT_STRING_MAX)]
    TooLong { column: Column, len: usize },
    #[error("malformed row: {0}")]
    Headers(#[from] HeadersError),
}

#[cfg(test)]
impl ClaimedRow {
    /// A well-formed row, for tests to vary.
    pub fn sample() -> Self {
        ClaimedRow {
            id: Uuid::nil(),
            kind: Some("OrderCreated".into()),
            payload: Some(b"{}".to_vec()),
            occurred_at: None,
            routing_key: Some("orders".into()),
            headers: None,
            attempts: 0,
            partition_key: None,
            traceparent: None,
            tracestate: None,
            lane: None,
            prior_error: None,
            malformed: None,
        }
    }
}
