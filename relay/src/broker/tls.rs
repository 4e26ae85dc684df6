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
use crate::secret_url::{SecretUrl, UrlKind};

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
    /// PEM client certificate (chain) and its PKCS#8 key.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl BrokerTls {
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
        let identity = match self.client_pair()? {
            Some((cert, key)) => Some(OwnedIdentity::PKCS8 {
                pem: read(cert, "--broker-client-cert")?,
                key: read(key, "--broker-client-key")?,
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
        match self.client_pair()? {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
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

    fn client_pair(&self) -> Result<Option<(&Path, &Path)>, ConnectError> {
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(refused(
                Refusal::Settings,
                "--broker-client-cert needs its key: set --broker-client-key",
            )),
            (None, Some(_)) => Err(refused(
                Refusal::Settings,
                "--broker-client-key needs its certificate: set --broker-client-cert",
            )),
        }
    }
}

/// `url` with the password read from `file` (the first line, its ending dropped), or `url` as
/// given when there is no file.
pub fn with_password_file(url: &SecretUrl, file: Option<&Path>) -> Result<SecretUrl, ConnectError> {
    let Some(file) = file else {
        return Ok(url.clone());
    };
    let text = String::from_utf8(read(file, "--broker-password-file")?).map_err(|_| {
        refused(
            Refusal::Settings,
            format!("--broker-password-file {}: not UTF-8 text", file.display()),
        )
    })?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        return Err(refused(
            Refusal::Settings,
            format!("--broker-password-file {} is empty", file.display()),
        ));
    }
    let mut parsed = url::Url::parse(url.expose()).map_err(|e| {
        refused(
            Refusal::Settings,
            format!("the broker URL is not a URL: {e}"),
        )
    })?;
    // set_password percent-encodes what a URL's user-info cannot hold as is.
    parsed
        .set_password(Some(password))
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
) -> Option<ConnectError> {
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
                | rustls::CertificateError::NotValidForNameContext { .. } => {
                    "the broker's certificate is not valid for the URL's host name: connect by a \
                     name the certificate lists"
                        .into()
                }
                rustls::CertificateError::Expired
                | rustls::CertificateError::ExpiredContext { .. } => {
                    "the broker's certificate has expired: renew it on the broker".into()
                }
                other => format!("the broker's certificate was refused ({other:?})"),
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
