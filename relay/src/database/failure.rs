//! Why a connection to PostgreSQL failed, in words that name the setting that fixes it. The
//! driver's errors are sorted by cause: the TLS handshake (rustls' certificate errors), the
//! server's authentication (SQLSTATE 28P01 and 28000 with pg_hba's reason), the settings, the
//! network. No message carries a password or a file's content.

use rustls::CertificateError;
use sqlx::postgres::PgSslMode;

use super::options::{Resolved, RootCert, SettingsError, mode_name};
use super::session_attrs::{ServerRole, SessionAttrs};
use super::target::DatabaseTarget;
use crate::connect::certificate_dates::{self, Refusing};
use crate::connect::secret_file::PasswordFileError;

/// The cause, as a code a program can act on (the relay's `/readyz`, the operator's condition
/// reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A setting is wrong or a file it names cannot be read; retrying will not help.
    Settings,
    /// The TLS handshake failed: trust, host name, expiry, client certificate, or no TLS.
    Tls,
    /// The server refused the login: password, pg_hba rule, certificate user.
    Auth,
    /// The server could not be reached or went away: an outage, retried.
    Unreachable,
    /// Every server reached is of the wrong kind for `target_session_attrs`: a read-only
    /// standby where a primary is needed (a failover under way, a replica's URL, stale DNS).
    ReadOnly,
    /// Anything else the server said (e.g. the database does not exist).
    Other,
}

impl FailureKind {
    /// The condition reason / problem code.
    pub fn code(self) -> &'static str {
        match self {
            FailureKind::Settings => "DatabaseSettings",
            FailureKind::Tls => "DatabaseTLS",
            FailureKind::Auth => "DatabaseAuth",
            FailureKind::Unreachable => "DatabaseUnreachable",
            FailureKind::ReadOnly => "DatabaseReadOnly",
            FailureKind::Other => "DatabaseError",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConnectFailure {
    pub kind: FailureKind,
    pub message: String,
}

impl ConnectFailure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The message starts with `--database-password-file`; the environment variable and the
    /// YAML key that set the same option are named after it.
    pub fn password_file(e: PasswordFileError) -> Self {
        Self::new(
            FailureKind::Settings,
            format!("{e} (env DATABASE_PASSWORD_FILE, YAML database_password_file)"),
        )
    }

    pub fn settings(e: SettingsError) -> Self {
        Self::new(FailureKind::Settings, format!("database URL: {e}"))
    }

    /// A file named by `setting` cannot be read.
    pub fn unreadable_file(setting: &str, path: &str, e: &std::io::Error) -> Self {
        Self::new(
            FailureKind::Settings,
            format!("cannot read {setting} file {path}: {}", e.kind()),
        )
    }

    /// A server was reached, and it is not what `attrs` asks for.
    pub fn wrong_role(endpoint: &str, role: ServerRole, attrs: SessionAttrs) -> Self {
        Self::new(
            FailureKind::ReadOnly,
            format!(
                "{endpoint} is {}, and target_session_attrs={attrs} needs {}",
                role.describe(),
                match attrs {
                    SessionAttrs::ReadOnly => "a read-only session",
                    SessionAttrs::Standby => "a standby",
                    SessionAttrs::Primary => "a primary",
                    _ => "a primary accepting writes",
                }
            ),
        )
    }

    /// `connect_timeout` passed before `endpoint` accepted the connection.
    pub fn timed_out(endpoint: &str, after: std::time::Duration) -> Self {
        Self::new(
            FailureKind::Unreachable,
            format!(
                "{endpoint} did not accept a connection within {}s (connect_timeout)",
                after.as_secs()
            ),
        )
    }

    /// Every host of a multi-host URL failed: the most actionable cause names the kind (a
    /// setting, TLS or a login before a standby, before an outage), and every host is told.
    pub fn of_every_host(attrs: SessionAttrs, mut failures: Vec<(String, ConnectFailure)>) -> Self {
        if failures.len() == 1 {
            return failures.remove(0).1;
        }
        let rank = |kind: FailureKind| match kind {
            FailureKind::Settings => 0,
            FailureKind::Tls => 1,
            FailureKind::Auth => 2,
            FailureKind::ReadOnly => 3,
            FailureKind::Other => 4,
            FailureKind::Unreachable => 5,
        };
        let kind = failures
            .iter()
            .map(|(_, f)| f.kind)
            .min_by_key(|kind| rank(*kind))
            .unwrap_or(FailureKind::Unreachable);
        let each: Vec<String> = failures
            .into_iter()
            .map(|(endpoint, f)| {
                if f.message.starts_with(&endpoint) {
                    f.message
                } else {
                    format!("{endpoint}: {}", f.message)
                }
            })
            .collect();
        Self::new(
            kind,
            format!(
                "no host gave a session that target_session_attrs={attrs} accepts: {}",
                each.join("; ")
            ),
        )
    }

    /// Sorts a driver error by cause.
    pub fn classify(e: &sqlx::Error, resolved: &Resolved, target: &DatabaseTarget) -> Self {
        if let Some(tls) = rustls_error(e) {
            return tls_failure(tls, resolved);
        }
        match e {
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                auth_failure(&code, db.message(), resolved, target).unwrap_or_else(|| {
                    Self::new(
                        FailureKind::Other,
                        format!("PostgreSQL refused the connection: {}", db.message()),
                    )
                })
            }
            sqlx::Error::Tls(inner) if inner.to_string().contains("does not support TLS") => {
                Self::new(
                    FailureKind::Tls,
                    format!(
                        "the server does not offer TLS, but sslmode={} requires it: turn ssl on in \
                         the server, or (on a trusted network only) set sslmode=prefer",
                        mode_name(resolved.mode)
                    ),
                )
            }
            sqlx::Error::Tls(inner) => Self::new(
                FailureKind::Tls,
                format!("TLS with the database failed: {inner}"),
            ),
            sqlx::Error::Configuration(inner) => Self::new(
                FailureKind::Settings,
                format!("database TLS files (sslrootcert, sslcert, sslkey): {inner}"),
            ),
            sqlx::Error::Io(io) => Self::new(
                FailureKind::Unreachable,
                format!("cannot reach PostgreSQL at {}: {io}", resolved.host),
            ),
            other => Self::new(FailureKind::Unreachable, other.to_string()),
        }
    }
}

