//! Relay configuration: flags override environment, environment overrides the YAML file,
//! and the file overrides the built-in defaults ([`crate::defaults`]). Every value is validated
//! here, once, with an error that names the option and says what to do.

pub mod argv;
pub mod file;
pub mod flags;
pub mod parse;

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

pub use file::FileConfig;
pub use flags::{ColumnArgs, RunArgs, TableArgs};
pub use parse::{ConfigError, LogFormat, one_of, positive_duration};

use crate::broker::BrokerProtocol;
use crate::broker::cloudevents::{self, CloudEvents, CloudEventsMode};
use crate::broker::routing::{ExchangeType, RoutingKey};
use crate::broker::tls::BrokerTls;
use crate::broker::urls::BrokerUrls;
use crate::connect::secret_url::{SecretUrl, UrlKind};
use crate::database::{DatabaseTarget, PoolMode, SessionBounds};
use crate::defaults::{self, AMQP_SHORT_STRING_MAX};
use crate::table::ident::{Ident, TableName};
use crate::table::outbox::{ColumnRole, Columns, DeliveryOrder, OutboxTable};

/// Everything that describes the table and the database, resolved and validated.
#[derive(Debug, Clone)]
pub struct TableConfig {
    pub database: DatabaseTarget,
    /// What `database` reaches: a session of its own, or a transaction pool.
    pub pool_mode: PoolMode,
    /// `--session-database-url`: a session of its own under a transaction pool; None otherwise.
    pub session_database: Option<DatabaseTarget>,
    /// What every session of the relay's own tells the server (the targets carry it, but for
    /// a transaction pool's).
    pub session_bounds: SessionBounds,
    pub table: OutboxTable,
    pub relay_name: String,
}

impl TableConfig {
    /// Refuses URLs whose `target_session_attrs` chooses sessions that cannot write, for the
    /// commands that write (all but `lag`, which may measure on a standby).
    pub fn require_writes(&self) -> Result<(), ConfigError> {
        let targets = [
            ("database-url", Some(&self.database)),
            ("session-database-url", self.session_database.as_ref()),
        ];
        for (field, target) in targets {
            if let Some(target) = target {
                crate::database::require_writes(target).map_err(|e| ConfigError::new(field, e))?;
            }
        }
        Ok(())
    }

    /// The same configuration with another idle-in-transaction bound on every target that
    /// carries bounds.
    fn with_idle_in_transaction(mut self, idle: Duration) -> Self {
        self.session_bounds.idle_in_transaction = idle;
        let bounds = self.session_bounds;
        self.database = rebound(self.database, bounds);
        self.session_database = self.session_database.map(|s| rebound(s, bounds));
        self
    }

    /// Where to open a connection that `need` (what it is for, e.g. "per-key ordering") holds
    /// as one server session: `--database-url` when it is one, else `--session-database-url`;
    /// an error naming both settings when a transaction pool is all there is.
    pub fn session_database(&self, need: &str) -> Result<&DatabaseTarget, ConfigError> {
        match (self.pool_mode, &self.session_database) {
            (PoolMode::Session, _) => Ok(&self.database),
            (PoolMode::Transaction, Some(session)) => Ok(session),
            (PoolMode::Transaction, None) => Err(ConfigError::new(
                "session-database-url",
                format!(
                    "is missing: {need} needs a server session of its own, and \
                     --database-pool-mode transaction says --database-url lends one per \
                     transaction only; pass --session-database-url (SESSION_DATABASE_URL) with a \
                     direct or session-pooled URL, or connect --database-url directly (or \
                     through a session pool) with --database-pool-mode session"
                ),
            )),
        }
    }
}

/// `target` with `bounds` in place of its own, unless it carries none (a transaction pool).
fn rebound(target: DatabaseTarget, bounds: SessionBounds) -> DatabaseTarget {
    let carries = target.session_bounds().is_some();
    target.with_session_bounds(carries.then_some(bounds))
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub db: TableConfig,
    pub broker_protocol: BrokerProtocol,
    /// One broker URL, or several nodes of one broker (a cluster, a live/backup pair).
    pub broker_urls: BrokerUrls,
    pub broker_tls: BrokerTls,
    pub broker_password_file: Option<std::path::PathBuf>,
    /// The AMQP 1.0 target address; `None` under AMQP 0-9-1.
    pub address: Option<String>,
    pub exchange: String,
    pub declare_exchange: Option<ExchangeType>,
    pub routing_key: RoutingKey,
    pub batch_size: usize,
    pub workers: usize,
    /// Batches at the broker at once; 0 means no limit (one per worker).
    pub inflight_batches: usize,
    /// `--max-rate`: messages per second over the process's workers; None: no limit.
    pub max_rate: Option<f64>,
    pub publisher_confirms: bool,
    pub mandatory: bool,
    pub publish_timeout: Duration,
    pub commit_timeout: Duration,
    /// The AMQP 0-9-1 heartbeat asked for (see `--broker-heartbeat`).
    pub broker_heartbeat: Duration,
    pub max_attempts: i32,
    pub dead_letter_exchange: Option<String>,
    pub poll_interval: Duration,
    pub listen: bool,
    pub metrics_addr: SocketAddr,
    /// True when `metrics_addr` is the default rather than the user's choice: only then may
    /// the relay move to a free port when it is taken.
    pub metrics_addr_is_default: bool,
    pub log_format: LogFormat,
    pub shutdown_grace: Duration,
    pub report_interval: Duration,
    pub content_type: Option<String>,
    /// CloudEvents binary content mode with its source; None when off.
    pub cloudevents: Option<CloudEvents>,
    pub processed_retention: Option<Duration>,
    pub pod_name: String,
}

/// A duration flag, else the file's text parsed the same way, naming `field` when it is bad.
fn duration(
    field: &str,
    flag: Option<Duration>,
    file: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    match (flag, file) {
        (Some(duration), _) => Ok(Some(duration)),
        (None, Some(text)) => positive_duration(text)
            .map(Some)
            .map_err(|message| ConfigError::new(field, message)),
        (None, None) => Ok(None),
    }
}

