//! A worker: one database connection and one publisher, running batches until shutdown.
//! Outages are not message failures: the worker drops the broken connection, backs off with
//! jitter and reconnects; the open transaction rolls back, so no row is marked.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::broker::{ConnectError, Connector, Publisher};
use crate::database::{
    DatabaseTarget, TRANSACTION_POOLING, behind_transaction_pooling, server_gone,
};
use crate::metrics::{GaugeSeat, Metrics};
use crate::protocol::batch::{BatchError, BatchSettings, ClaimFrom, run_batch_up_to};
use crate::protocol::claim::ClaimStart;
use crate::protocol::shared_cursor::SharedCursor;
use crate::runtime::alarm::{AlarmTurn, BROKER_BLOCKED};
use crate::runtime::backoff::Backoff;
use crate::runtime::health::Health;
use crate::runtime::lanes::Lanes;
use crate::runtime::nacks::NackPause;
use crate::runtime::rate::RateGate;
use crate::runtime::suspend::Suspension;
use crate::table::sql::Statements;

/// What every worker of a process shares. `C` opens the publishers: the worker never names a
/// broker.
#[derive(Clone)]
pub struct WorkerContext<C> {
    pub database: DatabaseTarget,
    pub broker: C,
    pub statements: Arc<Statements>,
    pub settings: BatchSettings,
    pub poll_interval: Duration,
    pub metrics: Metrics,
    pub shutdown: CancellationToken,
    /// Bumped by the LISTEN task when the NOTIFY trigger fires.
    pub wake: watch::Receiver<u64>,
    pub published_total: Arc<AtomicU64>,
    /// Where a worker tells why it cannot connect, for `/readyz` and the reports.
    pub health: Health,
    /// Under per-key ordering, the relay name whose lanes the workers hold ([`Lanes`]);
    /// None: unordered.
    pub lanes_of: Option<String>,
    /// While suspended (SIGUSR1), the worker claims nothing.
    pub suspension: Suspension,
    /// The process's rate limit, shared by its workers (none in force: one flag per batch).
    pub rate: Arc<RateGate>,
    /// Where unordered claims start, one cursor for the process's workers, which take turns
    /// at the claim ([`SharedCursor`]).
    pub cursor: Arc<SharedCursor>,
}

impl<C> WorkerContext<C> {
    /// The same context with another connector.
    pub fn with_broker<D>(self, broker: D) -> WorkerContext<D> {
        WorkerContext {
            database: self.database,
            broker,
            statements: self.statements,
            settings: self.settings,
            poll_interval: self.poll_interval,
            metrics: self.metrics,
            shutdown: self.shutdown,
            wake: self.wake,
            published_total: self.published_total,
            health: self.health,
            lanes_of: self.lanes_of,
            suspension: self.suspension,
            rate: self.rate,
            cursor: self.cursor,
        }
    }
}

/// How often a worker looks again whether the broker still blocks publishing.
const BLOCKED_RECHECK: Duration = Duration::from_secs(1);

/// One of the worker's two connections, with its gauge and its backoff: the same reconnect
/// rules for the database and the broker.
struct Link<T> {
    /// "PostgreSQL" or "the broker", for the log lines.
    service: &'static str,
    connection: Option<T>,
    /// Its share of the "connected" gauge.
    flag: GaugeSeat,
    backoff: Backoff,
}

impl<T> Link<T> {
    fn new(service: &'static str, gauge: prometheus::IntGauge) -> Self {
        Self {
            service,
            connection: None,
            flag: GaugeSeat::new(gauge),
            backoff: Backoff::default(),
        }
    }

    /// Connects unless connected. A failed attempt's error is the caller's to tell, before it
    /// backs off. The backoff is not reset here but by [`Link::served`]: a server that accepts
    /// connections and then fails every batch (one that became a standby) must not be retried
    /// at full speed.
    async fn ensure<E>(&mut self, connect: impl Future<Output = Result<T, E>>) -> Result<(), E> {
        if self.connection.is_none() {
            self.connection = Some(connect.await?);
            if self.backoff.failures() > 0 {
                info!("reconnected to {}", self.service);
            }
        }
        self.flag.hold(true);
        Ok(())
    }

    /// A batch went through on this connection: the next failure backs off from the start.
    fn served(&mut self) {
        self.backoff.reset();
    }

