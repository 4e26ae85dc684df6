//! The driver's options for one connection: sqlx reads the URL's parameters and libpq's
//! environment (`PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, …); this adds what sqlx
//! does differently from libpq, so `sslmode` and `sslrootcert` mean what PostgreSQL's own
//! documentation says:
//!
//! - `sslrootcert=system` (libpq 16) trusts the operating system's CA store, and then only
//!   `sslmode=verify-full` is allowed (the default becomes verify-full);
//! - `sslmode=require` with a root certificate file verifies the chain, as `verify-ca` does;
//! - `allow` is handled by the caller, which retries with TLS when plaintext is refused.

use std::str::FromStr;
use std::time::Duration;

use log::LevelFilter;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::target::TlsMaterial;

pub const APPLICATION_NAME: &str = "outbox-relay";

/// A statement slower than this is logged by sqlx, at debug level only: a concurrent index
/// build or a capped count is expected to take seconds, and the relay says itself, with the
/// table and the stage, when a claim or a settle is slow.
const SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// Where the server's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// No `sslrootcert`: the system's CA store.
    Default,
    /// `sslrootcert=system`.
    System,
    /// A CA file (added to the system's store: see docs/connecting-securely.md).
    File(String),
    /// A CA held in memory (the operator's, from a Secret or ConfigMap), named by its origin.
    Given(String),
}

/// The options and the facts a failure message needs. Its `Debug` leaves the options out: the
/// driver's own `Debug` prints the password.
#[derive(Clone)]
pub struct Resolved {
    pub options: PgConnectOptions,
    pub mode: PgSslMode,
    pub root_cert: RootCert,
    /// The client certificate and key files (`sslcert`, `sslkey`), when given.
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
    /// A client certificate is offered, from files or from memory.
    pub client_certificate: bool,
    pub host: String,
    pub user: String,
    /// A password came from the URL or a password file (not `PGPASSWORD` alone).
    pub password_given: bool,
}

/// A combination of settings PostgreSQL's client would refuse. Never holds the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "sslrootcert=system trusts every CA of the system's store, so only sslmode=verify-full \
         is allowed with it (as libpq does); sslmode is {mode}: set sslmode=verify-full, or give \
         sslrootcert the CA file of your server"
    )]
    WeakModeWithSystemRoots { mode: String },
    #[error(
        "sslmode {value:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
    )]
    UnknownMode { value: String },
    #[error("the URL's parameters are not valid: {reason}")]
    Invalid { reason: String },
    #[error("{0}")]
    SessionAttrs(#[from] super::session_attrs::UnknownAttrs),
    #[error("connect_timeout {value:?} is not a whole number of seconds (0: no limit)")]
    ConnectTimeout { value: String },
    #[error("load_balance_hosts {value:?} is not one of disable, random")]
    LoadBalanceHosts { value: String },
}

