//! What a relay connects to: the URL, where the password comes from when it is kept out of the
//! URL, and TLS material held in memory (the operator's case: it reads them from Secrets).

use std::fmt;
use std::path::{Path, PathBuf};

use sqlx::postgres::PgSslMode;

use super::session_bounds::SessionBounds;
use crate::connect::secret_url::SecretUrl;

/// A PostgreSQL endpoint. Shows as the redacted URL; the password file's path and the names of
/// the Secrets the material came from are not secret, their contents are never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseTarget {
    url: SecretUrl,
    password: Password,
    tls: Option<TlsMaterial>,
    /// Told to the server by every new session; None under a transaction pool, where a `SET`
    /// would stay on a server session other clients get next.
    bounds: Option<SessionBounds>,
}

/// Where the password comes from.
#[derive(Clone, PartialEq, Eq)]
enum Password {
    /// In the URL, or none at all.
    InUrl,
    /// A file read at every new connection (a rotating token).
    File(PathBuf),
    /// Held in memory, with a description of where it was read (e.g. a Secret's key).
    Given { value: String, origin: String },
}

/// A certificate or key in PEM form, with where it was read, for messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    pub bytes: Vec<u8>,
    /// E.g. `Secret orders-db-ca, key ca.crt`.
    pub origin: String,
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A private key's bytes must never reach a log line.
        write!(f, "Pem({})", self.origin)
    }
}

/// TLS settings given apart from the URL, in memory: what the operator has once it read the
/// Secrets and ConfigMaps of `spec.database.tls`. They stand for libpq's `PGSSLMODE`,
/// `PGSSLROOTCERT` and `PGSSLCERT`/`PGSSLKEY`, which the relay pods get for the same settings,
/// so the operator and its pods connect alike. Like those variables they lose to the URL's own
/// parameters (the operator refuses a URL that sets both).
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    pub mode: PgSslMode,
    /// The CA to verify the server against. `None` with `verify-full`: the system's store (as
    /// `sslrootcert=system`).
    pub ca: Option<Pem>,
    /// A client certificate and its key.
    pub client: Option<(Pem, Pem)>,
}

impl DatabaseTarget {
    pub fn new(url: SecretUrl, password_file: Option<PathBuf>) -> Self {
        let password = password_file.map_or(Password::InUrl, Password::File);
        Self {
            url,
            password,
            tls: None,
            bounds: Some(SessionBounds::default()),
        }
    }

    /// A target whose password, if any, is in the URL.
    pub fn from_url(url: SecretUrl) -> Self {
        Self::new(url, None)
    }

    /// The same target with `password` (read from `origin`) in place of the URL's.
    pub fn with_password(mut self, password: String, origin: String) -> Self {
        self.password = Password::Given {
            value: password,
            origin,
        };
        self
    }

    /// The same target with TLS settings held in memory.
    pub fn with_tls(mut self, tls: TlsMaterial) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same target with other session bounds; None sends none (a transaction pool).
    pub fn with_session_bounds(mut self, bounds: Option<SessionBounds>) -> Self {
        self.bounds = bounds;
        self
    }

    /// What every new session tells the server (see [`SessionBounds`]).
    pub fn session_bounds(&self) -> Option<&SessionBounds> {
        self.bounds.as_ref()
    }

    pub fn url(&self) -> &SecretUrl {
        &self.url
    }

    /// A file holding the password, read at every new connection; it wins over a password in
    /// the URL.
    pub fn password_file(&self) -> Option<&Path> {
        match &self.password {
            Password::File(path) => Some(path),
            _ => None,
        }
    }

    /// A password held in memory, if one was given.
    pub fn given_password(&self) -> Option<&str> {
        match &self.password {
            Password::Given { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Where a password kept out of the URL comes from, in words for a message.
    pub fn password_origin(&self) -> Option<String> {
        match &self.password {
            Password::InUrl => None,
            Password::File(path) => Some(path.display().to_string()),
            Password::Given { origin, .. } => Some(origin.clone()),
        }
    }

    pub fn tls(&self) -> Option<&TlsMaterial> {
        self.tls.as_ref()
    }
}

impl PartialEq for TlsMaterial {
    fn eq(&self, other: &Self) -> bool {
        // The driver's mode type has no equality of its own; it is a plain enum.
        std::mem::discriminant(&self.mode) == std::mem::discriminant(&other.mode)
            && self.ca == other.ca
            && self.client == other.client
    }
}

impl Eq for TlsMaterial {}

impl fmt::Display for DatabaseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.url, f)
    }
}

impl fmt::Debug for DatabaseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseTarget")
            .field("url", &self.url)
            .field("password", &self.password_origin())
            .field("tls", &self.tls)
            .field("bounds", &self.bounds)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::secret_url::UrlKind;

    #[test]
    fn debug_shows_origins_and_never_secrets() {
        let url = SecretUrl::parse("postgres://app:url-pw@db/x", UrlKind::Postgres).unwrap();
        let target = DatabaseTarget::from_url(url)
            .with_password("s3cret-token".into(), "Secret db-pw, key password".into())
            .with_tls(TlsMaterial {
                mode: PgSslMode::VerifyFull,
                ca: None,
                client: Some((
                    Pem {
                        bytes: b"CERT".to_vec(),
                        origin: "Secret client, key tls.crt".into(),
                    },
                    Pem {
                        bytes: b"PRIVATE KEY BYTES".to_vec(),
                        origin: "Secret client, key tls.key".into(),
                    },
                )),
            });
        let shown = format!("{target:?}");
        for secret in ["s3cret-token", "url-pw", "PRIVATE KEY BYTES"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("Secret db-pw, key password"), "{shown}");
        assert!(shown.contains("Secret client, key tls.key"), "{shown}");
    }
}