    /// After a failure: the wait before the next attempt, growing with each failure in a row.
    fn next_delay(&mut self) -> Duration {
        self.backoff.next_delay()
    }

    /// Takes the connection away, e.g. for closing; the gauge counts it as down.
    fn take(&mut self) -> Option<T> {
        self.flag.hold(false);
        self.connection.take()
    }
}

pub async fn run_worker<C: Connector>(ctx: WorkerContext<C>, worker: usize) {
    run_worker_loop(ctx)
        .instrument(info_span!("worker", worker))
        .await;
}

async fn run_worker_loop<C: Connector>(ctx: WorkerContext<C>) {
    let mut db: Link<PgConnection> =
        Link::new("PostgreSQL", ctx.metrics.database_connected.clone());
    let mut broker: Link<C::Publisher> =
        Link::new("the broker", ctx.metrics.broker_connected.clone());
    let mut alarm = ctx.health.alarm().seat(ctx.metrics.broker_blocked.clone());
    let mut wake = ctx.wake.clone();
    let mut lanes = ctx.lanes_of.as_deref().map(Lanes::new);
    // The pause after the broker's nacks: its state, never the messages' fault.
    let mut nacks = NackPause::default();
    let mut suspension = ctx.suspension.clone();
    // Rate-limit permits paid for and not spent yet (see `runtime::rate`).
    let mut credit = 0;

    while !ctx.shutdown.is_cancelled() {
        // Checked before each claim: the batch in hand is finished first, and the connections
        // stay open while suspended (readiness still says whether the relay could deliver).
        if suspension.wait_while_suspended(&ctx.shutdown).await {
            continue;
        }
        let refusals = &ctx.metrics.database_standby_refusals;
        let connected = db
            .ensure(crate::database::connect_counted(&ctx.database, refusals))
            .await;
        let said = ctx.health.database_attempt(
            connected.as_ref().map(|_| ()),
            &ctx.metrics.database_waiting_for_primary,
            "cannot connect to PostgreSQL",
        );
        if let Err(e) = connected {
            ctx.metrics
                .database_connect_failures
                .with_label_values(&[e.kind.code()])
                .inc();
            let delay = db.next_delay();
            if let Some(state) = said {
                warn!(endpoint = %ctx.database, reason = e.kind.code(), retry_in_ms = delay.as_millis(), "{state}");
            }
            pause(&ctx.shutdown, delay).await;
            continue;
        }
        if let Some(lasted) = ctx.health.database_said().over() {
            info!(endpoint = %ctx.database, after_s = lasted.as_secs(), "PostgreSQL accepts the relay's sessions again");
        }
        if broker
            .connection
            .as_ref()
            .is_some_and(|p| !p.is_connected())
            && let Some(old) = broker.take()
        {
            // Found broken between batches (a cut or a broker restart while nothing was in
            // flight): said once, so an outage never passes silently.
            warn!("the broker connection was lost between batches; reconnecting");
            old.close().await;
        }
        if broker.connection.is_none() && give_lanes_back(&mut db, lanes.as_mut(), &ctx.metrics) {
            continue;
        }
        let connected = broker.ensure(ctx.broker.connect()).await;
        ctx.health.broker_connect(connected.as_ref().map(|_| ()));
        if let Err(e) = connected {
            alarm.leave();
            let delay = broker.next_delay();
            ctx.metrics
                .broker
                .connect_failures
                .with_label_values(&[e.code()])
                .inc();
            log_broker_failure(&ctx, &e, delay);
            pause(&ctx.shutdown, delay).await;
            continue;
        }
        if let Some(lasted) = ctx.health.broker_said().over() {
            info!(endpoint = %ctx.broker.endpoint(), after_s = lasted.as_secs(), "the broker accepts the relay again");
        }
        // A blocked broker takes no publish: a claim now would hold its rows for nothing. The
        // alarm is the broker's, so one worker's blocked connection stops them all: the others'
        // connections look unblocked until they publish (RabbitMQ says connection.blocked only
        // then), and each would hold a claim through a publish timeout.
        let connection_blocked = broker.connection.as_ref().is_some_and(|p| p.is_blocked());
        match alarm.turn(connection_blocked) {
            AlarmTurn::Blocked { say } => {
                ctx.health.broker_blocked();
                if say {
                    warn!("{BROKER_BLOCKED}");
                }
                pause(&ctx.shutdown, ctx.poll_interval.max(BLOCKED_RECHECK)).await;
                continue;
            }
            AlarmTurn::Clear { over: Some(lasted) } => {
                info!(
                    after_s = lasted.as_secs(),
                    "the broker takes publishes again"
                );
            }
            AlarmTurn::Clear { over: None } => {}
        }

        let seen_wake = *wake.borrow_and_update();
        let conn = db.connection.as_mut().expect("connected above");
        let held = match lanes.as_mut() {
            None => None,
            Some(lanes) => match lanes.balance_if_due(conn).await {
                Ok(balance) => {
                    if let Some(b) = balance.filter(|b| b.taken + b.released.len() > 0) {
                        ctx.metrics.blocked_keys.release_lanes(&b.released);
                        info!(
                            workers = b.workers,
                            share = b.share,
                            taken = b.taken,
                            released = b.released.len(),
                            held = lanes.held().len(),
                            "lanes rebalanced"
                        );
                    }
                    Some(lanes.held())
                }
                Err(e) => {
                    warn!(error = %e, "cannot balance the lanes; reconnecting to PostgreSQL");
                    drop_database(&mut db, Some(lanes), &ctx.metrics);
                    pause(&ctx.shutdown, db.next_delay()).await;
                    continue;
                }
            },
        };
        if held.as_ref().is_some_and(Vec::is_empty) {
            // Every lane is held by other workers (more workers than lanes, or a rebalance
            // under way): nothing to claim until the next balance.
            idle(&ctx, &mut wake, seen_wake).await;
            continue;
        }
        let publisher = broker.connection.as_mut().expect("connected above");
        // Per-key claims always start at the head: a seek past a pending row (one the broker
        // refused, or one of a lane just taken over) would let a later row of its key overtake
        // it.
        let claim_from = match held {
            Some(_) => ClaimFrom::Start(ClaimStart::Head),
            None => ClaimFrom::Cursor(&ctx.cursor),
        };
        // Permits before the claim, never with rows locked. None: shutdown came first.
        let Some(limit) = ctx.rate.before_claim(&mut credit, &ctx.shutdown).await else {
            break;
        };
        ctx.metrics.workers_busy.inc();
        let result = run_batch_up_to(
            conn,
            publisher,
            &ctx.statements,
            &ctx.settings,
            &ctx.metrics,
            claim_from,
            held.as_deref(),
            limit,
        )
        .await;
        ctx.metrics.workers_busy.dec();
        // A failed batch may have published some of its rows before it rolled back: counted
        // as a whole claim, so they are paid for when they go again.
        let spent = result.as_ref().map_or(limit, |report| report.claimed);
        ctx.rate.after_claim(&mut credit, spent);
        match result {
            Ok(report) => {
                db.served();
                if report.broker_broken.is_none() {
                    broker.served();
                }
                ctx.published_total
                    .fetch_add(report.published as u64, Ordering::Relaxed);
                // Per-key claims start at the head every time and keep no cursor.
                let ordered = held.is_some();
                if !ordered {
                    ctx.cursor.settled(&report).await;
                }
                let nack_pause = nacks.after(&report, &ctx.metrics.broker);
                if let Some(reason) = &report.broker_broken {
                    warn!(%reason, untouched = report.untouched, "broker connection failed mid-batch; reconnecting");
                    give_lanes_back(&mut db, lanes.as_mut(), &ctx.metrics);
                    if let Some(old) = broker.take() {
                        old.close().await;
                    }
                    pause(&ctx.shutdown, broker.next_delay()).await;
                } else if let Some(delay) = nack_pause {
                    pause(&ctx.shutdown, delay).await;
                } else if ordered && report.published + report.dead_lettered == 0 {
                    // Nothing moved: the lanes are empty, or all that is claimable is held
                    // back behind refused rows. Claiming again at once would only refuse them
                    // again; wait as an idle worker does.
                    idle(&ctx, &mut wake, seen_wake).await;
                } else if report.claimed == 0 && ctx.cursor.idle_after_empty_claim().await {
                    idle(&ctx, &mut wake, seen_wake).await;
                }
            }
            Err(BatchError::Database(e)) if behind_transaction_pooling(&e) => {
                warn!(error = %e, "batch rolled back: {TRANSACTION_POOLING}");
                ctx.cursor.reset().await;
                drop_database(&mut db, lanes.as_mut(), &ctx.metrics);
                pause(&ctx.shutdown, db.next_delay()).await;
            }
            Err(e) => {
                // The connection never serves another batch: whatever the error, it is dropped.
                let gone = match &e {
                    BatchError::Database(e) => server_gone(e),
                    BatchError::CommitTimeout(_) | BatchError::DatabaseTimeout(_) => {
                        Some("the server did not answer in time")
                    }
                };
                if gone.is_some() {
                    ctx.metrics.database_connections_discarded.inc();
                }
                let state = match gone {
                    Some(why) => format!("batch rolled back: {why} ({e}); reconnecting"),
                    None => format!("batch rolled back: {e}; reconnecting to PostgreSQL"),
                };
                if ctx.health.database_said().should_say(&state) {
                    warn!("{state}");
                }
                ctx.cursor.reset().await;
                drop_database(&mut db, lanes.as_mut(), &ctx.metrics);
                pause(&ctx.shutdown, db.next_delay()).await;
            }
        }
    }
    if let Some(publisher) = broker.take() {
        publisher.close().await;
    }
    if let Some(conn) = db.take() {
        let _ = conn.close().await;
    }
}