/// `url` as options, with `password` (from a password file) in place of the URL's, and `tls`
/// (settings held in memory) where the URL sets nothing, ahead of libpq's environment.
pub fn resolve(
    url: &str,
    password: Option<&str>,
    tls: Option<&TlsMaterial>,
) -> Result<Resolved, SettingsError> {
    let parsed = url::Url::parse(url).map_err(|e| SettingsError::Invalid {
        reason: e.to_string(),
    })?;
    let param = |names: &[&str]| {
        parsed
            .query_pairs()
            .filter(|(key, _)| names.contains(&key.as_ref()))
            .map(|(_, value)| value.into_owned())
            .last()
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let given_mode = tls.map(|tls| mode_name(tls.mode).to_string());
    let mode_text = param(&["sslmode", "ssl-mode"])
        .or(given_mode)
        .or_else(|| env("PGSSLMODE"));
    let given_root = tls.map(|tls| match (&tls.ca, tls.mode) {
        (Some(pem), _) => pem.origin.clone(),
        (None, PgSslMode::VerifyFull) => "system".to_string(),
        // Nothing to verify against, and a mode that does not ask for it.
        (None, _) => String::new(),
    });
    let root_text = param(&["sslrootcert", "ssl-root-cert", "ssl-ca"])
        .or(given_root.filter(|root| !root.is_empty()))
        .or_else(|| env("PGSSLROOTCERT"));
    let explicit_mode = match &mode_text {
        Some(text) => Some(
            PgSslMode::from_str(text).map_err(|_| SettingsError::UnknownMode {
                value: text.clone(),
            })?,
        ),
        None => None,
    };
    let given_ca = tls.and_then(|tls| tls.ca.as_ref());
    let root_cert = match root_text.as_deref() {
        None => RootCert::Default,
        Some("system") => RootCert::System,
        Some(origin) if given_ca.is_some_and(|pem| pem.origin == origin) => {
            RootCert::Given(origin.to_string())
        }
        Some(path) => RootCert::File(path.to_string()),
    };

    // sqlx would read `system` as a file name; the parameter is removed and set below.
    let mut for_driver = parsed.clone();
    let kept: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(key, value)| {
            !(matches!(key.as_ref(), "sslrootcert" | "ssl-root-cert" | "ssl-ca")
                && value == "system")
        })
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        for_driver.set_query(None);
    } else {
        for_driver.query_pairs_mut().clear().extend_pairs(kept);
    }
    let mut options =
        PgConnectOptions::from_str(for_driver.as_str()).map_err(|e| SettingsError::Invalid {
            reason: e.to_string(),
        })?;

    let mode = match (&root_cert, explicit_mode) {
        (RootCert::System, None | Some(PgSslMode::VerifyFull)) => PgSslMode::VerifyFull,
        (RootCert::System, Some(weaker)) => {
            return Err(SettingsError::WeakModeWithSystemRoots {
                mode: mode_name(weaker).into(),
            });
        }
        (RootCert::File(_) | RootCert::Given(_), Some(PgSslMode::Require)) => PgSslMode::VerifyCa,
        (_, Some(mode)) => mode,
        (_, None) => PgSslMode::Prefer,
    };
    options = options.ssl_mode(mode);
    if root_cert == RootCert::System {
        // An empty PEM adds nothing to the system's store, which is what `system` asks for; it
        // also overrides a PGSSLROOTCERT=system that sqlx took for a file name.
        options = options.ssl_root_cert_from_pem(Vec::new());
    }
    if let (RootCert::Given(_), Some(pem)) = (&root_cert, given_ca) {
        options = options.ssl_root_cert_from_pem(pem.bytes.clone());
    }
    if let Some(password) = password {
        options = options.password(password);
    }
    if options.get_application_name().is_none() {
        options = options.application_name(APPLICATION_NAME);
    }
    options = options
        .log_statements(LevelFilter::Trace)
        .log_slow_statements(LevelFilter::Debug, SLOW_STATEMENT);

    let mut client_cert = param(&["sslcert", "ssl-cert"]);
    let mut client_key = param(&["sslkey", "ssl-key"]);
    let given_client = tls.and_then(|tls| tls.client.as_ref());
    match given_client {
        Some((cert, key)) if client_cert.is_none() && client_key.is_none() => {
            options = options
                .ssl_client_cert_from_pem(&cert.bytes)
                .ssl_client_key_from_pem(&key.bytes);
        }
        _ => {
            client_cert = client_cert.or_else(|| env("PGSSLCERT"));
            client_key = client_key.or_else(|| env("PGSSLKEY"));
        }
    }
    Ok(Resolved {
        client_certificate: client_cert.is_some() || given_client.is_some(),
        host: options.get_host().to_string(),
        user: options.get_username().to_string(),
        password_given: password.is_some() || parsed.password().is_some(),
        options,
        mode,
        root_cert,
        client_cert,
        client_key,
    })
}

impl Resolved {
    /// The files the TLS set-up reads, each with the setting that names it.
    pub fn files(&self) -> Vec<(&'static str, &str)> {
        let mut files = Vec::new();
        if let RootCert::File(path) = &self.root_cert {
            files.push(("sslrootcert", path.as_str()));
        }
        if let Some(path) = &self.client_cert {
            files.push(("sslcert", path.as_str()));
        }
        if let Some(path) = &self.client_key {
            files.push(("sslkey", path.as_str()));
        }
        files
    }
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("mode", &mode_name(self.mode))
            .field("root_cert", &self.root_cert)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("host", &self.host)
            .field("user", &self.user)
            .field("password_given", &self.password_given)
            .finish_non_exhaustive()
    }
}

