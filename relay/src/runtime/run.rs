//! `outbox-relay run`: wires the workers, the reporter, the LISTEN task and the HTTP server
//! together, and shuts them down in order on SIGTERM.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use opentelemetry::trace::TracerProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sqlx::{Connection, PgConnection};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, instrument, warn};

use crate::broker::amqp::{AmqpConnector, AmqpSettings};
use crate::broker::amqp10::address::AddressFormat;
use crate::broker::amqp10::{Amqp10Connector, Amqp10Settings};
use crate::broker::nodes::NodeList;
use crate::broker::{BrokerProtocol, Connector};
use crate::config::RelayConfig;
use crate::database::{DatabaseTarget, PoolMode, TRANSACTION_POOLING, behind_transaction_pooling};
use crate::metrics::Metrics;
use crate::protocol::batch::BatchSettings;
use crate::protocol::shared_cursor::SharedCursor;
use crate::runtime::backoff::Backoff;
use crate::runtime::health::Health;
use crate::runtime::rate::{RateGate, claim_size};
use crate::runtime::reporter::{ReporterContext, read_share_into, run_reporter, say_limit_change};
use crate::runtime::suspend::Suspension;
use crate::runtime::worker::{WorkerContext, run_worker};
use crate::table::inspect::{InspectError, TableShape, inspect_with};
use crate::table::migrate::notify_channel;
use crate::table::outbox::DeliveryOrder;
use crate::table::sql::Statements;
use crate::telemetry::batch_spans::{BatchSpans, MessagingSystem};
use crate::telemetry::export::{
    ExportCounters, ExportSetupError, flush_and_stop, say_exporting, tracer_provider,
};
use crate::telemetry::settings::OtlpTarget;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The table or its columns do not match the configuration: the user must fix it.
    #[error(transparent)]
    Table(InspectError),
    #[error("invalid --metrics-addr: cannot listen on {addr}: {source}; pick a free port")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("shutdown grace period of {0:?} ran out with batches still in flight; they roll back")]
    GraceExpired(std::time::Duration),
    #[error(transparent)]
    Spans(#[from] ExportSetupError),
}

impl RunError {
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            RunError::Table(_) | RunError::Bind { .. } | RunError::Spans(_)
        )
    }
}

/// How long the spans still queued at exit may take to go out.
const SPANS_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// The batch spans of this process, when `otlp` says where they go; the provider is kept to
/// flush them at exit.
fn batch_spans(
    config: &RelayConfig,
    otlp: Option<&OtlpTarget>,
    metrics: &Metrics,
) -> Result<Option<(SdkTracerProvider, BatchSpans)>, ExportSetupError> {
    let Some(target) = otlp else {
        return Ok(None);
    };
    let counters = ExportCounters {
        exported: metrics.spans_exported.clone(),
        failed: metrics.spans_export_failed.clone(),
    };
    let links = u32::try_from(config.batch_size).unwrap_or(u32::MAX);
    let provider = tracer_provider(target, "outbox-relay", links, counters)?;
    say_exporting(target);
    let (system, destination) = match config.broker_protocol {
        BrokerProtocol::Amqp091 => (MessagingSystem::RabbitMq, config.exchange.clone()),
        BrokerProtocol::Amqp10 => (
            MessagingSystem::Amqp10,
            config.address.clone().unwrap_or_default(),
        ),
    };
    let database = config
        .db
        .database
        .url()
        .parsed()
        .map(|url| url.path().trim_start_matches('/').to_string())
        .filter(|name| !name.is_empty());
    let spans = BatchSpans::new(
        provider.tracer("outbox-relay"),
        &config.db.table.name.to_string(),
        database.as_deref(),
        &destination,
        system,
    );
    Ok(Some((provider, spans)))
}

/// Starts `count` workers with the connector `context` holds: the one place that is generic
/// over the broker protocol.
fn spawn_workers<C: Connector>(
    workers: &mut tokio::task::JoinSet<()>,
    context: WorkerContext<C>,
    count: usize,
) {
    for worker in 0..count {
        workers.spawn(run_worker(context.clone(), worker).in_current_span());
    }
}