/// What to do when [`behind_transaction_pooling`] says so: the relay was told (or left to
/// assume) it has a session of its own, and it has not.
pub const TRANSACTION_POOLING: &str = "this looks like a pooler in transaction mode (PgBouncer \
     pool_mode = transaction), but the relay was told its connections are sessions of their own \
     (--database-pool-mode session, the default), so it sent named prepared statements, which \
     such a pooler mixes up between clients: set --database-pool-mode transaction \
     (DATABASE_POOL_MODE, or database_pool_mode in the file), and give --session-database-url \
     (a direct or session-pooled URL) for per-key ordering, LISTEN and migrate \
     (docs/connecting-securely.md, \"Behind a connection pooler\")";

/// True when the driver's own named prepared statements collide or vanish: what happens when a
/// pooler in transaction mode hands one server session to many clients (or another to the same
/// client), and on a direct connection never.
pub fn behind_transaction_pooling(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("42P05" | "26000"))
            && db.message().contains("\"sqlx_s_"))
}

/// Why a connection that served statements must not serve another, in words, when the server
/// said it is going away or has become a standby (after a failover, the old primary's pooled
/// connections answer 25006 while a ping still succeeds); `None` for errors of one statement.
pub fn server_gone(e: &sqlx::Error) -> Option<&'static str> {
    match e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("25006") => Some("the server has become a read-only standby (SQLSTATE 25006)"),
            Some("57P01") => Some("the server is shutting down (SQLSTATE 57P01, admin_shutdown)"),
            Some("57P02") => Some("the server crashed (SQLSTATE 57P02, crash_shutdown)"),
            Some("57P03") => Some(
                "the server is starting up or in recovery (SQLSTATE 57P03, cannot_connect_now)",
            ),
            _ => None,
        },
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => Some("the connection was lost"),
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => Some("the connection was lost"),
        _ => None,
    }
}

/// True when the server refused an unencrypted connection that TLS would have let in (pg_hba's
/// `hostssl`): what libpq's `allow` retries with TLS.
pub fn is_encryption_required(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if refused_without_encryption(db.code().as_deref().unwrap_or_default(), db.message()))
}

/// pg_hba's refusal of a connection that only a `hostssl` rule would let in: SQLSTATE 28000
/// (invalid_authorization_specification) with "no encryption" in PostgreSQL's message.
fn refused_without_encryption(code: &str, server_says: &str) -> bool {
    code == "28000" && server_says.contains("no encryption")
}

