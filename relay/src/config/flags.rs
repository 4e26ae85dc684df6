//! The flags (and their environment variables) of the commands that touch the outbox table.
//! Values that parse on their own are typed here, so clap refuses a bad one naming its flag;
//! names and URLs stay text until [`super`] resolves them, since their checks need the other
//! layers (a URL must never be echoed back: it carries a password).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::parse::{LogFormat, one_of, positive_duration};
use crate::broker::BrokerProtocol;
use crate::broker::cloudevents::CloudEventsMode;
use crate::broker::routing::ExchangeType;
use crate::database::PoolMode;
use crate::table::outbox::{ColumnRole, DeliveryMode, DeliveryOrder};

/// Options shared by every subcommand that touches the outbox table. Each is also read from
/// the environment and from the `--config` file (same names, with underscores).
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct TableArgs {
    /// YAML configuration file; flags and environment override its values.
    #[arg(long, env = "OUTBOX_RELAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PostgreSQL URL, e.g. postgres://user:password@host:5432/db.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// File holding the database password, read again at every new connection (a mounted
    /// Secret, a Vault agent's file, an RDS IAM or Entra ID token); wins over the URL's password.
    #[arg(long, env = "DATABASE_PASSWORD_FILE", value_name = "FILE")]
    pub database_password_file: Option<PathBuf>,
    /// session or transaction: what --database-url reaches. transaction for a pooler that lends
    /// a server session per transaction (PgBouncer pool_mode = transaction); the relay then
    /// sends unnamed statements inside transactions, and what needs a session goes to
    /// --session-database-url. Default: session (a direct connection or a session pool).
    #[arg(long, env = "DATABASE_POOL_MODE", value_parser = one_of::<PoolMode>)]
    pub database_pool_mode: Option<PoolMode>,
    /// PostgreSQL URL with a session of its own (direct, or a session pool), for what needs one
    /// under --database-pool-mode transaction: per-key ordering, LISTEN, migrate, lag and seed.
    /// Uses --database-password-file too when given.
    #[arg(long, env = "SESSION_DATABASE_URL", hide_env_values = true)]
    pub session_database_url: Option<String>,
    /// How long the server lets a relay session sit idle inside a transaction before it ends
    /// the session, and the rows it claimed return to pending, e.g. 30s: a relay that stalls
    /// with claims holds them no longer. Longer than --publish-timeout (a batch awaits its
    /// confirms inside its transaction; unset, it stays 20s above a longer one). Not sent
    /// under --database-pool-mode transaction. Default: 30s.
    #[arg(long, env = "OUTBOX_RELAY_IDLE_IN_TRANSACTION_TIMEOUT", value_parser = positive_duration)]
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Within this the server ends the session of a relay whose connection went silent (a
    /// network partition, a node gone), so another relay takes its rows, e.g. 15s: server-side
    /// TCP keepalives and tcp_user_timeout, set per session (at least 4s; not sent under
    /// --database-pool-mode transaction). The relay's own connections to the database and the
    /// broker get the same keepalives. Default: 15s.
    #[arg(long, env = "OUTBOX_RELAY_DEAD_CLIENT_TIMEOUT", value_parser = positive_duration)]
    pub dead_client_timeout: Option<Duration>,
    /// Outbox table, optionally schema-qualified (schema.table). Default: outbox_messages.
    #[arg(long, env = "OUTBOX_RELAY_TABLE")]
    pub table: Option<String>,
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// mark (set processed-at) or delete (remove the row) after the broker confirmed it.
    /// Default: mark.
    #[arg(long, env = "OUTBOX_RELAY_MODE", value_parser = one_of::<DeliveryMode>)]
    pub mode: Option<DeliveryMode>,
    /// unordered, or per-key: the rows of one --partition-key-column value reach the broker
    /// in claim order, one at a time, while different keys flow in parallel. Default: unordered.
    #[arg(long, env = "OUTBOX_RELAY_ORDERING", value_parser = one_of::<DeliveryOrder>)]
    pub ordering: Option<DeliveryOrder>,
    /// Name of this relay; keys its reports and its advisory locks. Default: the table name.
    #[arg(long, env = "OUTBOX_RELAY_NAME")]
    pub relay_name: Option<String>,
}

/// The column mapping. The same struct is the `columns:` map of the YAML file, whose keys are
/// the roles (`id`, `type`, `payload`, ...).
#[derive(Debug, Clone, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnArgs {
    /// Column holding the message id (uuid). Default: id.
    #[arg(id = "id_column", long = "id-column", env = "OUTBOX_RELAY_ID_COLUMN")]
    pub id: Option<String>,
    /// Column holding the message type. Default: type.
    #[arg(
        id = "type_column",
        long = "type-column",
        env = "OUTBOX_RELAY_TYPE_COLUMN"
    )]
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Column holding the payload (jsonb, json, text or bytea). Default: content.
    #[arg(
        id = "payload_column",
        long = "payload-column",
        env = "OUTBOX_RELAY_PAYLOAD_COLUMN"
    )]
    pub payload: Option<String>,
    /// Column giving the claim order. Default: occurred_on_utc.
    #[arg(
        id = "occurred_at_column",
        long = "occurred-at-column",
        env = "OUTBOX_RELAY_OCCURRED_AT_COLUMN"
    )]
    pub occurred_at: Option<String>,
    /// Column set when a row is processed; NULL means pending. Default: processed_on_utc.
    #[arg(
        id = "processed_at_column",
        long = "processed-at-column",
        env = "OUTBOX_RELAY_PROCESSED_AT_COLUMN"
    )]
    pub processed_at: Option<String>,
    /// Column receiving the last failure text. Default: error.
    #[arg(
        id = "error_column",
        long = "error-column",
        env = "OUTBOX_RELAY_ERROR_COLUMN"
    )]
    pub error: Option<String>,
    /// Optional column holding a per-row routing key.
    #[arg(
        id = "routing_key_column",
        long = "routing-key-column",
        env = "OUTBOX_RELAY_ROUTING_KEY_COLUMN"
    )]
    pub routing_key: Option<String>,
    /// Optional jsonb column holding AMQP headers (a JSON object).
    #[arg(
        id = "headers_column",
        long = "headers-column",
        env = "OUTBOX_RELAY_HEADERS_COLUMN"
    )]
    pub headers: Option<String>,
    /// Optional integer column counting broker rejections; without it a rejected message is
    /// dead-lettered at its first rejection.
    #[arg(
        id = "attempts_column",
        long = "attempts-column",
        env = "OUTBOX_RELAY_ATTEMPTS_COLUMN"
    )]
    pub attempts: Option<String>,
    /// Optional column holding the partition key (e.g. the aggregate id) that --ordering
    /// per-key keeps in order; cast to text.
    #[arg(
        id = "partition_key_column",
        long = "partition-key-column",
        env = "OUTBOX_RELAY_PARTITION_KEY_COLUMN"
    )]
    pub partition_key: Option<String>,
    /// Optional text column holding the W3C traceparent the producing service wrote in its
    /// transaction; sent on as the traceparent header. A malformed one is left out and counted.
    #[arg(
        id = "traceparent_column",
        long = "traceparent-column",
        env = "OUTBOX_RELAY_TRACEPARENT_COLUMN"
    )]
    pub traceparent: Option<String>,
    /// Optional text column holding the W3C tracestate that goes with --traceparent-column.
    #[arg(
        id = "tracestate_column",
        long = "tracestate-column",
        env = "OUTBOX_RELAY_TRACESTATE_COLUMN"
    )]
    pub tracestate: Option<String>,
}

