//! Opening PostgreSQL connections the way production needs them, the same for every command
//! and for the operator: libpq's `sslmode` meanings over rustls, a password read from a file
//! at each new connection (rotating cloud tokens), the session named `outbox-relay`, sqlx's
//! statement logging kept quiet, and failures said in words that name the setting to change.
//!
//! - [`target`]: what to connect to (the URL and an optional password file);
//! - [`options`]: the driver's options from the URL, the environment and the password (pure);
//! - [`failure`]: why a connect failed, and what fixes it;
//! - [`pool_mode`]: whether connections are sessions of their own or lent per transaction;
//! - [`connect`](connect()): the attempt itself, with libpq's `allow` fallback.

pub mod failure;
pub mod options;
pub mod pool_mode;
pub mod target;

use sqlx::postgres::PgSslMode;
use sqlx::{ConnectOptions, PgConnection};

pub use failure::{ConnectFailure, FailureKind, TRANSACTION_POOLING, behind_transaction_pooling};
pub use options::APPLICATION_NAME;
pub use pool_mode::PoolMode;
pub use target::{DatabaseTarget, Pem, TlsMaterial};

/// The options for a new connection to `target`, its password file (if any) read now, so a
/// password rewritten since the last connection is the one used; the TLS files checked, since
/// the driver's own error does not say which file it could not read.
fn prepare(target: &DatabaseTarget) -> Result<options::Resolved, ConnectFailure> {
    let password = match target.password_file() {
        Some(path) => Some(
            crate::secret_file::read_password(path, "--database-password-file")
                .map_err(ConnectFailure::password_file)?,
        ),
        None => target.given_password().map(str::to_string),
    };
    let resolved = options::resolve(target.url().expose(), password.as_deref(), target.tls())
        .map_err(ConnectFailure::settings)?;
    for (setting, path) in resolved.files() {
        if let Err(e) = std::fs::File::open(path) {
            return Err(ConnectFailure::unreadable_file(setting, path, &e));
        }
    }
    Ok(resolved)
}

/// Opens one connection to `target`.
pub async fn connect(target: &DatabaseTarget) -> Result<PgConnection, ConnectFailure> {
    let resolved = prepare(target)?;
    match resolved.options.connect().await {
        Err(e)
            if matches!(resolved.mode, PgSslMode::Allow) && failure::is_encryption_required(&e) =>
        {
            // libpq's `allow`: plaintext first, and TLS only when the server refuses plaintext.
            let encrypted = resolved.options.clone().ssl_mode(PgSslMode::Require);
            encrypted
                .connect()
                .await
                .map_err(|e| ConnectFailure::classify(&e, &resolved, target))
        }
        other => other.map_err(|e| ConnectFailure::classify(&e, &resolved, target)),
    }
}

/// A pool of one connection for `PgListener`, which needs a pool; the listener makes a new one
/// each time it reconnects, so the password file is read again then.
pub async fn listener_pool(target: &DatabaseTarget) -> Result<sqlx::PgPool, ConnectFailure> {
    let resolved = prepare(target)?;
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(resolved.options.clone())
        .await
        .map_err(|e| ConnectFailure::classify(&e, &resolved, target))
}