pub fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(url: &str) -> Result<&'static str, SettingsError> {
        resolve(url, None, None).map(|r| mode_name(r.mode))
    }

    #[test]
    fn sslmode_keeps_libpq_meanings() {
        let base = "postgres://app@db.example:5432/orders";
        for (query, want) in [
            ("", "prefer"),
            ("?sslmode=disable", "disable"),
            ("?sslmode=allow", "allow"),
            ("?sslmode=require", "require"),
            ("?sslmode=verify-ca", "verify-ca"),
            ("?sslmode=verify-full", "verify-full"),
            // A CA file turns require into a verified chain, as libpq documents.
            ("?sslmode=require&sslrootcert=/ca.pem", "verify-ca"),
            ("?sslrootcert=system", "verify-full"),
            ("?sslrootcert=system&sslmode=verify-full", "verify-full"),
        ] {
            assert_eq!(mode_of(&format!("{base}{query}")).unwrap(), want, "{query}");
        }
    }

    #[test]
    fn system_roots_refuse_weaker_modes_naming_the_fix() {
        let err = mode_of("postgres://app@db/x?sslrootcert=system&sslmode=require").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("sslmode=verify-full"), "{text}");
        assert!(text.contains("require"), "{text}");
        let err = mode_of("postgres://app@db/x?sslmode=strict").unwrap_err();
        assert!(err.to_string().contains("\"strict\""), "{err}");
    }

    #[test]
    fn system_is_not_taken_for_a_file_and_other_parameters_stay() {
        let r = resolve(
            "postgres://app@db/x?sslrootcert=system&application_name=billing",
            None,
            None,
        )
        .unwrap();
        assert_eq!(r.root_cert, RootCert::System);
        assert_eq!(r.options.get_application_name(), Some("billing"));
        let r = resolve("postgres://app@db/x?sslrootcert=/etc/ca.pem", None, None).unwrap();
        assert_eq!(r.root_cert, RootCert::File("/etc/ca.pem".into()));
    }

    fn given(mode: PgSslMode, ca: bool) -> TlsMaterial {
        let pem = |origin: &str| super::super::target::Pem {
            bytes: b"-----BEGIN CERTIFICATE-----".to_vec(),
            origin: origin.into(),
        };
        TlsMaterial {
            mode,
            ca: ca.then(|| pem("Secret db-ca, key ca.crt")),
            client: Some((pem("Secret c, key tls.crt"), pem("Secret c, key tls.key"))),
        }
    }

    #[test]
    fn material_in_memory_stands_for_the_environment_and_loses_to_the_url() {
        let url = "postgres://app@db/x";
        let r = resolve(url, None, Some(&given(PgSslMode::VerifyFull, true))).unwrap();
        assert_eq!(mode_name(r.mode), "verify-full");
        assert_eq!(
            r.root_cert,
            RootCert::Given("Secret db-ca, key ca.crt".into())
        );
        assert!(r.client_certificate);
        // Nothing in memory is a file to open.
        assert!(r.files().is_empty(), "{:?}", r.files());
        // verify-full without a CA: the system's store, as sslrootcert=system.
        let r = resolve(url, None, Some(&given(PgSslMode::VerifyFull, false))).unwrap();
        assert_eq!(r.root_cert, RootCert::System);
        // require with a CA verifies the chain, as with a file.
        let r = resolve(url, None, Some(&given(PgSslMode::Require, true))).unwrap();
        assert_eq!(mode_name(r.mode), "verify-ca");
        let r = resolve(url, None, Some(&given(PgSslMode::Prefer, false))).unwrap();
        assert_eq!(r.root_cert, RootCert::Default);
        let r = resolve(
            "postgres://app@db/x?sslmode=disable",
            None,
            Some(&given(PgSslMode::VerifyFull, true)),
        )
        .unwrap();
        assert_eq!(mode_name(r.mode), "disable");
    }

    #[test]
    fn the_session_is_named_unless_the_url_names_it() {
        let r = resolve("postgres://app@db/x", None, None).unwrap();
        assert_eq!(r.options.get_application_name(), Some(APPLICATION_NAME));
    }

    #[test]
    fn a_password_file_wins_and_is_never_shown() {
        let r = resolve("postgres://app:old@db/x", Some("n3w-t0ken"), None).unwrap();
        assert!(r.password_given);
        assert!(!format!("{r:?}").contains("n3w-t0ken"));
        let r = resolve("postgres://app@db/x", None, None).unwrap();
        assert!(!r.password_given);
    }
}
