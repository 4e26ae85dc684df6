//! RabbitMQ 4.0 (Debian 13's, run from a Debian 13 root of its own) beside the tests' 3.10:
//! `scripts/services.sh rabbitmq4` makes and starts it, and only the tests that need it start it:
//! the broker matrix's through `crate::test_broker` (`OUTBOX_TEST_BROKER=rabbitmq4`), others
//! through [`up`]. Its URLs come from the ports in `scripts/services/ports.env`.

use const_format::formatcp;

use crate::ports::{RABBITMQ4_PORT, RABBITMQ4_TLS_PORT};

/// AMQP 0-9-1 (the relay's `AMQP_URL`, lapin's consumers), vhost `/`.
pub const AMQP_URL: &str = formatcp!("amqp://guest:guest@127.0.0.1:{RABBITMQ4_PORT}/%2f");
/// AMQP 1.0 on the same port (core in 4.x): the relay's `--broker-url` with
/// `--broker-protocol amqp10`, the tests' AMQP 1.0 consumers.
pub const AMQP10_URL: &str = formatcp!("amqp://guest:guest@127.0.0.1:{RABBITMQ4_PORT}");
/// AMQP 0-9-1 inside TLS, with the test CA's server certificate (`crate::tls`).
pub const AMQPS_URL: &str = formatcp!("amqps://guest:guest@127.0.0.1:{RABBITMQ4_TLS_PORT}/%2f");
/// The same, logged in by the test client certificate (EXTERNAL, user `outbox_cert`).
pub const AMQPS_EXTERNAL_URL: &str =
    formatcp!("amqps://outbox_cert@127.0.0.1:{RABBITMQ4_TLS_PORT}/%2f?auth_mechanism=external");

/// Makes sure the broker runs: the first call of a test binary runs `scripts/services.sh
/// rabbitmq4` (which makes the Debian 13 root the first time on a machine: over a minute),
/// holding a lock file so that test binaries starting it at once take turns; later calls return
/// at once. Panics with the script's words when it fails.
pub async fn up() {
    static STARTED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    STARTED
        .get_or_init(|| async {
            let lock = tokio::task::spawn_blocking(|| {
                let dir = crate::cache_dir();
                std::fs::create_dir_all(&dir).expect("the cache folder");
                let path = dir.join("rabbitmq4.tests.lock");
                crate::lock_file::lock(&path, true)
                    .unwrap_or_else(|| panic!("lock {}", path.display()))
            })
            .await
            .expect("the lock task");
            crate::services::script(&["rabbitmq4"])
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            drop(lock);
        })
        .await;
}
