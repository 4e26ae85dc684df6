//! Opening the AMQP 1.0 connection that a publisher's link lives on.
//!
//! The TCP (and for `amqps://`, TLS) stream is made here and handed to fe2o3-amqp, rather than
//! letting the library open the URL: its own TLS feature would bring a second crypto backend
//! (aws-lc-rs) next to the workspace's ring, and it passes the URL's user and password to SASL
//! still percent-encoded, which breaks a Service Bus key (base64, so `/`, `+` and `=`).
//!
//! TLS is established first and AMQP runs inside it (the port-5671 convention Service Bus and
//! most brokers use, not the in-band AMQP TLS upgrade). Certificates are checked against the
//! system's trust store (`SSL_CERT_FILE` points it at another bundle) and `--broker-ca-file`;
//! `--broker-client-cert` and `--broker-client-key` give a client certificate.

use std::path::Path;
use std::sync::Arc;

use fe2o3_amqp::Connection;
use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::sasl_profile::SaslProfile;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::broker::ConnectError;
use crate::broker::tls::{BrokerTls, classify, with_password_file};
use crate::connect::secret_url::SecretUrl;
use crate::connect::tcp_keepalive;

/// The IANA ports of AMQP 1.0 without and with TLS.
const AMQP_PORT: u16 = 5672;
const AMQPS_PORT: u16 = 5671;

pub(super) fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> ConnectError {
    ConnectError::Unavailable(Arc::new(error))
}

/// A problem with the URL or the TLS set-up, said without the URL (it holds the password).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Setup(String);

fn setup(message: impl Into<String>) -> ConnectError {
    unavailable(Setup(message.into()))
}

/// Opens the connection `url` names: TCP, TLS for `amqps://`, then SASL (PLAIN with the
/// URL's decoded user and password, else ANONYMOUS) and the AMQP open.
pub(super) async fn open(
    url: &SecretUrl,
    container_id: &str,
    tls_files: &BrokerTls,
    password_file: Option<&Path>,
) -> Result<ConnectionHandle<()>, ConnectError> {
    let url = &with_password_file(url, password_file)?;
    let parsed = url::Url::parse(url.expose())
        .map_err(|e| setup(format!("the broker URL is not a URL: {e}")))?;
    let tls = match parsed.scheme() {
        "amqp" => false,
        "amqps" => true,
        other => {
            return Err(setup(format!(
                "the broker URL's scheme is {other}; use amqp:// or amqps://"
            )));
        }
    };
    let host = parsed
        .host_str()
        .ok_or_else(|| setup("the broker URL has no host"))?;
    // An IPv6 literal comes bracketed from the URL; the socket and TLS want it bare.
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let port = parsed
        .port()
        .unwrap_or(if tls { AMQPS_PORT } else { AMQP_PORT });
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(unavailable)?;
    let _ = tcp.set_nodelay(true);
    tcp_keepalive::arm(&tcp);

    let mut builder = Connection::builder()
        .container_id(container_id.to_string())
        .scheme("amqp")
        .hostname(host)
        .sasl_hostname(host);
    if let (Some(username), Some(password)) = (url.username(), url.password()) {
        builder = builder.sasl_profile(SaslProfile::Plain { username, password });
    }
    let opened = if tls {
        let server = ServerName::try_from(bare_host.to_string()).map_err(|e| {
            setup(format!(
                "the broker URL's host cannot be checked by TLS: {e}"
            ))
        })?;
        let connector = TlsConnector::from(Arc::new(tls_files.client_config()?));
        let stream = connector
            .connect(server, tcp)
            .await
            .map_err(|e| classify(&e, tls_files, url).unwrap_or_else(|| unavailable(e)))?;
        builder.open_with_stream(stream).await
    } else {
        builder.open_with_stream(tcp).await
    };
    opened.map_err(|e| classify(&e, tls_files, url).unwrap_or_else(|| unavailable(e)))
}
