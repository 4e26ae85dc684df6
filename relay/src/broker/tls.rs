//! The broker connection's TLS and credentials beyond the URL: a CA file to trust (a private or
//! cert-manager CA) added to the system's store, a client certificate and key (for RabbitMQ's
//! certificate login, `?auth_mechanism=external` in the URL), and a password file read at each
//! connect, as for PostgreSQL. Files are read when a connection is opened, never cached, so a
//! renewed certificate or a rotated password needs no restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{ConnectError, Refusal};
use crate::connect::certificate_dates::{self, Refusing};
use crate::connect::secret_file::read_password;
use crate::connect::secret_url::{SecretUrl, UrlKind};

pub(super) fn refused(kind: Refusal, message: impl Into<String>) -> ConnectError {
    ConnectError::Refused {
        kind,
        message: message.into(),
    }
}

/// The files of the broker's TLS set-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerTls {
    /// PEM CA certificates trusted besides the system's store.
    pub ca_file: Option<PathBuf>,
    /// The client certificate and its key, which only work together.
    pub client: Option<ClientCert>,
}

/// A PEM client certificate (chain) and its PKCS#8 key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A client certificate given without its key, or a key without its certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--broker-client-cert and --broker-client-key go together (env BROKER_CLIENT_CERT and \
     BROKER_CLIENT_KEY, YAML broker_client_cert and broker_client_key): {given} is set and \
     {missing} is not; set both, or neither"
)]
pub struct UnpairedClientCert {
    /// The one of the two that is set, e.g. "--broker-client-cert".
    pub given: &'static str,
    /// The other one.
    pub missing: &'static str,
}

impl BrokerTls {
    /// The set-up from its options, wherever they came from (flags, environment, YAML): the one
    /// place that checks that a client certificate comes with its key.
    pub fn new(
        ca_file: Option<PathBuf>,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
    ) -> Result<Self, UnpairedClientCert> {
        let client = match (client_cert, client_key) {
            (Some(cert), Some(key)) => Some(ClientCert { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(UnpairedClientCert {
                    given: "--broker-client-cert",
                    missing: "--broker-client-key",
                });
            }
            (None, Some(_)) => {
                return Err(UnpairedClientCert {
                    given: "--broker-client-key",
                    missing: "--broker-client-cert",
                });
            }
        };
        Ok(Self { ca_file, client })
    }

    /// lapin's TLS settings, the files read now.
    pub fn for_lapin(&self) -> Result<OwnedTLSConfig, ConnectError> {
        let cert_chain = match &self.ca_file {
            Some(path) => Some(String::from_utf8(read(path, "--broker-ca-file")?).map_err(
                |_| {
                    refused(
                        Refusal::Settings,
                        format!("--broker-ca-file {}: not PEM text", path.display()),
                    )
                },
            )?),
            None => None,
        };
        let identity = match &self.client {
            Some(client) => Some(OwnedIdentity::PKCS8 {
                pem: read(&client.cert, "--broker-client-cert")?,
                key: read(&client.key, "--broker-client-key")?,
            }),
            None => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }

    /// A rustls client configuration (ring, the system's store plus the CA file, the client
    /// certificate), for the AMQP 1.0 connection.
    pub fn client_config(&self) -> Result<ClientConfig, ConnectError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let extra_roots = match &self.ca_file {
            Some(path) => certificates(path, "--broker-ca-file")?,
            None => Vec::new(),
        };
        let verifier =
            rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
                .map_err(|e| refused(Refusal::Settings, format!("cannot set up TLS: {e}")))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| refused(Refusal::Settings, format!("cannot set up TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some(ClientCert { cert, key }) => {
                let chain = certificates(cert, "--broker-client-cert")?;
                let key = PrivateKeyDer::from_pem_slice(&read(key, "--broker-client-key")?)
                    .map_err(|e| {
                        refused(
                            Refusal::Settings,
                            format!(
                                "--broker-client-key {}: no PEM private key ({e})",
                                key.display()
                            ),
                        )
                    })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    refused(
                        Refusal::Settings,
                        format!(
                            "--broker-client-key is not the key of --broker-client-cert ({e}): give \
                             the key that belongs to the certificate"
                        ),
                    )
                })
            }
        }
    }
}

