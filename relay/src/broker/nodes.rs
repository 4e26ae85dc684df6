//! Several broker nodes behind one [`Connector`]: a RabbitMQ cluster, or an AMQP 1.0 live/backup
//! pair. lapin and fe2o3-amqp each connect to one URL (lapin #290: no cluster support), so the
//! node list is this layer's, the same for both protocols.
//!
//! A process's workers share one position in the list. A connect tries the nodes in turn from
//! that position, each under [`NODE_CONNECT_TIMEOUT`]; the first that takes the connection
//! becomes the position. Only when a whole round failed does the error reach the worker, which
//! backs off as before (`runtime::backoff`). A publisher whose connection broke moves the
//! position past its node, so the next connect starts at the next node instead of the one that
//! just dropped it.
//!
//! The first position is random: relay processes given the same list spread their connections
//! over the nodes instead of piling onto the first (whose loss would then move them all at
//! once), and a list's order states no preference. The messages that were unconfirmed on a lost
//! connection need nothing from here: the batch leaves their rows untouched, the transaction
//! releases them, and the worker's next claim (from the head, see `protocol::cursor`) publishes
//! them again over the new connection.

use std::fmt::{self, Display};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tracing::info;

use super::urls::{BrokerUrls, host_port};
use super::{BatchOutcome, ConnectError, Connector, Message, Publisher, Target};
use crate::metrics::BrokerMetrics;

/// The longest one node may take to open a publisher (TCP, TLS, AMQP open, channel, checks)
/// before the next node is tried: a node that stopped answering (a network partition, a
/// paused VM) would otherwise hold the round for the operating system's connect timeout.
pub const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Nothing announced yet.
const NONE: usize = usize::MAX;

struct Node<C> {
    connector: C,
    /// host:port, for logs and the metric label.
    label: String,
}

/// The position the workers of a process share.
struct Position {
    current: AtomicUsize,
    /// The node the last log line named, so a move is said once per process, not per worker.
    announced: AtomicUsize,
}

