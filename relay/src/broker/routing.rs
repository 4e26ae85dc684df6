//! Where messages go: the exchange type the relay may declare and where a routing key comes
//! from.

/// Exchange types the relay can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeType {
    Fanout,
    Topic,
    Direct,
    Headers,
}

/// Where the routing key of a message comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingKey {
    /// The row's type (the default: consumers bind queues by message type).
    Type,
    /// The mapped routing-key column; rows where it is NULL fall back to the type.
    Column,
    /// One routing key for every message.
    Static(String),
}
