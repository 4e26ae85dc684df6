//! The options of every command that touches the outbox table (migrate, lag, seed, run,
//! replay, dead-letters), resolved into a [`TableConfig`]: the database (its URL, password
//! file, pool mode, the session URL under a transaction pool, the bounds every session sets)
//! and the table (its name, column mapping, delivery mode and ordering, the relay's name).

use std::time::Duration;

use super::file::FileConfig;
use super::flags::TableArgs;
use super::layering::{duration, layer, load_file};
use super::parse::ConfigError;
use crate::connect::secret_url::{SecretUrl, UrlKind};
use crate::database::{DatabaseTarget, PoolMode, SessionBounds};
use crate::defaults;
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
    pub(super) fn with_idle_in_transaction(mut self, idle: Duration) -> Self {
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

/// Resolves the table options (for migrate, lag, seed and run).
pub fn resolve_table(args: &TableArgs) -> Result<TableConfig, ConfigError> {
    let file = load_file(args)?;
    resolve_table_with(args, &file)
}

pub(super) fn resolve_table_with(
    args: &TableArgs,
    file: &FileConfig,
) -> Result<TableConfig, ConfigError> {
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