impl Position {
    /// Moves past `index`, unless another worker has moved already.
    fn leave(&self, index: usize, count: usize) {
        let _ = self.current.compare_exchange(
            index,
            (index + 1) % count,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

/// Opens publishers on the first node of the list, from the shared position, that takes one.
pub struct NodeList<C> {
    nodes: Arc<[Node<C>]>,
    position: Arc<Position>,
    urls: Arc<BrokerUrls>,
    metrics: BrokerMetrics,
}

impl<C: Clone> Clone for NodeList<C> {
    fn clone(&self) -> Self {
        Self {
            nodes: self.nodes.clone(),
            position: self.position.clone(),
            urls: self.urls.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<C: Connector> NodeList<C> {
    /// One connector per URL of `urls`, made by `connector`.
    pub fn new(
        urls: &BrokerUrls,
        connector: impl Fn(&crate::connect::secret_url::SecretUrl) -> C,
        metrics: BrokerMetrics,
    ) -> Self {
        let nodes: Vec<Node<C>> = urls
            .iter()
            .map(|url| Node {
                connector: connector(url),
                label: host_port(url),
            })
            .collect();
        let start = rand::rng().random_range(0..nodes.len().max(1));
        Self {
            nodes: nodes.into(),
            position: Arc::new(Position {
                current: AtomicUsize::new(start),
                announced: AtomicUsize::new(NONE),
            }),
            urls: Arc::new(urls.clone()),
            metrics,
        }
    }

    fn count(&self) -> usize {
        self.nodes.len()
    }

    /// Says which node the process is on, when that changed.
    fn arrived(&self, index: usize) {
        let before = self.position.announced.swap(index, Ordering::Relaxed);
        if before == index {
            return;
        }
        if before != NONE {
            self.metrics.node_moves.inc();
        }
        if self.count() > 1 {
            info!(
                node = %self.nodes[index].label,
                "connected to broker node {}/{} {}",
                index + 1,
                self.count(),
                self.nodes[index].label
            );
        }
    }
}

/// A node that did not open a publisher within [`NODE_CONNECT_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("no connection within {0:?}")]
struct ConnectTimeout(Duration);

/// Every node of a round failed: what each said, in one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RoundFailed(String);

impl<C: Connector> Connector for NodeList<C> {
    type Publisher = NodePublisher<C::Publisher>;

    async fn connect(&self) -> Result<Self::Publisher, ConnectError> {
        let count = self.count();
        let start = self.position.current.load(Ordering::Relaxed) % count;
        let mut failures = Vec::with_capacity(count);
        for step in 0..count {
            let index = (start + step) % count;
            let node = &self.nodes[index];
            let attempt = tokio::time::timeout(NODE_CONNECT_TIMEOUT, node.connector.connect())
                .await
                .unwrap_or_else(|_| {
                    Err(ConnectError::Unavailable(Arc::new(ConnectTimeout(
                        NODE_CONNECT_TIMEOUT,
                    ))))
                });
            match attempt {
                Ok(publisher) => {
                    self.position.current.store(index, Ordering::Relaxed);
                    self.arrived(index);
                    let gauge = self
                        .metrics
                        .node_connections
                        .with_label_values(&[node.label.as_str()]);
                    gauge.inc();
                    return Ok(NodePublisher {
                        inner: publisher,
                        index,
                        count,
                        position: self.position.clone(),
                        _counted: Counted(gauge),
                    });
                }
                Err(error) => {
                    self.position.leave(index, count);
                    failures.push((index, error));
                }
            }
        }
        Err(round_error(&self.nodes, failures))
    }

    fn endpoint(&self) -> &(dyn Display + Sync) {
        &*self.urls
    }
}

/// The error of a failed round. One node: its own error, as without a list. Several: one line
/// naming each node and its error, with the kind of the first refusal a user must fix (TLS,
/// login, settings) if any, so `/readyz` and the conditions keep their reasons; a missing
/// exchange or address is the broker's fact, said as is.
fn round_error<C>(nodes: &[Node<C>], mut failures: Vec<(usize, ConnectError)>) -> ConnectError {
    if failures.len() == 1 {
        return failures.remove(0).1;
    }
    let count = nodes.len();
    let said: Vec<String> = failures
        .iter()
        .map(|(index, error)| {
            format!(
                "node {}/{count} {}: {error}",
                index + 1,
                nodes[*index].label
            )
        })
        .collect();
    let message = format!(
        "none of the {count} broker nodes took the connection: {}",
        said.join("; ")
    );
    let refusal = failures.iter().find_map(|(_, error)| match error {
        ConnectError::Refused { kind, .. } => Some(*kind),
        _ => None,
    });
    if let Some(kind) = refusal {
        return ConnectError::Refused { kind, message };
    }
    let not_found = failures.iter().position(|(_, error)| {
        matches!(
            error,
            ConnectError::ExchangeNotFound { .. } | ConnectError::AddressNotFound { .. }
        )
    });
    if let Some(at) = not_found {
        return failures.swap_remove(at).1;
    }
    ConnectError::Unavailable(Arc::new(RoundFailed(message)))
}

/// Takes a worker's connection off its node's gauge when the publisher goes.
struct Counted(prometheus::IntGauge);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A publisher on one node of the list.
pub struct NodePublisher<P> {
    inner: P,
    index: usize,
    count: usize,
    position: Arc<Position>,
    _counted: Counted,
}

impl<P> fmt::Debug for NodePublisher<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodePublisher(node {}/{})", self.index + 1, self.count)
    }
}

impl<P: Publisher> Publisher for NodePublisher<P> {
    async fn publish_batch(&mut self, target: Target, messages: &[Message<'_>]) -> BatchOutcome {
        let outcome = self.inner.publish_batch(target, messages).await;
        if outcome.broken.is_some() {
            self.position.leave(self.index, self.count);
        }
        outcome
    }

    fn is_connected(&self) -> bool {
        let connected = self.inner.is_connected();
        if !connected {
            self.position.leave(self.index, self.count);
        }
        connected
    }

    fn is_blocked(&self) -> bool {
        self.inner.is_blocked()
    }

    fn opened_at(&self) -> Instant {
        self.inner.opened_at()
    }

    async fn close(self) {
        let NodePublisher {
            inner, _counted, ..
        } = self;
        inner.close().await;
        drop(_counted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::Refusal;

    fn nodes(count: usize) -> Vec<Node<()>> {
        (0..count)
            .map(|i| Node {
                connector: (),
                label: format!("h{}:5672", i + 1),
            })
            .collect()
    }

    fn down() -> ConnectError {
        ConnectError::Unavailable(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }

    #[test]
    fn one_node_fails_as_without_a_list() {
        let error = round_error(&nodes(1), vec![(0, down())]);
        assert_eq!(error.to_string(), down().to_string());
    }

    #[test]
    fn a_round_names_every_node_and_keeps_a_refusal_kind() {
        let error = round_error(&nodes(3), vec![(1, down()), (2, down()), (0, down())]);
        let text = error.to_string();
        assert!(matches!(error, ConnectError::Unavailable(_)));
        assert!(
            text.starts_with("none of the 3 broker nodes took the connection: node 2/3 h2:5672: "),
            "{text}"
        );
        assert!(text.contains("; node 1/3 h1:5672: "), "{text}");
        let refused = ConnectError::Refused {
            kind: Refusal::Auth,
            message: "login refused".into(),
        };
        let error = round_error(&nodes(2), vec![(0, down()), (1, refused)]);
        assert!(
            matches!(error, ConnectError::Refused { kind: Refusal::Auth, ref message } if message.contains("node 2/2 h2:5672: login refused")),
            "{error}"
        );
    }

    #[test]
    fn leaving_moves_past_the_node_once() {
        let position = Position {
            current: AtomicUsize::new(2),
            announced: AtomicUsize::new(NONE),
        };
        position.leave(2, 3);
        assert_eq!(position.current.load(Ordering::Relaxed), 0);
        // Another worker on the same lost node: the position moved already.
        position.leave(2, 3);
        assert_eq!(position.current.load(Ordering::Relaxed), 0);
    }
}