/// The flag's value, else the file's: the layering of every option.
fn layer<T: Clone>(flag: &Option<T>, file: &Option<T>) -> Option<T> {
    flag.clone().or_else(|| file.clone())
}

fn ranged(
    field: &str,
    value: Option<i64>,
    default: i64,
    range: RangeInclusive<i64>,
) -> Result<i64, ConfigError> {
    let value = value.unwrap_or(default);
    if !range.contains(&value) {
        return Err(ConfigError::new(
            field,
            format!(
                "must be between {} and {}, got {value}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(value)
}

/// `--max-rate`: a number of messages per second within [`defaults::MAX_RATE_RANGE`]. Zero, a
/// negative number, NaN or infinity is refused rather than read as "no limit": leaving the
/// option out is how to say that.
fn max_rate(value: Option<f64>) -> Result<Option<f64>, ConfigError> {
    let Some(rate) = value else {
        return Ok(None);
    };
    let range = defaults::MAX_RATE_RANGE;
    if !range.contains(&rate) {
        return Err(ConfigError::new(
            "max-rate",
            format!(
                "must be between {} and {} messages per second, got {rate}; leave it out for no \
                 limit",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(Some(rate))
}

fn short_string(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.len() > AMQP_SHORT_STRING_MAX {
        return Err(ConfigError::new(
            field,
            format!(
                "is {} bytes; AMQP allows at most {AMQP_SHORT_STRING_MAX}",
                value.len()
            ),
        ));
    }
    Ok(())
}

fn url(
    field: &str,
    text: Option<String>,
    env: &str,
    kind: UrlKind,
) -> Result<SecretUrl, ConfigError> {
    let text = text.ok_or_else(|| {
        ConfigError::new(field, format!("is missing; pass --{field} or set {env}"))
    })?;
    SecretUrl::parse(&text, kind).map_err(|e| ConfigError::new(field, e.to_string()))
}

/// `--broker-url`, else its AMQP 0-9-1 spelling `--amqp-url`: the newer name wins, so a
/// machine-wide `AMQP_URL` does not stand in the way of one relay's `--broker-url`. Either holds
/// one URL or a comma-separated list of full URLs ([`BrokerUrls`]). An error names the option
/// the URL came from, and the element of a list by its position.
fn broker_urls(args: &RunArgs, file: &FileConfig) -> Result<BrokerUrls, ConfigError> {
    let broker = layer(&args.broker_url, &file.broker_url);
    let amqp = layer(&args.amqp_url, &file.amqp_url);
    let (field, text) = match (broker, amqp) {
        (Some(broker), _) => ("broker-url", broker),
        (None, Some(amqp)) => ("amqp-url", amqp),
        (None, None) => {
            return Err(ConfigError::new(
                "broker-url",
                "is missing; pass --broker-url (or --amqp-url) or set BROKER_URL (or AMQP_URL)",
            ));
        }
    };
    BrokerUrls::parse(&text).map_err(|e| ConfigError::new(field, e.to_string()))
}

/// Under AMQP 0-9-1 there is no address: the exchange says where messages go.
fn amqp091_only(address: bool) -> Result<(), ConfigError> {
    if address {
        return Err(ConfigError::new(
            "address",
            "is an AMQP 1.0 option; pass --broker-protocol amqp10, or use --exchange with amqp091",
        ));
    }
    Ok(())
}

/// Under AMQP 1.0 messages go to one address; the options of RabbitMQ's exchanges have no
/// meaning there, and one given anyway is refused rather than ignored.
fn amqp10_only(
    args: &RunArgs,
    file: &FileConfig,
    address: Option<&str>,
) -> Result<(), ConfigError> {
    let address = address.ok_or_else(|| {
        ConfigError::new(
            "address",
            "is missing; --broker-protocol amqp10 sends to an address (a queue or topic, e.g. \
             orders or /amq/queue/orders on RabbitMQ): pass --address or set OUTBOX_RELAY_ADDRESS",
        )
    })?;
    if address.trim().is_empty() {
        return Err(ConfigError::new("address", "must not be empty"));
    }
    let given_091 = [
        (
            "exchange",
            layer(&args.exchange, &file.exchange).is_some(),
            "--address says where messages go",
        ),
        (
            "declare-exchange",
            layer(&args.declare_exchange, &file.declare_exchange).is_some(),
            "create the queue or topic on the broker",
        ),
        (
            "routing-key",
            layer(&args.routing_key, &file.routing_key).is_some(),
            "the row's type goes in the subject property",
        ),
        (
            "routing-key-column",
            args.table.columns.routing_key.is_some()
                || file
                    .columns
                    .as_ref()
                    .is_some_and(|c| c.routing_key.is_some()),
            "the row's type goes in the subject property",
        ),
        (
            "mandatory",
            layer(&args.mandatory, &file.mandatory).is_some(),
            "an AMQP 1.0 broker refuses an unknown address when the link attaches",
        ),
        (
            "dead-letter-exchange",
            layer(&args.dead_letter_exchange, &file.dead_letter_exchange).is_some(),
            "rows given up on keep their error in the error column",
        ),
        (
            "publisher-confirms",
            layer(&args.publisher_confirms, &file.publisher_confirms) == Some(false),
            "amqp10 always waits for the broker's outcome",
        ),
    ];
    if let Some((field, _, instead)) = given_091.iter().find(|(_, given, _)| *given) {
        return Err(ConfigError::new(
            *field,
            format!(
                "is an AMQP 0-9-1 option with no meaning under --broker-protocol amqp10 ({instead}); remove it"
            ),
        ));
    }
    Ok(())
}

/// The CloudEvents settings: binary mode needs a source that is a URI-reference (CloudEvents
/// requires the attribute); a source without the mode would be silently unused, so it is
/// refused.
fn cloudevents_settings(
    mode: CloudEventsMode,
    source: Option<String>,
) -> Result<Option<CloudEvents>, ConfigError> {
    match (mode, source) {
        (CloudEventsMode::Off, None) => Ok(None),
        (CloudEventsMode::Off, Some(_)) => Err(ConfigError::new(
            "cloudevents-source",
            "only has a meaning with --cloudevents binary; add it, or remove the source",
        )),
        (CloudEventsMode::Binary, None) => Err(ConfigError::new(
            "cloudevents-source",
            "is missing: --cloudevents binary needs the source attribute of every event, a \
             URI-reference naming the producer (e.g. /orders or urn:example:orders); pass \
             --cloudevents-source or set OUTBOX_RELAY_CLOUDEVENTS_SOURCE",
        )),
        (CloudEventsMode::Binary, Some(source)) => {
            cloudevents::check_source(&source)
                .map_err(|e| ConfigError::new("cloudevents-source", e))?;
            Ok(Some(CloudEvents { source }))
        }
    }
}

// Resolution is free functions, not methods of the argument structs: a method counts as part of
// its type's module, and flags would then import the file, which imports flags' column mapping.

fn load_file(args: &TableArgs) -> Result<FileConfig, ConfigError> {
    match &args.config {
        Some(path) => FileConfig::load(path),
        None => Ok(FileConfig::default()),
    }
}

/// Resolves the table options (for migrate, lag, seed and run).
pub fn resolve_table(args: &TableArgs) -> Result<TableConfig, ConfigError> {
    let file = load_file(args)?;
    resolve_table_with(args, &file)
}

fn resolve_table_with(args: &TableArgs, file: &FileConfig) -> Result<TableConfig, ConfigError> {
    let database_url = url(
        "database-url",
        layer(&args.database_url, &file.database_url),
        "DATABASE_URL",
        UrlKind::Postgres,
    )?;

    let table_text = layer(&args.table, &file.table).unwrap_or_else(|| defaults::TABLE.into());
    let name = TableName::parse(&table_text)
        .map_err(|e| ConfigError::new("table", format!("table name {e}")))?;

    let columns = Columns::from_roles(|role: ColumnRole| {
        let from_file = file.columns.as_ref().and_then(|c| c.get(role));
        match args.columns.get(role).or(from_file) {
            None => Ok(None),
            Some(text) => Ident::new(text)
                .map(Some)
                .map_err(|e| ConfigError::new(role.option(), format!("column name {e}"))),
        }
    })?;

    let relay_name = layer(&args.relay_name, &file.relay_name).unwrap_or_else(|| name.to_string());
    if relay_name.is_empty()
        || relay_name.len() > defaults::RELAY_NAME_MAX
        || relay_name.chars().any(char::is_control)
    {
        return Err(ConfigError::new(
            "relay-name",
            format!(
                "must be 1 to {} printable characters",
                defaults::RELAY_NAME_MAX
            ),
        ));
    }

    let ordering = layer(&args.ordering, &file.ordering).unwrap_or_default();
    match (ordering, &columns.partition_key) {
        (DeliveryOrder::PerKey, None) => {
            return Err(ConfigError::new(
                "ordering",
                "per-key orders the rows of each partition key: name the key's column with \
                 --partition-key-column (e.g. the aggregate id), or use --ordering unordered",
            ));
        }
        (DeliveryOrder::Unordered, Some(_)) => {
            return Err(ConfigError::new(
                "partition-key-column",
                "only has a meaning with --ordering per-key; add it, or remove the column",
            ));
        }
        _ => {}
    }

    if columns.tracestate.is_some() && columns.traceparent.is_none() {
        return Err(ConfigError::new(
            "tracestate-column",
            "goes with a traceparent (W3C: a tracestate without one is discarded): map \
             --traceparent-column too, or remove it",
        ));
    }

    let password_file = layer(&args.database_password_file, &file.database_password_file);
    let pool_mode = layer(&args.database_pool_mode, &file.database_pool_mode).unwrap_or_default();
    let session_url = layer(&args.session_database_url, &file.session_database_url);
    let session_database = match (pool_mode, session_url) {
        (_, None) => None,
        (PoolMode::Session, Some(_)) => {
            return Err(ConfigError::new(
                "session-database-url",
                "only has a meaning with --database-pool-mode transaction (with session, the \
                 default, --database-url is a session already): declare the pool mode, or \
                 remove it",
            ));
        }
        // The same role, so the same password file: a pooler and its server share the login.
        (PoolMode::Transaction, Some(text)) => Some(DatabaseTarget::new(
            url(
                "session-database-url",
                Some(text),
                "SESSION_DATABASE_URL",
                UrlKind::Postgres,
            )?,
            password_file.clone(),
        )),
    };
    let session_bounds = session_bounds(args, file)?;
    let session_database =
        session_database.map(|target| target.with_session_bounds(Some(session_bounds)));
    // A SET under a transaction pool would stay on a server session other clients get next.
    let database = DatabaseTarget::new(database_url, password_file)
        .with_session_bounds((pool_mode == PoolMode::Session).then_some(session_bounds));
    for (field, target) in [
        ("database-url", Some(&database)),
        ("session-database-url", session_database.as_ref()),
    ] {
        if let Some(target) = target {
            crate::database::choice(target).map_err(|e| ConfigError::new(field, e.to_string()))?;
        }
    }
    Ok(TableConfig {
        database,
        pool_mode,
        session_database,
        session_bounds,
        table: OutboxTable {
            name,
            columns,
            mode: layer(&args.mode, &file.mode).unwrap_or_default(),
            ordering,
        },
        relay_name,
    })
}

/// `--idle-in-transaction-timeout` and `--dead-client-timeout`, in whole seconds of at least
/// what the server can act on.
fn session_bounds(args: &TableArgs, file: &FileConfig) -> Result<SessionBounds, ConfigError> {
    let idle_in_transaction = duration(
        "idle-in-transaction-timeout",
        args.idle_in_transaction_timeout,
        &file.idle_in_transaction_timeout,
    )?
    .unwrap_or(defaults::IDLE_IN_TRANSACTION_TIMEOUT);
    let dead_client = duration(
        "dead-client-timeout",
        args.dead_client_timeout,
        &file.dead_client_timeout,
    )?
    .unwrap_or(defaults::DEAD_CLIENT_TIMEOUT);
    if idle_in_transaction < Duration::from_secs(1) {
        return Err(ConfigError::new(
            "idle-in-transaction-timeout",
            "must be at least 1s: the server would end sessions while a batch awaits its \
             confirms",
        ));
    }
    if dead_client < defaults::DEAD_CLIENT_TIMEOUT_MIN {
        return Err(ConfigError::new(
            "dead-client-timeout",
            format!(
                "must be at least {}s: a keepalive probe and three retries take whole seconds",
                defaults::DEAD_CLIENT_TIMEOUT_MIN.as_secs()
            ),
        ));
    }
    Ok(SessionBounds {
        idle_in_transaction,
        dead_client,
    })
}

/// Resolves the options of `run`.
pub fn resolve_run(args: &RunArgs) -> Result<RelayConfig, ConfigError> {
    resolve_run_with(args, &load_file(&args.table)?)
}

fn resolve_run_with(args: &RunArgs, file: &FileConfig) -> Result<RelayConfig, ConfigError> {
    let mut db = resolve_table_with(&args.table, file)?;
    db.require_writes()?;
    let publish_timeout = duration(
        "publish-timeout",
        args.publish_timeout,
        &file.publish_timeout,
    )?
    .unwrap_or(defaults::PUBLISH_TIMEOUT);
    let idle_given = args.table.idle_in_transaction_timeout.is_some()
        || file.idle_in_transaction_timeout.is_some();
    if !idle_given {
        // The default follows a long publish timeout, so raising one never refuses the other.
        let idle = defaults::idle_in_transaction_timeout(publish_timeout);
        db = db.with_idle_in_transaction(idle);
    }
    if db.session_bounds.idle_in_transaction <= publish_timeout {
        return Err(ConfigError::new(
            "idle-in-transaction-timeout",
            format!(
                "({:?}) must be longer than --publish-timeout ({publish_timeout:?}): a batch awaits \
                 its confirms inside its transaction, and the server would end it meanwhile; \
                 raise it, or lower --publish-timeout",
                db.session_bounds.idle_in_transaction
            ),
        ));
    }

    let broker_protocol = layer(&args.broker_protocol, &file.broker_protocol).unwrap_or_default();
    let broker_urls = broker_urls(args, file)?;
    let broker_tls = BrokerTls::new(
        layer(&args.broker_ca_file, &file.broker_ca_file),
        layer(&args.broker_client_cert, &file.broker_client_cert),
        layer(&args.broker_client_key, &file.broker_client_key),
    )
    .map_err(|e| ConfigError::new(e.given.trim_start_matches("--"), e.to_string()))?;
    let address = layer(&args.address, &file.address);
    match broker_protocol {
        BrokerProtocol::Amqp091 => amqp091_only(address.is_some())?,
        BrokerProtocol::Amqp10 => amqp10_only(args, file, address.as_deref())?,
    }
    let exchange =
        layer(&args.exchange, &file.exchange).unwrap_or_else(|| defaults::EXCHANGE.into());
    short_string("exchange", &exchange)?;
    let routing_key = match layer(&args.routing_key, &file.routing_key) {
        Some(key) => {
            short_string("routing-key", &key)?;
            RoutingKey::Static(key)
        }
        None if db.table.columns.routing_key.is_some() => RoutingKey::Column,
        None => RoutingKey::Type,
    };
    let dead_letter_exchange = layer(&args.dead_letter_exchange, &file.dead_letter_exchange);
    if let Some(dlx) = &dead_letter_exchange {
        short_string("dead-letter-exchange", dlx)?;
    }
    let content_type = layer(&args.content_type, &file.content_type);
    if let Some(ct) = &content_type {
        short_string("content-type", ct)?;
    }
    let cloudevents = cloudevents_settings(
        layer(&args.cloudevents, &file.cloudevents).unwrap_or_default(),
        layer(&args.cloudevents_source, &file.cloudevents_source),
    )?;

    let batch_size = ranged(
        "batch-size",
        layer(&args.batch_size, &file.batch_size),
        defaults::BATCH_SIZE,
        defaults::BATCH_SIZE_RANGE,
    )? as usize;
    let workers = ranged(
        "workers",
        layer(&args.workers, &file.workers),
        defaults::WORKERS,
        defaults::WORKERS_RANGE,
    )? as usize;
    let inflight_batches = ranged(
        "inflight-batches",
        layer(&args.inflight_batches, &file.inflight_batches),
        defaults::INFLIGHT_BATCHES,
        defaults::INFLIGHT_BATCHES_RANGE,
    )? as usize;
    let max_rate = max_rate(layer(&args.max_rate, &file.max_rate))?;
    let max_attempts = ranged(
        "max-attempts",
        layer(&args.max_attempts, &file.max_attempts),
        defaults::MAX_ATTEMPTS,
        defaults::MAX_ATTEMPTS_RANGE,
    )? as i32;

    // What needs a session is refused at start, not found out when rows are claimed.
    if db.table.ordering == DeliveryOrder::PerKey {
        db.session_database("per-key ordering (its lanes are session advisory locks)")?;
    }
    // LISTEN is on by default, and only a latency gain: without a session to hold it the
    // default turns it off (the workers poll); asked for explicitly, it is refused.
    let listen = match layer(&args.listen, &file.listen) {
        None if db.session_database("LISTEN").is_err() => false,
        None => defaults::LISTEN,
        Some(listen) => {
            if listen {
                db.session_database("--listen (a LISTEN lasts as long as its session)")?;
            }
            listen
        }
    };

    let pod_name = layer(&args.pod_name, &file.pod_name)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));

    Ok(RelayConfig {
        db,
        broker_protocol,
        broker_urls,
        broker_tls,
        broker_password_file: layer(&args.broker_password_file, &file.broker_password_file),
        address,
        exchange,
        declare_exchange: layer(&args.declare_exchange, &file.declare_exchange),
        routing_key,
        batch_size,
        workers,
        inflight_batches,
        max_rate,
        publisher_confirms: layer(&args.publisher_confirms, &file.publisher_confirms)
            .unwrap_or(defaults::PUBLISHER_CONFIRMS),
        mandatory: layer(&args.mandatory, &file.mandatory).unwrap_or(defaults::MANDATORY),
        publish_timeout,
        commit_timeout: duration("commit-timeout", args.commit_timeout, &file.commit_timeout)?
            .unwrap_or(defaults::COMMIT_TIMEOUT),
        broker_heartbeat: duration(
            "broker-heartbeat",
            args.broker_heartbeat,
            &file.broker_heartbeat,
        )?
        .unwrap_or(defaults::BROKER_HEARTBEAT),
        max_attempts,
        dead_letter_exchange,
        poll_interval: duration("poll-interval", args.poll_interval, &file.poll_interval)?
            .unwrap_or(defaults::POLL_INTERVAL),
        listen,
        metrics_addr: layer(&args.metrics_addr, &file.metrics_addr)
            .unwrap_or(defaults::METRICS_ADDR),
        metrics_addr_is_default: layer(&args.metrics_addr, &file.metrics_addr).is_none(),
        log_format: layer(&args.log_format, &file.log_format).unwrap_or_default(),
        shutdown_grace: duration("shutdown-grace", args.shutdown_grace, &file.shutdown_grace)?
            .unwrap_or(defaults::SHUTDOWN_GRACE),
        report_interval: duration(
            "report-interval",
            args.report_interval,
            &file.report_interval,
        )?
        .unwrap_or(defaults::REPORT_INTERVAL),
        content_type,
        cloudevents,
        processed_retention: duration(
            "processed-retention",
            args.processed_retention,
            &file.processed_retention,
        )?,
        pod_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::tls::ClientCert;

    fn run_args() -> RunArgs {
        RunArgs {
            table: TableArgs {
                database_url: Some("postgres://u:pw@localhost/test".into()),
                ..Default::default()
            },
            amqp_url: Some("amqp://guest:guest@localhost:5672/%2f".into()),
            ..Default::default()
        }
    }

    #[test]
    fn every_session_of_its_own_carries_the_bounds_and_a_transaction_pool_none() {
        let mut args = run_args();
        args.table.idle_in_transaction_timeout = Some(Duration::from_secs(45));
        let config = resolve_run(&args).unwrap();
        let bounds = config.db.database.session_bounds().copied().unwrap();
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(45));
        assert_eq!(bounds.dead_client, defaults::DEAD_CLIENT_TIMEOUT);

        args.table.database_pool_mode = Some(PoolMode::Transaction);
        args.table.session_database_url = Some("postgres://u:pw@localhost:5432/test".into());
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.database.session_bounds(), None);
        let session = config.db.session_database.as_ref().unwrap();
        assert_eq!(session.session_bounds(), Some(&bounds));

        // Unset, the bound follows a long publish timeout instead of refusing it.
        let mut args = run_args();
        args.publish_timeout = Some(Duration::from_secs(60));
        let config = resolve_run(&args).unwrap();
        let bounds = config.db.database.session_bounds().copied().unwrap();
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(80));
        assert_eq!(config.db.session_bounds, bounds);
    }

    #[test]
    fn per_key_ordering_and_its_column_come_together() {
        let mut args = run_args();
        args.table.ordering = Some(DeliveryOrder::PerKey);
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "ordering", "{err}");
        assert!(err.to_string().contains("--partition-key-column"), "{err}");

        args.table.columns.partition_key = Some("aggregate_id".into());
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.table.ordering, DeliveryOrder::PerKey);
        assert_eq!(
            config.db.table.columns.partition_key.map(|c| c.to_string()),
            Some("aggregate_id".into())
        );

        args.table.ordering = None;
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "partition-key-column", "{err}");
        assert!(err.to_string().contains("--ordering per-key"), "{err}");

        let file =
            FileConfig::parse("ordering: per-key\ncolumns:\n  partition_key: order_id\n").unwrap();
        assert_eq!(file.ordering, Some(DeliveryOrder::PerKey));
    }

    #[test]
    fn transaction_pooling_refuses_what_needs_a_session_without_a_session_url() {
        let mut args = run_args();
        args.table.database_pool_mode = Some(PoolMode::Transaction);
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.pool_mode, PoolMode::Transaction);
        assert!(config.db.session_database("x").is_err());

        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let needs_session: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|a| {
                    a.table.ordering = Some(DeliveryOrder::PerKey);
                    a.table.columns.partition_key = Some("order_id".into());
                }),
                "per-key ordering",
            ),
            (Box::new(|a| a.listen = Some(true)), "--listen"),
        ];
        // Not asked for, LISTEN is left off: the workers poll.
        assert!(!config.listen);
        for (mutate, need) in needs_session {
            let mut refused = args.clone();
            mutate(&mut refused);
            let err = resolve_run(&refused).unwrap_err();
            let text = err.to_string();
            assert_eq!(err.field, "session-database-url", "{text}");
            for named in [
                need,
                "--database-pool-mode transaction",
                "--session-database-url",
            ] {
                assert!(text.contains(named), "{named}: {text}");
            }
            assert!(!text.contains(":pw@"), "{text}");

            refused.table.session_database_url =
                Some("postgres://u:direct-pw@db-direct:5432/test".into());
            refused.table.database_password_file = Some("/run/pw".into());
            let config = resolve_run(&refused).unwrap();
            assert!(config.listen);
            let session = config.db.session_database(need).unwrap();
            assert_eq!(
                session.url().redacted(),
                "postgres://u:***@db-direct:5432/test"
            );
            assert_eq!(
                session.password_file(),
                Some(std::path::Path::new("/run/pw"))
            );
        }
    }

    #[test]
    fn a_session_url_without_transaction_pooling_is_refused_and_the_file_takes_both() {
        let mut args = run_args();
        args.table.session_database_url = Some("postgres://u:pw@direct/test".into());
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "session-database-url", "{err}");
        assert!(
            err.to_string().contains("--database-pool-mode transaction"),
            "{err}"
        );
        assert!(!err.to_string().contains("pw@"), "{err}");

        let file = FileConfig::parse(
            "database_pool_mode: transaction\nsession_database_url: postgres://u@direct/test\n",
        )
        .unwrap();
        let db = resolve_table_with(&run_args().table, &file).unwrap();
        assert_eq!(db.pool_mode, PoolMode::Transaction);
        assert!(db.session_database("migrate").is_ok());
        assert!(FileConfig::parse("database_pool_mode: statement\n").is_err());
        // The default: a session, reached by --database-url itself.
        let db = resolve_table_with(&run_args().table, &FileConfig::default()).unwrap();
        assert_eq!(db.pool_mode, PoolMode::Session);
        assert_eq!(db.session_database("migrate").unwrap(), &db.database);
    }

    fn amqp10_args() -> RunArgs {
        RunArgs {
            broker_protocol: Some(BrokerProtocol::Amqp10),
            broker_url: Some("amqp://outbox:outbox@localhost:5673".into()),
            amqp_url: None,
            address: Some("orders".into()),
            ..run_args()
        }
    }

    #[test]
    fn amqp10_needs_an_address_and_refuses_the_options_of_exchanges() {
        let config = resolve_run(&amqp10_args()).unwrap();
        assert_eq!(config.broker_protocol, BrokerProtocol::Amqp10);
        assert_eq!(config.address.as_deref(), Some("orders"));
        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let refused: Vec<(Mutation, &str)> = vec![
            (Box::new(|a| a.address = None), "address"),
            (Box::new(|a| a.address = Some(" ".into())), "address"),
            (Box::new(|a| a.exchange = Some("orders".into())), "exchange"),
            (
                Box::new(|a| a.declare_exchange = Some(ExchangeType::Topic)),
                "declare-exchange",
            ),
            (
                Box::new(|a| a.routing_key = Some("k".into())),
                "routing-key",
            ),
            (
                Box::new(|a| a.table.columns.routing_key = Some("rk".into())),
                "routing-key-column",
            ),
            (Box::new(|a| a.mandatory = Some(true)), "mandatory"),
            (
                Box::new(|a| a.dead_letter_exchange = Some("dlx".into())),
                "dead-letter-exchange",
            ),
            (
                Box::new(|a| a.publisher_confirms = Some(false)),
                "publisher-confirms",
            ),
        ];
        for (mutate, field) in refused {
            let mut args = amqp10_args();
            mutate(&mut args);
            let err = resolve_run(&args).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(!err.to_string().contains("secret-pw"), "{err}");
        }
    }

    #[test]
    fn cloudevents_binary_needs_a_uri_reference_source() {
        let mut args = run_args();
        assert_eq!(resolve_run(&args).unwrap().cloudevents, None);
        args.cloudevents = Some(CloudEventsMode::Binary);
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "cloudevents-source", "{err}");
        assert!(err.to_string().contains("is missing"), "{err}");
        args.cloudevents_source = Some("not a uri".into());
        assert_eq!(resolve_run(&args).unwrap_err().field, "cloudevents-source");
        args.cloudevents_source = Some("/orders".into());
        assert_eq!(
            resolve_run(&args).unwrap().cloudevents,
            Some(CloudEvents {
                source: "/orders".into()
            })
        );
        args.cloudevents = None;
        assert_eq!(resolve_run(&args).unwrap_err().field, "cloudevents-source");
        let file =
            FileConfig::parse("cloudevents: binary\ncloudevents_source: urn:example:orders\n")
                .unwrap();
        let config = resolve_run_with(&run_args(), &file).unwrap();
        assert_eq!(config.cloudevents.unwrap().source, "urn:example:orders");
    }

    #[test]
    fn a_tracestate_column_needs_a_traceparent_column() {
        let mut args = run_args();
        args.table.columns.tracestate = Some("tracestate".into());
        assert_eq!(resolve_run(&args).unwrap_err().field, "tracestate-column");
        args.table.columns.traceparent = Some("traceparent".into());
        let columns = resolve_run(&args).unwrap().db.table.columns;
        assert_eq!(columns.traceparent.unwrap().as_str(), "traceparent");
    }

    #[test]
    fn the_broker_url_has_two_spellings_and_the_newer_one_wins() {
        let by_new_name = RunArgs {
            broker_url: Some("amqp://guest:guest@localhost:5672/%2f".into()),
            amqp_url: None,
            ..run_args()
        };
        assert!(resolve_run(&by_new_name).is_ok());
        let both_same = RunArgs {
            broker_url: by_new_name.broker_url.clone(),
            ..run_args()
        };
        assert!(resolve_run(&both_same).is_ok());
        let differ = RunArgs {
            broker_url: Some("amqp://other:pw@elsewhere:5672/%2f".into()),
            ..run_args()
        };
        let chosen = resolve_run(&differ).unwrap().broker_urls;
        assert_eq!(chosen.to_string(), "amqp://other:***@elsewhere:5672/%2f");
        let bad_new = RunArgs {
            broker_url: Some("http://x".into()),
            ..run_args()
        };
        assert_eq!(resolve_run(&bad_new).unwrap_err().field, "broker-url");
        // Issue 44: a list of nodes; a bad element is named by its position, without its text.
        let list = RunArgs {
            broker_url: Some("amqp://u:pw1@h1:5672/%2f,amqp://u:pw2@h2:5673/%2f".into()),
            ..run_args()
        };
        assert_eq!(resolve_run(&list).unwrap().broker_urls.len(), 2);
        let bad_element = RunArgs {
            amqp_url: Some("amqp://u:pw1@h1:5672/%2f,amqps://u:pw2@/x".into()),
            ..run_args()
        };
        let err = resolve_run(&bad_element).unwrap_err();
        assert_eq!(err.field, "amqp-url");
        assert!(
            err.to_string()
                .starts_with("invalid --amqp-url: element 2 of 2 is not a URL"),
            "{err}"
        );
        assert!(!err.to_string().contains("pw1") && !err.to_string().contains("pw2"));
        let neither = RunArgs {
            amqp_url: None,
            ..run_args()
        };
        let missing = resolve_run(&neither).unwrap_err();
        assert!(
            missing.to_string().contains("--broker-url (or --amqp-url)"),
            "{missing}"
        );
        let address_under_091 = RunArgs {
            address: Some("orders".into()),
            ..run_args()
        };
        assert_eq!(
            resolve_run(&address_under_091).unwrap_err().field,
            "address"
        );
    }

    /// The pairing is checked once, in `BrokerTls::new`, which every source goes through: flags
    /// (and the environment, which clap puts in the same fields; tests/tests/services/cli.rs runs
    /// that one), the YAML file, and a mix of the two.
    #[test]
    fn a_broker_client_certificate_needs_its_key_from_every_source() {
        let names_both = |err: &ConfigError| {
            let text = err.to_string();
            assert!(
                text.contains("--broker-client-cert") && text.contains("--broker-client-key"),
                "{text}"
            );
        };
        let mut args = run_args();
        args.broker_client_cert = Some("/tls/client.pem".into());
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "broker-client-cert", "{err}");
        names_both(&err);

        let file = FileConfig::parse("broker_client_key: /tls/client.key\n").unwrap();
        let err = resolve_run_with(&run_args(), &file).unwrap_err();
        assert_eq!(err.field, "broker-client-key", "{err}");
        names_both(&err);

        let paired = resolve_run_with(&args, &file).unwrap().broker_tls.client;
        assert_eq!(
            paired,
            Some(ClientCert {
                cert: "/tls/client.pem".into(),
                key: "/tls/client.key".into()
            })
        );
    }

    #[test]
    fn defaults_match_the_reference_table() {
        let config = resolve_run(&run_args()).unwrap();
        assert_eq!(config.db.table.name.to_string(), "outbox_messages");
        assert_eq!(config.db.table.columns, Columns::default());
        assert_eq!(config.batch_size, 500);
        assert_eq!(config.inflight_batches, 1);
        assert_eq!(config.max_rate, None, "no limit unless asked for");
        let limited = RunArgs {
            max_rate: Some(2.5),
            ..run_args()
        };
        assert_eq!(resolve_run(&limited).unwrap().max_rate, Some(2.5));
        let file = FileConfig::parse("max_rate: 400\n").unwrap();
        assert_eq!(
            resolve_run_with(&run_args(), &file).unwrap().max_rate,
            Some(400.0)
        );
        assert!(config.publisher_confirms);
        assert_eq!(config.routing_key, RoutingKey::Type);
        assert_eq!(config.db.relay_name, "outbox_messages");
    }

    #[test]
    fn flags_override_the_file() {
        let file =
            FileConfig::parse("table: app.events\nbatch_size: 50\ncolumns:\n  payload: body\n")
                .unwrap();
        let mut args = run_args();
        args.batch_size = Some(70);
        let db = resolve_table_with(&args.table, &file).unwrap();
        assert_eq!(db.table.name.to_string(), "app.events");
        assert_eq!(db.table.columns.payload.as_str(), "body");
        args.table.table = Some("other".into());
        assert_eq!(
            resolve_table_with(&args.table, &file)
                .unwrap()
                .table
                .name
                .to_string(),
            "other"
        );
    }

    #[test]
    fn bad_values_name_their_option() {
        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|a| a.table.table = Some("outbox; drop table x".into())),
                "table",
            ),
            (
                Box::new(|a| a.table.columns.payload = Some("".into())),
                "payload-column",
            ),
            (Box::new(|a| a.batch_size = Some(0)), "batch-size"),
            (Box::new(|a| a.batch_size = Some(-5)), "batch-size"),
            (Box::new(|a| a.workers = Some(100_000)), "workers"),
            (
                Box::new(|a| a.inflight_batches = Some(-1)),
                "inflight-batches",
            ),
            (Box::new(|a| a.max_rate = Some(0.0)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(-5.0)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(f64::NAN)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(f64::INFINITY)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(0.5)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(2e6)), "max-rate"),
            (
                Box::new(|a| a.amqp_url = Some("http://x".into())),
                "amqp-url",
            ),
            (
                Box::new(|a| a.table.database_url = Some("::::".into())),
                "database-url",
            ),
            (Box::new(|a| a.exchange = Some("x".repeat(300))), "exchange"),
            (
                Box::new(|a| a.table.dead_client_timeout = Some(Duration::from_secs(2))),
                "dead-client-timeout",
            ),
            (
                Box::new(|a| {
                    a.table.idle_in_transaction_timeout = Some(Duration::from_millis(500));
                }),
                "idle-in-transaction-timeout",
            ),
            // The server would end a batch's session while it awaits its confirms.
            (
                Box::new(|a| a.table.idle_in_transaction_timeout = Some(Duration::from_secs(8))),
                "idle-in-transaction-timeout",
            ),
        ];
        for (mutate, field) in cases {
            let mut args = run_args();
            mutate(&mut args);
            let err = resolve_run(&args).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().starts_with(&format!("invalid --{field}: ")));
        }
        // Values with a type of their own are refused by clap as it parses them, naming the
        // flag the same way.
        #[derive(clap::Parser)]
        struct Run {
            #[command(flatten)]
            args: RunArgs,
        }
        let typed = [
            ("mode", "archive"),
            ("publish-timeout", "soon"),
            ("poll-interval", "0s"),
            ("metrics-addr", "nowhere"),
            ("declare-exchange", "queue"),
            ("log-format", "xml"),
            ("database-pool-mode", "statement"),
            ("max-rate", "fast"),
        ];
        for (field, value) in typed {
            let flag = format!("--{field}");
            let Err(err) = <Run as clap::Parser>::try_parse_from(["run", &flag, value]) else {
                panic!("{flag} {value} was accepted");
            };
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{err}"
            );
            assert!(err.to_string().contains(&flag), "{err}");
        }
    }

    /// The help texts say the defaults in words; they must be the ones that apply.
    #[test]
    fn help_texts_state_the_defaults_that_apply() {
        use crate::table::outbox::DeliveryMode;
        use clap::ValueEnum;
        let command = <RunArgs as clap::Args>::augment_args(clap::Command::new("run"));
        let help = |id: &str| {
            command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_else(|| panic!("no help for {id}"))
        };
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        let name = |v: clap::builder::PossibleValue| v.get_name().to_string();
        let stated = [
            ("table", defaults::TABLE.to_string()),
            ("id_column", defaults::columns::ID.into()),
            ("type_column", defaults::columns::TYPE.into()),
            ("payload_column", defaults::columns::PAYLOAD.into()),
            ("occurred_at_column", defaults::columns::OCCURRED_AT.into()),
            (
                "processed_at_column",
                defaults::columns::PROCESSED_AT.into(),
            ),
            ("error_column", defaults::columns::ERROR.into()),
            (
                "mode",
                name(DeliveryMode::default().to_possible_value().unwrap()),
            ),
            ("exchange", defaults::EXCHANGE.into()),
            ("batch_size", defaults::BATCH_SIZE.to_string()),
            ("workers", defaults::WORKERS.to_string()),
            ("inflight_batches", defaults::INFLIGHT_BATCHES.to_string()),
            ("max_attempts", defaults::MAX_ATTEMPTS.to_string()),
            ("publish_timeout", duration(defaults::PUBLISH_TIMEOUT)),
            ("commit_timeout", duration(defaults::COMMIT_TIMEOUT)),
            ("broker_heartbeat", duration(defaults::BROKER_HEARTBEAT)),
            (
                "idle_in_transaction_timeout",
                duration(defaults::IDLE_IN_TRANSACTION_TIMEOUT),
            ),
            (
                "dead_client_timeout",
                duration(defaults::DEAD_CLIENT_TIMEOUT),
            ),
            ("poll_interval", duration(defaults::POLL_INTERVAL)),
            ("metrics_addr", defaults::METRICS_ADDR.to_string()),
            (
                "log_format",
                name(LogFormat::default().to_possible_value().unwrap()),
            ),
            ("shutdown_grace", duration(defaults::SHUTDOWN_GRACE)),
            ("report_interval", duration(defaults::REPORT_INTERVAL)),
        ];
        for (id, default) in stated {
            let text = help(id);
            assert!(
                text.trim_end_matches('.')
                    .ends_with(&format!("Default: {default}")),
                "{id}: {text}"
            );
        }
        for (id, range) in [
            ("batch_size", defaults::BATCH_SIZE_RANGE),
            ("workers", defaults::WORKERS_RANGE),
            ("max_attempts", defaults::MAX_ATTEMPTS_RANGE),
        ] {
            let text = help(id);
            let stated = format!("({}..={})", range.start(), range.end());
            assert!(text.contains(&stated), "{id}: {text}");
        }
    }

    #[test]
    fn file_keys_are_checked() {
        let err = FileConfig::parse("batch_sise: 5\n").unwrap_err();
        assert!(err.contains("batch_sise"), "{err}");
        let err = FileConfig::parse("columns:\n  paylod: x\n").unwrap_err();
        assert!(err.contains("paylod"), "{err}");
        assert!(FileConfig::parse("batch_size: [1").is_err());
        assert!(FileConfig::parse("- a\n- b\n").is_err());
        assert!(FileConfig::parse("batch_size: many\n").is_err());
        assert!(FileConfig::parse("mode: archive\n").is_err());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// The file's keys, as serde itself lists them when it refuses an unknown one, so
        /// this list cannot fall behind the struct.
        fn known_keys() -> Vec<String> {
            let error = FileConfig::parse("surely_not_a_key: 1\n").unwrap_err();
            let (_, listed) = error
                .split_once("expected one of")
                .unwrap_or_else(|| panic!("serde_yaml no longer lists the fields: {error}"));
            let names = listed.split('`').skip(1).step_by(2);
            names.map(str::to_string).collect()
        }

        /// The file takes every option of `run` (flag names with underscores), except the
        /// file itself, with the column flags under `columns:`.
        #[test]
        fn the_file_and_the_flags_know_the_same_options() {
            use clap::CommandFactory;
            #[derive(clap::Parser)]
            struct Run {
                #[command(flatten)]
                args: RunArgs,
            }
            let mut flags: Vec<String> = Run::command()
                .get_arguments()
                .filter_map(|arg| arg.get_long())
                .filter(|long| *long != "config" && !long.ends_with("-column"))
                .map(|long| long.replace('-', "_"))
                .chain(["columns".to_string()])
                .collect();
            let mut keys = known_keys();
            flags.sort();
            keys.sort();
            assert!(keys.len() > 20, "{keys:?}");
            assert_eq!(keys, flags);
        }

        proptest! {
            // Any text at all: the parser answers Ok or Err, it never panics.
            #[test]
            fn fuzz_config_parser_never_panics(text in "\\PC{0,200}") {
                let _ = FileConfig::parse(&text);
            }

            // YAML-looking text built from real and invented keys and odd values.
            #[test]
            fn fuzz_config_parser_on_yaml_shapes(
                lines in proptest::collection::vec(("[a-z_]{1,16}", prop_oneof![
                    Just("1".to_string()), Just("-5".to_string()), Just("[".to_string()), Just("{a: 1}".to_string()),
                    Just("true".to_string()), Just("''".to_string()), "[a-z0-9 .;]{0,20}",
                ]), 0..8)
            ) {
                let text: String = lines.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
                if let Err(message) = FileConfig::parse(&text) {
                    prop_assert!(!message.is_empty());
                }
            }

            #[test]
            fn fuzz_unknown_keys_are_named(key in "[a-z_]{1,24}") {
                prop_assume!(!known_keys().contains(&key));
                let err = FileConfig::parse(&format!("{key}: 1\n")).unwrap_err();
                prop_assert!(err.contains(&key), "{}", err);
            }

            // Whatever the table text, resolution answers with a ConfigError naming --table or succeeds.
            #[test]
            fn fuzz_table_names_resolve_or_name_the_field(table in "\\PC{0,80}") {
                let mut args = TableArgs {
                    database_url: Some("postgres://u@localhost/db".into()),
                    table: Some(table),
                    ..Default::default()
                };
                match resolve_table(&args) {
                    Ok(config) => prop_assert!(config.table.name.quoted().starts_with('"')),
                    Err(e) => prop_assert_eq!(e.field, "table"),
                }
                args.table = None;
                prop_assert!(resolve_table(&args).is_ok());
            }
        }
    }
}
