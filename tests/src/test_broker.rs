//! Which RabbitMQ the broker tests meet: the tests' 3.10 (`scripts/services.sh`), or 4.0
//! (`scripts/services.sh rabbitmq4`) when `OUTBOX_TEST_BROKER=rabbitmq4`, as the broker matrix
//! (`scripts/broker-matrix.sh`) runs them. The harness's broker helpers follow it
//! ([`crate::amqp_url`], the AMQP 1.0 URL and queue address, the AMQPS port, `rabbitmqctl`), so
//! a test reads the same whichever broker it meets; what a broker does differently is asserted
//! per broker, by matching on [`TestBroker::current`].

use std::process::Command;
use std::sync::OnceLock;

use const_format::formatcp;

use crate::ports::{RABBITMQ_PORT, RABBITMQ_TLS_PORT, RABBITMQ4_PORT, RABBITMQ4_TLS_PORT};

/// The setting that picks the broker.
pub const ENV: &str = "OUTBOX_TEST_BROKER";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBroker {
    /// RabbitMQ 3.10 (Debian 12's) on RABBITMQ_PORT: the default, where `make test` runs every
    /// test. Its AMQP 1.0 is the `rabbitmq_amqp1_0` plugin, with the v1 address format.
    Rabbitmq3,
    /// RabbitMQ 4.0 (Debian 13's, in a root of its own) on RABBITMQ4_PORT: AMQP 1.0 is core,
    /// with the v2 address format (`/queues/NAME`, `/exchanges/NAME/KEY`).
    Rabbitmq4,
}

impl TestBroker {
    /// The broker `value` (the setting's text, None when unset) names; the error says what the
    /// setting takes.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.map(str::trim) {
            None | Some("" | "rabbitmq3") => Ok(Self::Rabbitmq3),
            Some("rabbitmq4") => Ok(Self::Rabbitmq4),
            Some(other) => Err(format!(
                "{ENV}={other:?} names no test broker: leave it unset (or rabbitmq3) for RabbitMQ \
                 3.10 on port {RABBITMQ_PORT}, or set rabbitmq4 for RabbitMQ 4.0 on port \
                 {RABBITMQ4_PORT} (scripts/broker-matrix.sh)"
            )),
        }
    }

    /// The broker this test run meets. The first call for RabbitMQ 4 makes sure it runs
    /// (`scripts/services.sh rabbitmq4`, which takes a lock of its own and returns at once when
    /// the broker is up), so a single test can be run by hand with the setting alone.
    pub fn current() -> Self {
        static CURRENT: OnceLock<TestBroker> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let value = std::env::var(ENV).ok();
            let broker = Self::parse(value.as_deref()).unwrap_or_else(|e| panic!("{e}"));
            if broker == Self::Rabbitmq4 {
                start_rabbitmq4();
            }
            broker
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Rabbitmq3 => "RabbitMQ 3.10",
            Self::Rabbitmq4 => "RabbitMQ 4.0",
        }
    }

    /// AMQP 0-9-1, vhost `/`: the relay's `AMQP_URL` and lapin's consumers. On 3.10 the
    /// environment's `AMQP_URL` wins (the Makefile exports it), as it always has.
    pub fn amqp_url(self) -> String {
        match self {
            Self::Rabbitmq3 => std::env::var("AMQP_URL").unwrap_or_else(|_| crate::AMQP_URL.into()),
            Self::Rabbitmq4 => crate::rabbitmq4::AMQP_URL.into(),
        }
    }

    /// AMQP 1.0 on the same port (3.10's plugin, 4.0's core).
    pub fn amqp10_url(self) -> &'static str {
        match self {
            Self::Rabbitmq3 => formatcp!("amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}"),
            Self::Rabbitmq4 => crate::rabbitmq4::AMQP10_URL,
        }
    }

    /// The AMQPS listener, with the test CA's server certificate for 127.0.0.1 and certificate
    /// login (EXTERNAL, user `outbox_cert`).
    pub fn tls_port(self) -> u16 {
        match self {
            Self::Rabbitmq3 => RABBITMQ_TLS_PORT,
            Self::Rabbitmq4 => RABBITMQ4_TLS_PORT,
        }
    }

    /// The AMQP 1.0 address of queue `queue` in the broker's own format: v1 on 3.10 (its
    /// plugin knows no other), v2 on 4.0 (where v1 is deprecated).
    pub fn queue_address(self, queue: &str) -> String {
        match self {
            Self::Rabbitmq3 => v1_queue_address(queue),
            Self::Rabbitmq4 => v2_queue_address(queue),
        }
    }

    /// `rabbitmqctl` against this broker's node, arguments to follow: 3.10's on the PATH, or
    /// 4.0's inside its root (`scripts/services.sh rabbitmq4-cli rabbitmqctl`).
    pub fn rabbitmqctl(self) -> Command {
        match self {
            Self::Rabbitmq3 => Command::new("rabbitmqctl"),
            Self::Rabbitmq4 => {
                let mut command = Command::new(crate::repo_root().join("scripts/services.sh"));
                command.args(["rabbitmq4-cli", "rabbitmqctl"]);
                command
            }
        }
    }
}

/// RabbitMQ 3.x's address of a queue (v1); RabbitMQ 4.0 still takes it while its deprecated
/// feature `amqp_address_v1` is permitted (the default in 4.0).
pub fn v1_queue_address(queue: &str) -> String {
    format!("/amq/queue/{queue}")
}

/// RabbitMQ 4's address of a queue (v2). The tests' names need no percent-encoding.
pub fn v2_queue_address(queue: &str) -> String {
    format!("/queues/{queue}")
}

/// `scripts/services.sh rabbitmq4`, blocking (once per test binary, from [`TestBroker::current`]).
fn start_rabbitmq4() {
    let output = Command::new(crate::repo_root().join("scripts/services.sh"))
        .arg("rabbitmq4")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/services.sh rabbitmq4: {e}"));
    assert!(
        output.status.success(),
        "{ENV}=rabbitmq4, but scripts/services.sh rabbitmq4 failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_a_broker_or_says_what_it_takes() {
        assert_eq!(TestBroker::parse(None), Ok(TestBroker::Rabbitmq3));
        assert_eq!(TestBroker::parse(Some("")), Ok(TestBroker::Rabbitmq3));
        assert_eq!(
            TestBroker::parse(Some("rabbitmq3")),
            Ok(TestBroker::Rabbitmq3)
        );
        assert_eq!(
            TestBroker::parse(Some("rabbitmq4")),
            Ok(TestBroker::Rabbitmq4)
        );
        let error = TestBroker::parse(Some("rabbitmq-4.0")).unwrap_err();
        assert!(
            error.contains("OUTBOX_TEST_BROKER=\"rabbitmq-4.0\"")
                && error.contains("rabbitmq4")
                && error.contains("rabbitmq3"),
            "{error}"
        );
    }

    #[test]
    fn each_broker_has_its_own_ports_and_address_format() {
        let (three, four) = (TestBroker::Rabbitmq3, TestBroker::Rabbitmq4);
        assert_ne!(three.tls_port(), four.tls_port());
        assert_ne!(three.amqp10_url(), four.amqp10_url());
        assert_eq!(three.queue_address("q"), "/amq/queue/q");
        assert_eq!(four.queue_address("q"), "/queues/q");
    }
}
