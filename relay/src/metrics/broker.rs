//! The broker side of a process beyond "connected": which nodes of a broker list its workers
//! are on, how often they moved, and how often the broker's nacks made them pause.

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::registered;

#[derive(Clone)]
pub struct BrokerMetrics {
    /// Workers connected to each node, labelled with the node's host:port (never a URL).
    pub node_connections: IntGaugeVec,
    /// Connections made to another node than the process's previous one.
    pub node_moves: IntCounter,
    /// Pauses taken because the broker nacked messages (the messages themselves are counted by
    /// `outbox_relay_publish_failures_total{reason="nack"}`).
    pub nack_pauses: IntCounter,
    /// Failed connects by cause (BrokerUnreachable, BrokerAuth, BrokerTLS, BrokerSettings,
    /// ExchangeNotFound, AddressNotFound): the log says a cause once a minute, this counts each.
    pub connect_failures: IntCounterVec,
}

impl BrokerMetrics {
    pub fn new(r: &Registry) -> Self {
        Self {
            node_connections: registered(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "outbox_relay_broker_node_connections",
                        "Workers connected to each broker node (host:port) of the broker list",
                    ),
                    &["node"],
                ),
            ),
            node_moves: registered(
                r,
                IntCounter::new(
                    "outbox_relay_broker_node_moves_total",
                    "Times the process connected to another broker node than before",
                ),
            ),
            connect_failures: registered(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "outbox_relay_broker_connect_failures_total",
                        "Failed broker connects by cause (reason: BrokerUnreachable, BrokerAuth, \
                         BrokerTLS, BrokerSettings, ExchangeNotFound, AddressNotFound)",
                    ),
                    &["reason"],
                ),
            ),
            nack_pauses: registered(
                r,
                IntCounter::new(
                    "outbox_relay_broker_nack_pauses_total",
                    "Pauses taken because the broker nacked messages (no attempt is spent)",
                ),
            ),
        }
    }
}