fn rustls_error(e: &sqlx::Error) -> Option<&rustls::Error> {
    match e {
        sqlx::Error::Tls(inner) => inner.downcast_ref::<rustls::Error>().or_else(|| {
            inner
                .source()
                .and_then(|s| s.downcast_ref::<rustls::Error>())
        }),
        sqlx::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        _ => None,
    }
}

fn trust_hint(resolved: &Resolved) -> String {
    match &resolved.root_cert {
        RootCert::File(path) => format!(
            "sslrootcert {path} is not the CA that signed it: give the server's CA with \
             sslrootcert=FILE in the URL (or PGSSLROOTCERT)"
        ),
        RootCert::Given(origin) => {
            format!("the CA in {origin} is not the CA that signed it: put the server's CA there")
        }
        RootCert::System | RootCert::Default => "the system's CA store does not hold its CA: give \
             the server's CA with sslrootcert=FILE in the URL (or PGSSLROOTCERT)"
            .into(),
    }
}

fn tls_failure(e: &rustls::Error, resolved: &Resolved) -> ConnectFailure {
    let host = &resolved.host;
    let message = match e {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("the database server's certificate is not trusted: {}", trust_hint(resolved))
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the database server's certificate is not valid for the host name {host}: \
                     connect by a name the certificate lists, or set sslmode=verify-ca to check \
                     the CA only"
                )
            }
            other => {
                let checked_by = format!("sslmode={}", mode_name(resolved.mode));
                let dates = Refusing {
                    whose: "the database server's",
                    host,
                    checked_by: &checked_by,
                    renew: "the server's certificate (ssl_cert_file in postgresql.conf)",
                };
                certificate_dates::problem(other, &dates).unwrap_or_else(|| {
                    format!(
                        "the database server's certificate was refused ({other:?}): {}",
                        trust_hint(resolved)
                    )
                })
            }
        },
        rustls::Error::InconsistentKeys(_) => {
            "sslkey is not the private key of sslcert: give the key that belongs to the client certificate".into()
        }
        rustls::Error::AlertReceived(alert) if resolved.client_certificate => format!(
            "the database server refused the client certificate ({alert:?}): check that sslcert \
             is signed by a CA the server trusts (ssl_ca_file) and sslkey belongs to it"
        ),
        rustls::Error::AlertReceived(alert) => format!(
            "the database server ended the TLS handshake ({alert:?}); if it asks for a client \
             certificate, give sslcert and sslkey"
        ),
        other => format!("TLS with the database failed: {other}"),
    };
    ConnectFailure::new(FailureKind::Tls, message)
}

fn auth_failure(
    code: &str,
    server_says: &str,
    resolved: &Resolved,
    target: &DatabaseTarget,
) -> Option<ConnectFailure> {
    let user = &resolved.user;
    let message = match code {
        // invalid_password: also what md5 and SCRAM answer for a wrong password.
        "28P01" => match target.password_origin() {
            Some(origin) => format!(
                "password authentication failed for user {user}: the password in {origin} is not \
                 the one the server has (rotated on one side only?)"
            ),
            None if !resolved.password_given => format!(
                "password authentication failed for user {user}: the server asks for a password \
                 and none was given: put it in the URL (percent-encoded) or in a file named by \
                 --database-password-file"
            ),
            None => format!(
                "password authentication failed for user {user}: check the URL's password \
                 (percent-encode @ : / % ? # and spaces), or keep it in a file named by \
                 --database-password-file"
            ),
        },
        _ if refused_without_encryption(code, server_says) => format!(
            "the server accepts user {user} only over TLS (pg_hba.conf: hostssl), and sslmode={} \
             connected without it: set sslmode=verify-full with sslrootcert=FILE (or require)",
            mode_name(resolved.mode)
        ),
        "28000" if server_says.contains("certificate") => format!(
            "certificate authentication failed for user {user}: the client certificate's common \
             name must be the user name (sslcert), or the server maps it (pg_ident.conf)"
        ),
        "28000" if matches!(resolved.mode, PgSslMode::Disable | PgSslMode::Allow) => {
            format!(
                "the server refused user {user} ({server_says}); if it wants TLS, set sslmode=require or stronger"
            )
        }
        "28000" => format!(
            "the server's pg_hba.conf lets user {user} in from nowhere this connection matches \
             ({server_says}): ask the database administrator for a rule"
        ),
        _ => return None,
    };
    Some(ConnectFailure::new(FailureKind::Auth, message))
}
