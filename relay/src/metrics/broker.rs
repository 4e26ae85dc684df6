//! The broker side of a process beyond "connected": which nodes of a broker list its workers
//! are on, how often they moved, and how often the broker's nacks made them pause.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// When a publish last ended on a connection the broker blocks: noted before its publish
    /// slot is released, so the next holder gives its claim back instead of publishing into the
    /// alarm before that worker's loop has counted its blocked connection.
    blocked_publish_at: Arc<Mutex<Option<Instant>>>,
    /// When a publish last got no confirm within its deadline: noted before its publish slot
    /// is released, so the workers queued for the slot behind it (their rows already claimed)
    /// reconnect instead of each waiting out a deadline of its own into the same silence.
    timed_out_publish_at: Arc<Mutex<Option<Instant>>>,
}

/// How long a blocked or timed-out publish stops the next slot holders: longer than a batch's
/// commit and the worker's return to its loop, where the blocked connection is counted.
const PUBLISH_NOTICE: Duration = Duration::from_secs(5);

fn note(at: &Mutex<Option<Instant>>) {
    *at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
}

fn recently(at: &Mutex<Option<Instant>>) -> bool {
    at.lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some_and(|at| at.elapsed() < PUBLISH_NOTICE)
}

impl BrokerMetrics {
    /// A publish just ended on a blocked connection.
    pub fn note_blocked_publish(&self) {
        note(&self.blocked_publish_at);
    }

    /// Whether a publish ended on a blocked connection within the last few seconds.
    pub fn blocked_publish_recently(&self) -> bool {
        recently(&self.blocked_publish_at)
    }

    /// A publish just got no confirm within its deadline.
    pub fn note_timed_out_publish(&self) {
        note(&self.timed_out_publish_at);
    }

    /// Whether a publish got no confirm within its deadline in the last few seconds, after
    /// `opened` (a connection opened since has proven the path, and is not suspect).
    pub fn timed_out_publish_since(&self, opened: Instant) -> bool {
        recently(&self.timed_out_publish_at)
            && self
                .timed_out_publish_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|at| at > opened)
    }

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
            blocked_publish_at: Arc::default(),
            timed_out_publish_at: Arc::default(),
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
