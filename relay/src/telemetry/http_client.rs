//! The OTLP exporter's HTTP client: opentelemetry-http's hyper client over a rustls (ring)
//! connector, so https endpoints work with the one TLS stack of the workspace, run on the
//! process's tokio runtime.
//!
//! Why the runtime handle: the SDK's batch span processor exports from a thread of its own,
//! blocking on the export future there, while hyper's connections need a tokio reactor. Each
//! request is therefore spawned onto the runtime the relay already runs, and its result awaited
//! from the processor's thread (a JoinHandle can be awaited from any executor).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::runtime::Handle;

/// How long one export request may take: the specification's default OTLP timeout.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct RuntimeHttpClient {
    inner: HyperClient<HttpsConnector<HttpConnector>>,
    runtime: Handle,
}

/// Why the client could not be built: the CA file named by `variable`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{variable} {path}: {reason}; name a readable PEM file of the CA that signed the collector's certificate"
)]
pub struct CaFileError {
    pub variable: &'static str,
    pub path: String,
    pub reason: String,
}

impl RuntimeHttpClient {
    /// A client on the current tokio runtime, trusting the system's store and `ca_file`.
    pub fn new(ca_file: Option<&Path>) -> Result<Self, CaFileError> {
        let tls = tls_config(ca_file)?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            inner: HyperClient::new(connector, EXPORT_TIMEOUT, None),
            runtime: Handle::current(),
        })
    }
}

#[async_trait]
impl HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let inner = self.inner.clone();
        self.runtime
            .spawn(async move { inner.send_bytes(request).await })
            .await?
    }
}

fn tls_config(ca_file: Option<&Path>) -> Result<ClientConfig, CaFileError> {
    let variable = "OTEL_EXPORTER_OTLP_CERTIFICATE";
    let failed = |path: &Path, reason: String| CaFileError {
        variable,
        path: path.display().to_string(),
        reason,
    };
    let extra_roots: Vec<CertificateDer<'static>> = match ca_file {
        None => Vec::new(),
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| failed(path, e.kind().to_string()))?;
            let roots = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed(path, format!("not PEM certificates ({e})")))?;
            if roots.is_empty() {
                return Err(failed(path, "no PEM certificate in it".into()));
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let setup = |e: &dyn std::fmt::Display| CaFileError {
        variable,
        path: ca_file.map(|p| p.display().to_string()).unwrap_or_default(),
        reason: format!("cannot set up TLS: {e}"),
    };
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
            .map_err(|e| setup(&e))?;
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(&e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}