/// Connects and checks the table, retrying while PostgreSQL is unreachable. Returns `None`
/// when shutdown came first.
async fn inspect_with_retry(
    config: &RelayConfig,
    health: &Health,
    metrics: &Metrics,
    rate: &RateGate,
    shutdown: &CancellationToken,
) -> Result<Option<TableShape>, RunError> {
    let mut backoff = Backoff::default();
    loop {
        let refusals = &metrics.database_standby_refusals;
        let connected = crate::database::connect_counted(&config.db.database, refusals).await;
        let said = health.database_attempt(
            connected.as_ref().map(|_| ()),
            &metrics.database_waiting_for_primary,
            "cannot connect to PostgreSQL at start",
        );
        match connected {
            // Retried even when a setting is at fault: a CA or a password file may be fixed
            // while the relay waits, and the reason is on /readyz meanwhile.
            Err(e) => {
                metrics
                    .database_connect_failures
                    .with_label_values(&[e.kind.code()])
                    .inc();
                if let Some(state) = said {
                    warn!(database = %config.db.database, reason = e.kind.code(), "{state}");
                }
            }
            Ok(mut conn) => {
                let shape = inspect_on(&mut conn, config).await;
                if shape.is_ok() {
                    // The share before the first claim, so a pod the operator just added
                    // starts within it. Unreadable: the reporter tries again, and says why.
                    let limits = config.db.table.limits_table();
                    let relay = &config.db.relay_name;
                    if let Ok(change) =
                        read_share_into(&mut conn, config.db.pool_mode, &limits, relay, rate).await
                    {
                        say_limit_change(change, "this pod's share of spec.relay.maxRate");
                    }
                }
                let _ = conn.close().await;
                match shape {
                    Ok(shape) => return Ok(Some(shape)),
                    Err(e) if e.is_user_error() => return Err(RunError::Table(e)),
                    Err(InspectError::Database(e)) if behind_transaction_pooling(&e) => {
                        warn!(database = %config.db.database, error = %e, "cannot inspect the table, retrying: {TRANSACTION_POOLING}");
                    }
                    Err(e) => {
                        warn!(database = %config.db.database, error = %e, "PostgreSQL failed while inspecting the table; retrying");
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Inspects the table over `conn`: under a transaction pool inside a transaction, since the
/// statements then go unnamed and each needs one server session from Parse to Execute.
async fn inspect_on(
    conn: &mut PgConnection,
    config: &RelayConfig,
) -> Result<TableShape, InspectError> {
    let pool_mode = config.db.pool_mode;
    if pool_mode.named_statements() {
        return inspect_with(conn, &config.db.table, pool_mode).await;
    }
    let mut tx = conn.begin().await?;
    let shape = inspect_with(&mut tx, &config.db.table, pool_mode).await?;
    tx.commit().await?;
    Ok(shape)
}

/// Where the workers claim, and how they send their statements: per-key workers hold their
/// lanes as session advisory locks on their claim connection, so under a transaction pool they
/// claim through `--session-database-url` (config resolution refused a run without it);
/// unordered workers claim through `--database-url`, as it is.
fn claim_database(config: &RelayConfig) -> (DatabaseTarget, PoolMode) {
    let db = &config.db;
    match (db.table.ordering, db.pool_mode, &db.session_database) {
        (DeliveryOrder::PerKey, PoolMode::Transaction, Some(session)) => {
            (session.clone(), PoolMode::Session)
        }
        _ => (db.database.clone(), db.pool_mode),
    }
}

/// Runs the relay until `shutdown` is cancelled, then lets the batches in flight finish; while
/// `suspension` says so, the workers claim nothing. Its span names the relay on every log line
/// of the process, the workers' included.
#[instrument(name = "relay", skip_all, fields(relay = %config.db.relay_name))]
pub async fn run(
    config: RelayConfig,
    otlp: Option<OtlpTarget>,
    metrics: Metrics,
    shutdown: CancellationToken,
    suspension: Suspension,
) -> Result<(), RunError> {
    if !config.publisher_confirms {
        warn!(
            "publisher confirms are OFF: rows are marked as soon as messages are written to the socket, \
             so a broker failure can lose messages. Turn them on unless you accept that loss."
        );
    }
    if config.db.table.columns.attempts.is_none() && config.max_attempts > 1 {
        info!(
            "no attempts column mapped: a message the broker rejects is dead-lettered at its first rejection"
        );
    }
    let health = Health::default();
    let rate = Arc::new(RateGate::new(
        config.max_rate,
        config.batch_size,
        metrics.rate_limit_wait_seconds.clone(),
        metrics.rate_limit.clone(),
    ));
    if let Some(max_rate) = config.max_rate {
        let claim = claim_size(max_rate, config.batch_size);
        if (claim as usize) < config.batch_size {
            warn!(
                max_rate,
                batch_size = config.batch_size,
                "--max-rate {max_rate} is below --batch-size {}: a claim takes at most {claim} rows \
                 (one second of the limit), so a burst never exceeds it; lower --batch-size to \
                 match and silence this",
                config.batch_size
            );
        }
    }
    let http_stop = CancellationToken::new();
    let http = crate::runtime::http::serve(
        config.metrics_addr,
        config.metrics_addr_is_default,
        metrics.clone(),
        health.clone(),
        http_stop.clone(),
    )
    .await
    .map_err(|source| RunError::Bind {
        addr: config.metrics_addr,
        source,
    })?;

    let spans_export = batch_spans(&config, otlp.as_ref(), &metrics)?;
    let Some(shape) = inspect_with_retry(&config, &health, &metrics, &rate, &shutdown).await?
    else {
        http_stop.cancel();
        return Ok(());
    };
    if !shape.server_autovacuum {
        warn!("{}", crate::table::migrate::AUTOVACUUM_OFF_WARNING);
    }
    if !shape.shared_frontier && config.db.table.ordering != DeliveryOrder::PerKey {
        // Said once at start: it costs database time, not correctness.
        info!(
            sequence = %config.db.table.frontier_sequence(),
            "the table has no claim frontier sequence this role may advance: the pods' claims \
             step over each other's rows, at a cost that grows with the pods; `outbox-relay \
             migrate` (or the operator) creates it, or GRANT SELECT, UPDATE on it"
        );
    }
    let statements = Statements::for_shape(&config.db.table, &shape);
    let (claim_database, claim_pool_mode) = claim_database(&config);
    let reporter_statements = Arc::new(statements.clone().for_pool(config.db.pool_mode));
    let statements = Arc::new(statements.for_pool(claim_pool_mode));
    let published_total = Arc::new(AtomicU64::new(0));
    // Keep the sender alive for the whole run; workers treat a closed channel as "poll only".
    let (wake_tx, wake_rx) = watch::channel(0u64);

    let workers_stop = shutdown.child_token();
    let content_type = config
        .content_type
        .clone()
        .unwrap_or_else(|| shape.payload.default_content_type().to_string());
    let connection_name = format!("outbox-relay {} {}", config.db.relay_name, config.pod_name);
    // Everything but the connector, which depends on the protocol.
    let shared = WorkerContext {
        database: claim_database,
        broker: (),
        statements: statements.clone(),
        settings: BatchSettings {
            batch_size: config.batch_size,
            routing_key: config.routing_key.clone(),
            max_attempts: config.max_attempts,
            has_attempts_column: config.db.table.columns.attempts.is_some(),
            dead_letter_exchange: config.dead_letter_exchange.is_some(),
            publish_slots: (config.inflight_batches > 0)
                .then(|| Arc::new(Semaphore::new(config.inflight_batches))),
            publish_notices: Arc::default(),
            commit_timeout: config.commit_timeout,
            spans: spans_export.as_ref().map(|(_, spans)| spans.clone()),
        },
        poll_interval: config.poll_interval,
        metrics: metrics.clone(),
        shutdown: workers_stop.clone(),
        wake: wake_rx,
        published_total: published_total.clone(),
        health: health.clone(),
        lanes_of: (config.db.table.ordering == DeliveryOrder::PerKey)
            .then(|| config.db.relay_name.clone()),
        suspension: suspension.clone(),
        rate: rate.clone(),
        cursor: Arc::new(SharedCursor::default()),
    };
    let mut workers = tokio::task::JoinSet::new();
    match config.broker_protocol {
        BrokerProtocol::Amqp091 => {
            let settings = AmqpSettings {
                exchange: config.exchange.clone(),
                dead_letter_exchange: config.dead_letter_exchange.clone(),
                confirms: config.publisher_confirms,
                mandatory: config.mandatory,
                timeout: config.publish_timeout,
                heartbeat: config.broker_heartbeat,
                content_type,
                declare_exchange: config.declare_exchange,
                connection_name,
                tls: config.broker_tls.clone(),
                password_file: config.broker_password_file.clone(),
                cloudevents: config.cloudevents.clone(),
            };
            let connector = NodeList::new(
                &config.broker_urls,
                |url| AmqpConnector {
                    url: url.clone(),
                    settings: settings.clone(),
                },
                metrics.broker.clone(),
            );
            spawn_workers(&mut workers, shared.with_broker(connector), config.workers);
        }
        BrokerProtocol::Amqp10 => {
            let address = config.address.clone().unwrap_or_default();
            // Which format the address is in, once: RabbitMQ 4 deprecates 3.x's.
            let format = AddressFormat::of(&address);
            info!(%address, format = format.label(), "{}", format.describe(&address));
            let settings = Amqp10Settings {
                address,
                timeout: config.publish_timeout,
                content_type,
                container_id: connection_name,
                tls: config.broker_tls.clone(),
                password_file: config.broker_password_file.clone(),
                cloudevents: config.cloudevents.clone(),
            };
            let connector = NodeList::new(
                &config.broker_urls,
                |url| Amqp10Connector {
                    url: url.clone(),
                    settings: settings.clone(),
                },
                metrics.broker.clone(),
            );
            spawn_workers(&mut workers, shared.with_broker(connector), config.workers);
        }
    }

    let background_stop = CancellationToken::new();
    let announcer = tokio::spawn(
        suspension
            .announce(metrics.suspended.clone(), background_stop.clone())
            .in_current_span(),
    );
    // A LISTEN lasts a session: under a transaction pool it goes to --session-database-url
    // (config resolution refused --listen without one).
    let listen_database = config
        .db
        .session_database("--listen")
        .ok()
        .cloned()
        .filter(|_| config.listen);
    if !config.listen
        && config.db.pool_mode == PoolMode::Transaction
        && config.db.session_database.is_none()
    {
        info!(poll_interval = ?config.poll_interval, "LISTEN is off: under --database-pool-mode transaction it needs --session-database-url; idle workers poll");
    }
    let listener = listen_database.map(|database| {
        tokio::spawn(
            crate::runtime::listener::run_listener(
                database,
                notify_channel(&config.db.table),
                wake_tx.clone(),
                health.clone(),
                background_stop.clone(),
            )
            .in_current_span(),
        )
    });
    let reporter = tokio::spawn(
        run_reporter(ReporterContext {
            database: config.db.database.clone(),
            pool_mode: config.db.pool_mode,
            reports_table: config.db.table.reports_table(),
            limits_table: config.db.table.limits_table(),
            table: config.db.table.clone(),
            statements: reporter_statements,
            relay: config.db.relay_name.clone(),
            pod: config.pod_name.clone(),
            interval: config.report_interval,
            retention: config.processed_retention,
            metrics: metrics.clone(),
            published_total,
            health,
            rate: rate.clone(),
            shutdown: background_stop.clone(),
        })
        .in_current_span(),
    );
    info!(
        table = %config.db.table.name,
        exchange = %config.exchange,
        workers = config.workers,
        batch_size = config.batch_size,
        max_rate = rate.in_force(),
        mode = config.db.table.mode.as_str(),
        pool_mode = config.db.pool_mode.as_str(),
        "relaying"
    );

    shutdown.cancelled().await;
    info!(grace = ?config.shutdown_grace, "shutting down: no new claims; finishing the batches in flight");
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    background_stop.cancel();
    let _ = reporter.await;
    let _ = announcer.await;
    if let Some(listener) = listener {
        let _ = listener.await;
    }
    http_stop.cancel();
    let _ = http.await;
    drop(wake_tx);
    if let Some((provider, _)) = spans_export {
        // The processor's thread sends them, and waits for this runtime to run its requests.
        let _ = tokio::task::spawn_blocking(move || flush_and_stop(provider, SPANS_FLUSH)).await;
    }
    match drained {
        Ok(()) => {
            info!("all batches settled; bye");
            Ok(())
        }
        Err(_) => {
            error!("grace period ran out");
            workers.abort_all();
            Err(RunError::GraceExpired(config.shutdown_grace))
        }
    }
}