/// Drops the claim connection, and with it the lanes' advisory locks: their blocked keys are
/// no longer this process's to report.
fn drop_database(db: &mut Link<PgConnection>, lanes: Option<&mut Lanes>, metrics: &Metrics) {
    if let Some(lanes) = lanes {
        metrics.blocked_keys.release_lanes(&lanes.forget());
    }
    drop(db.take());
}

/// Lanes are advisory locks on the database session, which a broker outage leaves alive: kept
/// while this worker has no broker connection (closing the old one, backing off, a reconnect
/// that waits out a node's connect timeout again and again), they would hold every key of
/// theirs back from the workers that can still publish, another pod's. So they are given back,
/// with the session; the next balance after a connect takes this worker's share again. True
/// when there were lanes to give back.
fn give_lanes_back(
    db: &mut Link<PgConnection>,
    lanes: Option<&mut Lanes>,
    metrics: &Metrics,
) -> bool {
    let Some(lanes) = lanes.filter(|lanes| !lanes.held().is_empty()) else {
        return false;
    };
    info!(
        lanes = lanes.held().len(),
        "no broker connection: this worker's lanes go to the workers that have one"
    );
    drop_database(db, Some(lanes), metrics);
    true
}

/// A failed connect, said once for the process (not per worker), then once a minute with the
/// attempts that failed since (the metric counts each). A missing exchange is a fact the
/// broker stated, not an outage: its message says what to do instead of "cannot reach".
fn log_broker_failure<C: Connector>(ctx: &WorkerContext<C>, error: &ConnectError, delay: Duration) {
    let endpoint: &dyn Display = ctx.broker.endpoint();
    let Some(failed_since) = ctx
        .health
        .broker_said()
        .say(&format!("{endpoint}: {error}"))
    else {
        return;
    };
    let retry_in_ms = delay.as_millis();
    let reason = error.code();
    match error {
        ConnectError::ExchangeNotFound { .. } | ConnectError::AddressNotFound { .. } => {
            warn!(reason, failed_since, retry_in_ms, "{error}");
        }
        ConnectError::Refused { .. } => {
            warn!(%endpoint, reason, error = %error, failed_since, retry_in_ms, "the broker refused the connection; retrying");
        }
        ConnectError::Unavailable(_) => {
            warn!(%endpoint, reason, error = %error, failed_since, retry_in_ms, "cannot reach the broker; retrying");
        }
    }
}

/// Sleeps, but wakes at once on shutdown.
async fn pause(shutdown: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Waits for new rows: a NOTIFY (when listening), the poll interval, or shutdown. A NOTIFY that
/// arrived while the worker was claiming counts too, since it compares against `seen`.
async fn idle<C>(ctx: &WorkerContext<C>, wake: &mut watch::Receiver<u64>, seen: u64) {
    if *wake.borrow() != seen {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(ctx.poll_interval) => {}
        // Err means nobody can signal any more (listening is off): rely on the poll interval.
        Ok(()) = wake.changed() => {}
        _ = ctx.shutdown.cancelled() => {}
    }
}
