//! Opening PostgreSQL connections the way production needs them: libpq's multi-host URLs and
//! `target_session_attrs` (sqlx parses one host: launchbadge/sqlx#179), so a relay follows the
//! primary through a failover, the same for every command
//! and for the operator: libpq's `sslmode` meanings over rustls, a password read from a file
//! at each new connection (rotating cloud tokens), the session named `outbox-relay`, sqlx's
//! statement logging kept quiet, and failures said in words that name the setting to change.
//!
//! - [`target`]: what to connect to (the URL and an optional password file);
//! - [`options`]: the driver's options from the URL, the environment and the password (pure);
//! - [`session_attrs`]: libpq's `target_session_attrs`, which servers a session may use (pure);
//! - [`plan`]: the hosts of a libpq multi-host URL, each resolved, and how to choose (pure);
//! - [`failure`]: why a connect failed, and what fixes it;
//! - [`pool_mode`]: whether connections are sessions of their own or lent per transaction;
//! - [`session_bounds`]: what every session tells the server, so no claim outlives its relay;
//! - [`connect`](connect()): the attempt itself: the hosts in turn, each with a time limit and
//!   libpq's `allow` fallback, a server of the wrong kind closed before use.

pub mod failure;
pub mod options;
pub mod plan;
pub mod pool_mode;
pub mod session_attrs;
pub mod session_bounds;
pub mod target;

use rand::seq::SliceRandom;
use sqlx::postgres::PgSslMode;
use sqlx::{ConnectOptions, Connection, PgConnection, Row};

use crate::connect::tcp_keepalive;

use options::Resolved;
use plan::{Host, Plan};
use session_attrs::ServerRole;

pub use failure::{
    ConnectFailure, FailureKind, TRANSACTION_POOLING, behind_transaction_pooling, server_gone,
};
pub use options::APPLICATION_NAME;
pub use plan::Choice;
pub use pool_mode::PoolMode;
pub use session_attrs::SessionAttrs;
pub use session_bounds::SessionBounds;
pub use target::{DatabaseTarget, Pem, TlsMaterial};

/// The hosts of `target` and their options for new connections, its password file (if any)
/// read now, so a password rewritten since the last connection is the one used; the TLS files
/// checked, since the driver's own error does not say which file it could not read.
fn prepare(target: &DatabaseTarget) -> Result<Plan, ConnectFailure> {
    let password = match target.password_file() {
        Some(path) => Some(
            crate::connect::secret_file::read_password(path, "--database-password-file")
                .map_err(ConnectFailure::password_file)?,
        ),
        None => target.given_password().map(str::to_string),
    };
    let plan = plan::plan(target.url().expose(), password.as_deref(), target.tls())
        .map_err(ConnectFailure::settings)?;
    // Every host shares the URL's parameters, so the first host's files are everyone's.
    for (setting, path) in plan.hosts[0].resolved.files() {
        if let Err(e) = std::fs::File::open(path) {
            return Err(ConnectFailure::unreadable_file(setting, path, &e));
        }
    }
    Ok(plan)
}

/// Opens one connection to `target`: the first of its hosts, in the URL's order, whose server
/// is what `target_session_attrs` asks for (read-write unless the URL says otherwise). A
/// connection that reached another kind of server is closed before it is used.
pub async fn connect(target: &DatabaseTarget) -> Result<PgConnection, ConnectFailure> {
    connect_choosing(target, None).await.map(|(conn, _)| conn)
}

/// [`connect`], counting in `refusals` every connection closed because its server was of the
/// wrong kind (a standby where a primary is needed).
pub async fn connect_counted(
    target: &DatabaseTarget,
    refusals: &prometheus::IntCounter,
) -> Result<PgConnection, ConnectFailure> {
    connect_choosing(target, Some(refusals))
        .await
        .map(|(conn, _)| conn)
}

/// The walk over the hosts; also returns the options of the host chosen.
async fn connect_choosing(
    target: &DatabaseTarget,
    refusals: Option<&prometheus::IntCounter>,
) -> Result<(PgConnection, Resolved), ConnectFailure> {
    let plan = prepare(target)?;
    let mut order: Vec<&Host> = plan.hosts.iter().collect();
    if plan.random_order {
        order.shuffle(&mut rand::rng());
    }
    let mut failures = Vec::new();
    for &pass in plan.attrs.passes() {
        for host in &order {
            let attempt = connect_host(&host.resolved, target);
            let connected = match plan.connect_timeout {
                Some(limit) => match tokio::time::timeout(limit, attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(ConnectFailure::timed_out(&host.endpoint, limit)),
                },
                None => attempt.await,
            };
            let mut conn = match connected {
                Ok(conn) => {
                    // Before anything else is asked on it (see `tcp_keepalive`).
                    tcp_keepalive::arm_new_sockets();
                    conn
                }
                Err(e) => {
                    failures.push((host.endpoint.clone(), e));
                    continue;
                }
            };
            if !plan.attrs.asks_the_server() {
                return bound(conn, &host.resolved, target).await;
            }
            match server_role(&mut conn).await {
                Ok(role) if plan.attrs.accepts(role, pass) => {
                    return bound(conn, &host.resolved, target).await;
                }
                Ok(role) => {
                    if let Some(counter) = refusals {
                        counter.inc();
                    }
                    let _ = conn.close().await;
                    failures.push((
                        host.endpoint.clone(),
                        ConnectFailure::wrong_role(&host.endpoint, role, plan.attrs),
                    ));
                }
                Err(e) => failures.push((
                    host.endpoint.clone(),
                    ConnectFailure::classify(&e, &host.resolved, target),
                )),
            }
        }
    }
    Err(ConnectFailure::of_every_host(plan.attrs, failures))
}