impl ColumnArgs {
    /// The name given for `role`, if any.
    pub fn get(&self, role: ColumnRole) -> Option<&String> {
        match role {
            ColumnRole::Id => self.id.as_ref(),
            ColumnRole::Type => self.kind.as_ref(),
            ColumnRole::Payload => self.payload.as_ref(),
            ColumnRole::OccurredAt => self.occurred_at.as_ref(),
            ColumnRole::ProcessedAt => self.processed_at.as_ref(),
            ColumnRole::Error => self.error.as_ref(),
            ColumnRole::RoutingKey => self.routing_key.as_ref(),
            ColumnRole::Headers => self.headers.as_ref(),
            ColumnRole::Attempts => self.attempts.as_ref(),
            ColumnRole::PartitionKey => self.partition_key.as_ref(),
            ColumnRole::Traceparent => self.traceparent.as_ref(),
            ColumnRole::Tracestate => self.tracestate.as_ref(),
        }
    }
}

/// Options of `outbox-relay run`. The defaults are in [`crate::defaults`]; they apply after
/// the file, so they are not clap defaults.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// amqp091 (RabbitMQ's AMQP 0-9-1) or amqp10 (AMQP 1.0: Azure Service Bus, ActiveMQ
    /// Artemis, RabbitMQ's AMQP 1.0). Default: amqp091.
    #[arg(
        long,
        env = "OUTBOX_RELAY_BROKER_PROTOCOL",
        value_parser = one_of::<BrokerProtocol>
    )]
    pub broker_protocol: Option<BrokerProtocol>,
    /// Broker URL, e.g. amqp://user:password@host:5672/%2f (amqp091) or
    /// amqp://user:password@host:5672 (amqp10; the user and password go through SASL PLAIN).
    /// Several nodes (a cluster, a live/backup pair): a comma-separated list of full URLs; the
    /// relay connects to one and moves to the next when it is lost or refuses.
    #[arg(long, env = "BROKER_URL", hide_env_values = true)]
    pub broker_url: Option<String>,
    /// The AMQP 0-9-1 spelling of --broker-url.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,
    /// File holding the broker password, read again at every connect; wins over the URL's.
    #[arg(long, env = "BROKER_PASSWORD_FILE", value_name = "FILE")]
    pub broker_password_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for amqps:// besides the system's store (a private or
    /// cert-manager CA).
    #[arg(long, env = "BROKER_CA_FILE", value_name = "FILE")]
    pub broker_ca_file: Option<PathBuf>,
    /// PEM client certificate for amqps:// (RabbitMQ certificate login: add
    /// ?auth_mechanism=external to the URL). Needs --broker-client-key.
    #[arg(long, env = "BROKER_CLIENT_CERT", value_name = "FILE")]
    pub broker_client_cert: Option<PathBuf>,
    /// PEM (PKCS#8) private key of --broker-client-cert.
    #[arg(long, env = "BROKER_CLIENT_KEY", value_name = "FILE")]
    pub broker_client_key: Option<PathBuf>,
    /// AMQP 1.0 target address: a queue or topic (Service Bus: the entity path; RabbitMQ 4:
    /// /queues/NAME or /exchanges/NAME/KEY; RabbitMQ 3.x: /amq/queue/NAME). Required with
    /// --broker-protocol amqp10.
    #[arg(long, env = "OUTBOX_RELAY_ADDRESS")]
    pub address: Option<String>,
    /// Exchange to publish to ("" is the default exchange). Default: outbox.
    #[arg(long, env = "OUTBOX_RELAY_EXCHANGE")]
    pub exchange: Option<String>,
    /// Declare the exchange (durable) with this type at connect: fanout, topic, direct or
    /// headers. Without it the exchange must already exist (checked at connect).
    #[arg(
        long,
        env = "OUTBOX_RELAY_DECLARE_EXCHANGE",
        value_parser = one_of::<ExchangeType>
    )]
    pub declare_exchange: Option<ExchangeType>,
    /// Static routing key for every message. Default: the row's type, or the routing-key column.
    #[arg(long, env = "OUTBOX_RELAY_ROUTING_KEY")]
    pub routing_key: Option<String>,
    /// Rows claimed, published and marked per transaction (1..=10000). Default: 500.
    #[arg(long, env = "OUTBOX_RELAY_BATCH_SIZE", allow_hyphen_values = true)]
    pub batch_size: Option<i64>,
    /// Concurrent claimers in this process, each with its own connections (1..=256). Default: 2.
    #[arg(long, env = "OUTBOX_RELAY_WORKERS", allow_hyphen_values = true)]
    pub workers: Option<i64>,
    /// Batches of this process at the broker at once (0 = one per worker). Other workers claim
    /// meanwhile and publish as soon as a slot frees. Default: 1.
    #[arg(
        long,
        env = "OUTBOX_RELAY_INFLIGHT_BATCHES",
        allow_hyphen_values = true
    )]
    pub inflight_batches: Option<i64>,
    /// Most messages per second this process publishes, over all its workers (1..=1000000;
    /// fractions allowed). Workers wait for their permits before they claim, never with rows
    /// locked; a batch takes at most one second of the limit. Under the operator, the pod's
    /// share of spec.relay.maxRate applies too, and the smaller wins. Default: no limit.
    #[arg(
        long,
        env = "OUTBOX_RELAY_MAX_RATE",
        allow_hyphen_values = true,
        value_name = "MESSAGES_PER_SECOND"
    )]
    pub max_rate: Option<f64>,
    /// Wait for broker confirms before marking rows. Turning this off can lose messages.
    #[arg(long, env = "OUTBOX_RELAY_PUBLISHER_CONFIRMS")]
    pub publisher_confirms: Option<bool>,
    /// Publish with the mandatory flag, so unroutable messages come back as failures.
    #[arg(long, env = "OUTBOX_RELAY_MANDATORY")]
    pub mandatory: Option<bool>,
    /// Longest wait for the confirms of one batch, e.g. 10s. Default: 10s.
    #[arg(long, env = "OUTBOX_RELAY_PUBLISH_TIMEOUT", value_parser = positive_duration)]
    pub publish_timeout: Option<Duration>,
    /// The AMQP 0-9-1 heartbeat the relay asks the broker for, e.g. 10s (whole seconds; the
    /// lower of this and the broker's wins); a broker that misses two is taken as gone, and its
    /// batch in flight is given back. An AMQP URL's own ?heartbeat= wins. Default: 10s.
    #[arg(long, env = "OUTBOX_RELAY_BROKER_HEARTBEAT", value_parser = positive_duration)]
    pub broker_heartbeat: Option<Duration>,
    /// Longest wait for the COMMIT of one batch, e.g. 10s; after it the connection is dropped
    /// and the batch counts as not settled (a primary whose synchronous standby is gone never
    /// answers). Default: 10s.
    #[arg(long, env = "OUTBOX_RELAY_COMMIT_TIMEOUT", value_parser = positive_duration)]
    pub commit_timeout: Option<Duration>,
    /// Broker rejections before a message is dead-lettered (1..=1000). Default: 5.
    #[arg(long, env = "OUTBOX_RELAY_MAX_ATTEMPTS", allow_hyphen_values = true)]
    pub max_attempts: Option<i64>,
    /// Exchange that receives dead-lettered messages (optional).
    #[arg(long, env = "OUTBOX_RELAY_DEAD_LETTER_EXCHANGE")]
    pub dead_letter_exchange: Option<String>,
    /// Pause between claims when the table is empty, e.g. 200ms. Default: 200ms.
    #[arg(long, env = "OUTBOX_RELAY_POLL_INTERVAL", value_parser = positive_duration)]
    pub poll_interval: Option<Duration>,
    /// Wake idle workers with LISTEN on the channel the `migrate --notify` trigger signals.
    #[arg(long, env = "OUTBOX_RELAY_LISTEN")]
    pub listen: Option<bool>,
    /// Address of the /metrics, /healthz and /readyz server. When the default port is taken
    /// the relay takes a free one and logs it; a given address that is taken is an error. In a
    /// pod the operator passes 0.0.0.0:9090. Default: 127.0.0.1:9090.
    #[arg(long, env = "OUTBOX_RELAY_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// text or json. Default: text.
    #[arg(long, env = "OUTBOX_RELAY_LOG_FORMAT", value_parser = one_of::<LogFormat>)]
    pub log_format: Option<LogFormat>,
    /// How long SIGTERM waits for the batches in flight, e.g. 25s. Default: 25s.
    #[arg(long, env = "OUTBOX_RELAY_SHUTDOWN_GRACE", value_parser = positive_duration)]
    pub shutdown_grace: Option<Duration>,
    /// How often this process writes its lag report, e.g. 5s. Default: 5s.
    #[arg(long, env = "OUTBOX_RELAY_REPORT_INTERVAL", value_parser = positive_duration)]
    pub report_interval: Option<Duration>,
    /// AMQP content_type. Default: from the payload column type (application/json for json).
    #[arg(long, env = "OUTBOX_RELAY_CONTENT_TYPE")]
    pub content_type: Option<String>,
    /// off, or binary: each message is a CloudEvent in binary content mode (the payload
    /// untouched; id, type, source, time and subject as ce- headers under amqp091, as
    /// cloudEvents: application properties under amqp10). Needs --cloudevents-source.
    /// Default: off.
    #[arg(long, env = "OUTBOX_RELAY_CLOUDEVENTS", value_parser = one_of::<CloudEventsMode>)]
    pub cloudevents: Option<CloudEventsMode>,
    /// The CloudEvents source attribute of every message: a URI-reference naming the producer,
    /// e.g. /orders, urn:example:orders or https://example.com/orders. Required with
    /// --cloudevents binary.
    #[arg(
        long,
        env = "OUTBOX_RELAY_CLOUDEVENTS_SOURCE",
        value_name = "URI-REFERENCE"
    )]
    pub cloudevents_source: Option<String>,
    /// Delete processed rows older than this, e.g. 168h (mark mode). Default: keep them.
    #[arg(long, env = "OUTBOX_RELAY_PROCESSED_RETENTION", value_parser = positive_duration)]
    pub processed_retention: Option<Duration>,
    /// Name of this process in lag reports. Default: $POD_NAME, then the host name.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}