/// `url` with the password read from `file` (the first line, its ending dropped, as for
/// PostgreSQL's password file), or `url` as given when there is no file.
pub fn with_password_file(url: &SecretUrl, file: Option<&Path>) -> Result<SecretUrl, ConnectError> {
    let Some(file) = file else {
        return Ok(url.clone());
    };
    let password = read_password(file, "--broker-password-file")
        .map_err(|e| refused(Refusal::Settings, e.to_string()))?;
    let mut parsed = url::Url::parse(url.expose()).map_err(|e| {
        refused(
            Refusal::Settings,
            format!("the broker URL is not a URL: {e}"),
        )
    })?;
    // set_password percent-encodes what a URL's user-info cannot hold as is.
    parsed
        .set_password(Some(&password))
        .map_err(|()| refused(Refusal::Settings, "the broker URL cannot carry a password"))?;
    SecretUrl::parse(parsed.as_str(), UrlKind::Amqp)
        .map_err(|e| refused(Refusal::Settings, format!("the broker URL {e}")))
}

fn read(path: &Path, setting: &str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|e| {
        refused(
            Refusal::Settings,
            format!("cannot read {setting} {}: {}", path.display(), e.kind()),
        )
    })
}

fn certificates(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, ConnectError> {
    let pem = read(path, setting)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            refused(
                Refusal::Settings,
                format!("{setting} {}: not PEM certificates ({e})", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(refused(
            Refusal::Settings,
            format!("{setting} {} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

/// Sorts a failed connect by cause: a TLS or login refusal gets its reason, the rest (the
/// broker down, unreachable) stays an outage.
pub(super) fn classify(
    error: &(dyn std::error::Error + 'static),
    tls: &BrokerTls,
    url: &SecretUrl,
) -> Option<ConnectError> {
    let parsed = url::Url::parse(url.expose()).ok();
    // The host alone: never the URL, whose user-info may hold a password.
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str())
        .unwrap_or("the URL's host");
    let rustls_error = find_cause::<rustls::Error>(error);
    if let Some(e) = rustls_error {
        let message = match e {
            rustls::Error::InvalidCertificate(cert) => match cert {
                rustls::CertificateError::UnknownIssuer
                | rustls::CertificateError::BadSignature => {
                    format!(
                        "the broker's certificate is not trusted: {}",
                        match &tls.ca_file {
                            Some(path) => format!(
                                "--broker-ca-file {} is not the CA that signed it",
                                path.display()
                            ),
                            None => "give its CA with --broker-ca-file (BROKER_CA_FILE)".into(),
                        }
                    )
                }
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. } => format!(
                    "the broker's certificate is not valid for the host name {host}: connect by \
                     a name the certificate lists (the broker URL's host), or give the broker a \
                     certificate that names {host}"
                ),
                other => certificate_dates::problem(
                    other,
                    &Refusing {
                        whose: "the broker's",
                        host,
                        checked_by: "amqps://",
                        renew: "the broker's certificate (RabbitMQ: ssl_options.certfile)",
                    },
                )
                .unwrap_or_else(|| format!("the broker's certificate was refused ({other:?})")),
            },
            rustls::Error::AlertReceived(alert) => format!(
                "the broker ended the TLS handshake ({alert:?}): if it requires a client \
                 certificate, give --broker-client-cert and --broker-client-key"
            ),
            other => format!("TLS with the broker failed: {other}"),
        };
        return Some(refused(Refusal::Tls, message));
    }
    let text = error.to_string();
    // RabbitMQ closes with ACCESS_REFUSED (403); an AMQP 1.0 broker fails the SASL outcome or
    // answers amqp:unauthorized-access.
    let login_refused = [
        "ACCESS_REFUSED",
        "ACCESSREFUSED",
        "amqp:unauthorized-access",
        "SaslCode::Auth",
        "code: Auth",
    ]
    .iter()
    .any(|needle| text.contains(needle) || format!("{error:?}").contains(needle));
    // RabbitMQ answers a connection.open to a vhost it lacks, or one the user has no
    // permission on, with NOT_ALLOWED: a setting to fix, not an outage to wait out.
    if text.contains("NOT_ALLOWED") && text.contains("vhost") {
        let fix = if text.contains("not found") {
            "create it (rabbitmqctl add_vhost NAME, then set_permissions for the user) or fix \
             the vhost in the URL's path (percent-encoded: the default vhost / is %2f)"
        } else {
            "grant the user access (rabbitmqctl set_permissions -p VHOST USER '.*' '.*' '.*') \
             or fix the vhost in the URL's path (percent-encoded: the default vhost / is %2f)"
        };
        return Some(refused(
            Refusal::Settings,
            format!(
                "the broker refused the vhost ({}): {fix}",
                first_line(&text)
            ),
        ));
    }
    if login_refused {
        return Some(refused(
            Refusal::Auth,
            format!(
                "the broker refused the login ({}): check the URL's user and password \
                 (percent-encoded), --broker-password-file, or for ?auth_mechanism=external the \
                 client certificate's common name",
                first_line(&text)
            ),
        ));
    }
    None
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// The first error of type `T` in `error`'s chain, including inside `io::Error`s.
fn find_cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(found) = inner.downcast_ref::<T>()
        {
            return Some(found);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::CertificateError;
    use rustls::pki_types::UnixTime;

    use super::*;

    fn refusal_for(cert: CertificateError) -> (Refusal, String) {
        let url = SecretUrl::parse(
            "amqps://relay:S3cret-pw@mq.internal:5671/%2f",
            UrlKind::Amqp,
        )
        .unwrap();
        let error = rustls::Error::InvalidCertificate(cert);
        match classify(&error, &BrokerTls::default(), &url) {
            Some(ConnectError::Refused { kind, message }) => {
                assert!(!message.contains("S3cret-pw"), "{message}");
                (kind, message)
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[derive(Debug)]
    struct Closed(&'static str);

    impl std::fmt::Display for Closed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Closed {}

    /// A missing vhost and one the user may not use are settings to fix, each with its own
    /// fix; the services test meets the first on the real broker.
    #[test]
    fn a_refused_vhost_is_a_setting_with_its_fix() {
        let url = SecretUrl::parse("amqp://relay:S3cret-pw@mq:5672/orders", UrlKind::Amqp).unwrap();
        for (text, fix) in [
            (
                "protocol error: AMQP hard error: NOT-ALLOWED: NOT_ALLOWED - vhost orders not found",
                "rabbitmqctl add_vhost",
            ),
            (
                "NOT_ALLOWED - access to vhost 'orders' refused for user 'relay'",
                "rabbitmqctl set_permissions -p VHOST",
            ),
        ] {
            match classify(&Closed(text), &BrokerTls::default(), &url) {
                Some(ConnectError::Refused {
                    kind: Refusal::Settings,
                    message,
                }) => {
                    assert!(message.contains("orders"), "{message}");
                    assert!(message.contains(fix), "{message}");
                    assert!(!message.contains("S3cret-pw"), "{message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    /// The broker with an expired certificate is not tested against a real broker (RabbitMQ
    /// serves one certificate per listener), so its words are checked here.
    #[test]
    fn an_expired_broker_certificate_names_the_host_the_date_and_the_fix() {
        let at = |s| UnixTime::since_unix_epoch(Duration::from_secs(s));
        let (kind, message) = refusal_for(CertificateError::ExpiredContext {
            time: at(1_796_256_000),
            not_after: at(1_609_459_200),
        });
        assert_eq!(kind, Refusal::Tls);
        for part in [
            "the broker's certificate for mq.internal expired on 2021-01-01",
            "renew the broker's certificate",
            "check this host's clock",
        ] {
            assert!(message.contains(part), "{part:?} missing: {message}");
        }
        let (_, message) = refusal_for(CertificateError::Expired);
        assert!(message.contains("has expired"), "{message}");
    }

    #[test]
    fn a_certificate_for_another_host_names_the_host() {
        let (kind, message) = refusal_for(CertificateError::NotValidForName);
        assert_eq!(kind, Refusal::Tls);
        assert!(
            message.contains("not valid for the host name mq.internal"),
            "{message}"
        );
    }

    #[test]
    fn a_client_certificate_and_its_key_come_together() {
        let err = BrokerTls::new(None, Some("c.pem".into()), None).unwrap_err();
        assert_eq!(err.missing, "--broker-client-key");
        let err = BrokerTls::new(None, None, Some("c.key".into())).unwrap_err();
        assert_eq!(err.missing, "--broker-client-cert");
        assert!(err.to_string().contains("--broker-client-key"), "{err}");
        let tls = BrokerTls::new(None, Some("c.pem".into()), Some("c.key".into())).unwrap();
        assert!(tls.client.is_some());
        assert_eq!(
            BrokerTls::new(None, None, None).unwrap(),
            BrokerTls::default()
        );
    }
}