/// The connection chosen, once the server knows its bounds (see [`SessionBounds`]).
async fn bound(
    mut conn: PgConnection,
    resolved: &Resolved,
    target: &DatabaseTarget,
) -> Result<(PgConnection, Resolved), ConnectFailure> {
    let startup_options = resolved.options.get_options();
    if let Err(e) = tell_bounds(&mut conn, target.session_bounds(), startup_options).await {
        let _ = conn.close().await;
        return Err(ConnectFailure::classify(&e, resolved, target));
    }
    Ok((conn, resolved.clone()))
}

/// Sets `bounds` on `conn`, in the simple protocol (one round trip), leaving out what the
/// startup options the driver sent (`options` of the URL, or `PGOPTIONS`) already set.
async fn tell_bounds(
    conn: &mut PgConnection,
    bounds: Option<&SessionBounds>,
    startup_options: Option<&str>,
) -> Result<(), sqlx::Error> {
    match bounds.and_then(|bounds| bounds.statement(startup_options)) {
        Some(statement) => sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(conn)
            .await
            .map(drop),
        None => Ok(()),
    }
}

/// One host, with libpq's `allow` fallback.
async fn connect_host(
    resolved: &Resolved,
    target: &DatabaseTarget,
) -> Result<PgConnection, ConnectFailure> {
    match resolved.options.connect().await {
        Err(e)
            if matches!(resolved.mode, PgSslMode::Allow) && failure::is_encryption_required(&e) =>
        {
            // libpq's `allow`: plaintext first, and TLS only when the server refuses plaintext.
            let encrypted = resolved.options.clone().ssl_mode(PgSslMode::Require);
            encrypted
                .connect()
                .await
                .map_err(|e| ConnectFailure::classify(&e, resolved, target))
        }
        other => other.map_err(|e| ConnectFailure::classify(&e, resolved, target)),
    }
}

/// What the server is, asked in the simple protocol (no named statement: a pooler in
/// transaction mode may hand the next statement to another session).
async fn server_role(conn: &mut PgConnection) -> Result<ServerRole, sqlx::Error> {
    let row = sqlx::raw_sql(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(ServerRole {
        in_recovery: row.try_get(0)?,
        read_only: row.try_get(1)?,
    })
}

/// A pool of one connection for `PgListener`, which needs a pool; the listener makes a new one
/// each time it reconnects, so the password file is read again then. The pool is bound to the
/// host [`connect`] chooses now; should that server become a standby later, LISTEN fails there
/// ("cannot execute LISTEN during recovery") and the listener makes a new pool.
pub async fn listener_pool(target: &DatabaseTarget) -> Result<sqlx::PgPool, ConnectFailure> {
    let (conn, resolved) = connect_choosing(target, None).await?;
    let _ = conn.close().await;
    let bounds = target.session_bounds().copied();
    let startup_options = resolved.options.get_options().map(str::to_string);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            tcp_keepalive::arm_new_sockets();
            let startup_options = startup_options.clone();
            Box::pin(
                async move { tell_bounds(conn, bounds.as_ref(), startup_options.as_deref()).await },
            )
        })
        .connect_with(resolved.options.clone())
        .await
        .map_err(|e| ConnectFailure::classify(&e, &resolved, target))
}

/// The way `target` chooses among its hosts; a setting it cannot read is named.
pub fn choice(target: &DatabaseTarget) -> Result<Choice, ConnectFailure> {
    plan::choice(target.url().expose()).map_err(ConnectFailure::settings)
}

/// Refuses a target whose `target_session_attrs` chooses sessions that cannot write, for the
/// commands that write (`run`, `migrate`, `seed`) and the operator.
pub fn require_writes(target: &DatabaseTarget) -> Result<(), String> {
    let choice = choice(target).map_err(|e| e.to_string())?;
    if choice.attrs.may_write() {
        return Ok(());
    }
    Err(format!(
        "sets target_session_attrs={}, but the relay writes to the outbox table: use read-write \
         (the default), primary or any",
        choice.attrs
    ))
}
