//! Every default value and limit of the relay's options, in one place: the CLI, the YAML file,
//! the table layout and the protocol read them from here, so a default is changed once. (The
//! enums' defaults are their `#[default]` variants: `DeliveryMode::Mark`, `LogFormat::Text`.)
//!
//! This module imports nothing from the crate, so every other module may use it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

/// The reference article's table.
pub const TABLE: &str = "outbox_messages";

/// Column names of the reference article's table.
pub mod columns {
    pub const ID: &str = "id";
    pub const TYPE: &str = "type";
    pub const PAYLOAD: &str = "content";
    pub const OCCURRED_AT: &str = "occurred_on_utc";
    pub const PROCESSED_AT: &str = "processed_on_utc";
    pub const ERROR: &str = "error";
}

/// The relay name (reports, advisory locks) is the table's name unless given; it is at most
/// this many printable characters.
pub const RELAY_NAME_MAX: usize = 200;

/// AMQP short strings (type, message_id, routing key, exchange, content type, header names)
/// are limited to 255 bytes.
pub const AMQP_SHORT_STRING_MAX: usize = 255;

pub const EXCHANGE: &str = "outbox";

pub const BATCH_SIZE: i64 = 500;
pub const BATCH_SIZE_RANGE: RangeInclusive<i64> = 1..=10_000;

/// How long one host of the database URL may take to accept a connection (TLS and login
/// included) before the next is tried; the URL's `connect_timeout` overrides it. libpq waits
/// without limit, which leaves a relay hanging on a host whose packets are dropped.
pub const DATABASE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a COMMIT may take before its connection is dropped and the batch counted as not
/// settled: a primary whose synchronous standby is gone waits for it without limit, and
/// `statement_timeout` does not bound that wait.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `idle_in_transaction_session_timeout` of every relay session (see
/// `database::session_bounds`): above the longest legitimate wait inside a batch's transaction
/// (its confirms, [`PUBLISH_TIMEOUT`]), so the server takes the rows back from a relay that
/// stalls with them, and only from such a relay.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The idle-in-transaction bound when none is given: [`IDLE_IN_TRANSACTION_TIMEOUT`], or 20 s
/// above a longer publish timeout, so a batch awaiting its confirms is never ended for it.
pub fn idle_in_transaction_timeout(publish_timeout: Duration) -> Duration {
    IDLE_IN_TRANSACTION_TIMEOUT.max(publish_timeout + Duration::from_secs(20))
}

/// Within this the server ends the session of a relay that vanished behind a silent partition
/// (server-side TCP keepalives and `tcp_user_timeout`), so its claimed rows go back to pending;
/// without it the server waits for its kernel's keepalive, about two hours.
pub const DEAD_CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// A first keepalive probe and three more, a second apart.
pub const DEAD_CLIENT_TIMEOUT_MIN: Duration = Duration::from_secs(4);

/// The AMQP heartbeat the relay asks for (the lower of its and the broker's wins): a dead broker
/// connection is noticed after two missed heartbeats. RabbitMQ proposes 60 s and advises 5 to
/// 20 s.
pub const BROKER_HEARTBEAT: Duration = Duration::from_secs(10);

pub const WORKERS: i64 = 2;
pub const WORKERS_RANGE: RangeInclusive<i64> = 1..=256;

/// One batch at the broker at a time: a queue confirms one batch at a time fastest.
pub const INFLIGHT_BATCHES: i64 = 1;
/// 0 means one per worker.
pub const INFLIGHT_BATCHES_RANGE: RangeInclusive<i64> = 0..=256;

pub const MAX_ATTEMPTS: i64 = 5;
pub const MAX_ATTEMPTS_RANGE: RangeInclusive<i64> = 1..=1000;

/// `--max-rate` (messages per second, per process): at least one message per second (the
/// operator's per-pod share never goes below it either), at most a million, far above what one
/// process relays, where the limiter's period (1 µs) is still a whole number of nanoseconds.
pub const MAX_RATE_RANGE: RangeInclusive<f64> = 1.0..=1_000_000.0;

pub const PUBLISHER_CONFIRMS: bool = true;
pub const MANDATORY: bool = false;
pub const LISTEN: bool = true;

pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A little under Kubernetes' default termination grace period of 30 s.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(25);
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);

pub const METRICS_PORT: u16 = 9090;
/// Loopback: a relay run by hand does not expose its metrics on every interface. A pod
/// listens on all of them because the operator's Deployment passes `0.0.0.0:9090` explicitly.
/// When this default port is taken (a second relay on the host, the scaling model), the relay
/// takes a free port instead and logs it; an explicit address that is taken is an error.
pub const METRICS_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);

/// Counting the backlog stops here; a report at the cap says "at least this many".
pub const BACKLOG_CAP: i64 = 1_000_000;

/// `migrate --wait`: how long to retry while another migration holds the lock.
pub const MIGRATE_WAIT: Duration = Duration::from_secs(5 * 60);

/// `consume --idle-timeout`.
pub const CONSUME_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
