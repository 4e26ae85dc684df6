//! A stateful in-memory Kubernetes API server for tests: get, list, watch, create, replace,
//! delete, merge patch and server-side apply, with the status subresource and resourceVersions,
//! for the kinds in [`kinds::KINDS`]. Enough for kube's Client, Controller, watcher, reflector
//! and event Recorder; no admission, no defaulting, no validation, no managed fields.

pub mod errors;
pub mod kinds;
pub mod patch;
pub mod routing;
pub mod selector;
pub mod store;
pub mod watch;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use routing::SharedStore;
use store::Store;

/// A running server on 127.0.0.1; stops when dropped.
pub struct ApiServer {
    pub addr: SocketAddr,
    store: SharedStore,
    task: JoinHandle<()>,
}

impl ApiServer {
    /// Binds an ephemeral port and serves until dropped.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store: SharedStore = Arc::new(Mutex::new(Store::default()));
        let app = axum::Router::new()
            .fallback(routing::handle)
            .with_state(store.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "in-memory API server stopped");
            }
        });
        Ok(Self { addr, store, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client talking to this server, with `default_namespace` for `Api::default_namespaced`.
    pub fn client(&self, default_namespace: &str) -> kube::Client {
        // The workspace enables both ring and aws-lc-rs, so rustls cannot pick one itself; the
        // client builds its TLS stack even for plain HTTP. Installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = kube::Config::new(self.url().parse().expect("a valid URL"));
        config.default_namespace = default_namespace.to_string();
        kube::Client::try_from(config).expect("a client for a plain HTTP URL")
    }

    /// Every version the server stored of the object `name` of kind `plural` (e.g.
    /// `deployments`) in `namespace`, with the time of each write: the complete record of what
    /// a controller wrote, which polling could miss.
    pub fn versions_of(
        &self,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Vec<(chrono::DateTime<chrono::Utc>, serde_json::Value)> {
        let Some(kind) = kinds::KINDS.iter().find(|k| k.plural == plural) else {
            return Vec::new();
        };
        let key = store::ObjectKey {
            kind: *kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.store
            .lock()
            .unwrap()
            .versions_of(&key)
            .iter()
            .map(|change| (change.at, change.object.clone()))
            .collect()
    }

    /// The current resourceVersion: how many writes the server has seen (plus a start offset).
    pub fn resource_version(&self) -> u64 {
        self.store.lock().unwrap().resource_version()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
