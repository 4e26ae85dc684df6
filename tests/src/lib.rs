//! Support for the cross-component tests: unique tables and exchanges per test, a consumer
//! that records every message id, and real `outbox-relay` processes.

pub mod amqp10;
pub mod api_versions;
pub mod artemis_pair;
pub mod broker;
pub mod cache_key;
pub mod chaos;
pub mod cloudevents;
pub mod cluster;
pub mod control_plane;
pub mod daemon;
pub mod db;
pub mod docs_reference;
pub mod health;
pub mod helm;
pub mod history;
pub mod http;
pub mod load;
pub mod local_server;
pub mod lock_file;
pub mod metrics;
pub mod node;
pub mod oci;
pub mod ordering;
pub mod otel_collector;
pub mod partition;
pub mod pods;
pub mod ports;
pub mod previous_release;
pub mod process;
pub mod proxy;
pub mod rabbit_cluster;
pub mod rabbitmq4;
pub mod registry;
pub mod scaling_recorder;
pub mod services;
pub mod soak;
pub mod sockets;
pub mod standby;
pub mod test_broker;
pub mod timeline;
pub mod tls;
pub mod toxiproxy;
pub mod unix_proxy;
pub mod wait;

/// The repository's root folder (this crate sits in `tests/`).
pub fn repo_root() -> std::path::PathBuf {
    // `cargo test` sets the variable for the run too. It wins over the compile-time value:
    // cargo keys a path crate's build by its workspace-relative path, so a lib built in another
    // checkout sharing the target folder is taken as fresh, with that checkout's path in it.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    std::path::Path::new(&manifest_dir).join("..")
}

/// Where scripts/services.sh keeps what it makes (`$OUTBOX_CACHE`, by default
/// `~/.cache/outbox-relay`).
pub fn cache_dir() -> std::path::PathBuf {
    match std::env::var_os("OUTBOX_CACHE") {
        Some(cache) => cache.into(),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/outbox-relay"),
    }
}

/// A short unique suffix for table, exchange and queue names, so tests never share data.
pub fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &id[..12])
}

pub const DATABASE_URL: &str =
    const_format::formatcp!("postgres://postgres@127.0.0.1:{}/test", ports::PG_PORT);
pub const AMQP_URL: &str =
    const_format::formatcp!("amqp://guest:guest@127.0.0.1:{}/%2f", ports::RABBITMQ_PORT);

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DATABASE_URL.to_string())
}

/// `DATABASE_URL` with `database` in place of the database it names (whatever that is called),
/// its user, host and parameters kept: parsed, never replaced as text.
pub fn database_url_of(database: &str) -> String {
    let mut url = url::Url::parse(&database_url()).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// The AMQP 0-9-1 URL of the broker the tests meet ([`test_broker`]: 3.10 unless the broker
/// matrix chose 4.0).
pub fn amqp_url() -> String {
    test_broker::TestBroker::current().amqp_url()
}
