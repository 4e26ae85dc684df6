//! The options of `run`, resolved into a [`RelayConfig`]: the table's ([`super::table`]),
//! the broker's ([`super::broker`]), and the relay's own: batches, workers, rate limit,
//! attempts, timeouts and intervals, LISTEN, the metrics address, the log format and the pod
//! name.

use std::net::SocketAddr;
use std::time::Duration;

use super::broker::{amqp10_only, amqp091_only, broker_urls, cloudevents_settings, short_string};
use super::file::FileConfig;
use super::flags::RunArgs;
use super::layering::{duration, layer, load_file, ranged};
use super::parse::{ConfigError, LogFormat};
use super::table::{TableConfig, resolve_table_with};
use crate::broker::BrokerProtocol;
use crate::broker::cloudevents::CloudEvents;
use crate::broker::routing::{ExchangeType, RoutingKey};
use crate::broker::tls::BrokerTls;
use crate::broker::urls::BrokerUrls;
use crate::defaults;
use crate::table::outbox::DeliveryOrder;

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

/// Resolves the options of `run`.
pub fn resolve_run(args: &RunArgs) -> Result<RelayConfig, ConfigError> {
    resolve_run_with(args, &load_file(&args.table)?)
}

pub(super) fn resolve_run_with(
    args: &RunArgs,
    file: &FileConfig,
) -> Result<RelayConfig, ConfigError> {
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
