//! An ActiveMQ Artemis primary/backup pair on a shared store, of one test's own (issue 44: a
//! relay's broker list naming an AMQP 1.0 failover pair). The primary answers AMQP 1.0; the
//! backup does not listen until it has taken the journal's lock from a primary that died or
//! stopped. Dropped, both are killed and the journal emptied; the instances stay in the cache
//! for the next pair.
//!
//! Each pair takes a slot: two ports (and their core ports, `ARTEMIS_CORE_PORT_OFFSET` above)
//! and a folder of its own, held by a lock file while the pair lives, so tests (and other test
//! processes) run pairs side by side.
//!
//! The set-up lives beside it: [`member`] a member's instance (`artemis create` and its edits),
//! [`broker`] a member's process, [`setup`] the pair's folder started and removed. Artemis
//! itself is installed by `scripts/services.sh`, as for the tests' shared broker.

mod broker;
mod member;
mod setup;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The first port of the slots, beside every server `scripts/services.sh` starts, the private
/// Artemis of amqp10_delivery and the RabbitMQ cluster (all in scripts/services/ports.env).
const FIRST_PORT: u16 = crate::ports::ARTEMIS_PAIR_FIRST_PORT;
/// Slots of two ports each.
const SLOTS: u16 = crate::ports::ARTEMIS_PAIR_SLOTS;

/// One member of the pair, by the role it was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    Primary,
    Backup,
}

impl Member {
    pub fn name(self) -> &'static str {
        match self {
            Member::Primary => "primary",
            Member::Backup => "backup",
        }
    }
}

pub struct ArtemisPair {
    dir: PathBuf,
    pub primary_port: u16,
    pub backup_port: u16,
    /// The slot's lock: held (open, locked) as long as the pair lives.
    _slot: std::fs::File,
}

/// Where the slots live: in the cache, so that each slot's instances (made by `artemis create`,
/// seconds of Java) serve every later run. Absolute: a member's process is recognised by its
/// instance's path on its command line.
fn base_dir() -> PathBuf {
    let dir = crate::cache_dir().join("artemis/pairs");
    std::path::absolute(&dir).unwrap_or(dir)
}

/// True when nothing listens on 127.0.0.1:`port` now.
fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

impl ArtemisPair {
    /// A fresh pair in a free slot: the primary answering AMQP 1.0 with an empty journal, the
    /// backup waiting for it. Whatever an earlier run left in the slot is killed first.
    pub async fn start() -> Self {
        std::fs::create_dir_all(base_dir()).expect("the Artemis pairs' folder");
        for slot in 0..SLOTS {
            let path = base_dir().join(format!("slot-{slot}.lock"));
            let Some(lock) = crate::lock_file::lock(&path, false) else {
                continue;
            };
            let primary_port = FIRST_PORT + 2 * slot;
            let pair = Self {
                dir: base_dir().join(format!("slot-{slot}")),
                primary_port,
                backup_port: primary_port + 1,
                _slot: lock,
            };
            pair.step(|dir| {
                setup::remove(dir);
                Ok(())
            })
            .await;
            // A port some other program holds: leave this slot to it.
            let ports = [primary_port, primary_port + 1];
            let core = |port| port + crate::ports::ARTEMIS_CORE_PORT_OFFSET;
            if !ports.iter().all(|&p| port_free(p) && port_free(core(p))) {
                continue;
            }
            let (primary, backup) = (pair.primary_port, pair.backup_port);
            pair.step(move |dir| setup::make(dir, primary, backup))
                .await;
            return pair;
        }
        panic!(
            "no free Artemis pair slot: ports {FIRST_PORT}-{} are all taken",
            FIRST_PORT + 2 * SLOTS - 1
        )
    }

    /// Runs `step` on the pair's folder off the async workers (it waits for brokers, and the
    /// test's other tasks go on meanwhile); a failed step fails the test.
    async fn step<F>(&self, step: F)
    where
        F: FnOnce(&Path) -> Result<(), String> + Send + 'static,
    {
        let dir = self.dir.clone();
        let done = tokio::task::spawn_blocking(move || step(&dir))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if let Err(e) = done {
            panic!("{e}")
        }
    }

    pub fn port(&self, member: Member) -> u16 {
        match member {
            Member::Primary => self.primary_port,
            Member::Backup => self.backup_port,
        }
    }

    /// `member`'s AMQP 1.0 URL (the user every test broker has).
    pub fn url(&self, member: Member) -> String {
        format!("amqp://outbox:outbox@127.0.0.1:{}", self.port(member))
    }

    /// The relay's `--broker-url` for the pair: the primary, then the backup.
    pub fn broker_list(&self) -> String {
        format!("{},{}", self.url(Member::Primary), self.url(Member::Backup))
    }

    /// Whether `member` takes TCP connections now (a waiting backup does not: it has no
    /// acceptor until it activates).
    pub async fn listening(&self, member: Member) -> bool {
        tokio::net::TcpStream::connect(("127.0.0.1", self.port(member)))
            .await
            .is_ok()
    }

    /// SIGKILL: `member` dies as in a crash; its lock on the journal goes with it.
    pub async fn kill(&self, member: Member) {
        self.stop_with(member, true).await;
    }

    /// SIGTERM: a graceful shutdown, which hands the journal over (failover-on-shutdown).
    pub async fn stop(&self, member: Member) {
        self.stop_with(member, false).await;
    }

    async fn stop_with(&self, member: Member, kill: bool) {
        self.step(move |dir| {
            broker::stop(&setup::instance(dir, member), kill);
            Ok(())
        })
        .await;
    }

    /// Waits until `member` takes connections; how long that took from `since`. Panics after
    /// `limit`, with its log.
    pub async fn await_listening(
        &self,
        member: Member,
        since: Instant,
        limit: Duration,
    ) -> Duration {
        let up = crate::wait::holds(
            &format!("the Artemis {} listens", member.name()),
            limit,
            || self.listening(member),
        )
        .await;
        assert!(up, "{}", self.log(member));
        since.elapsed()
    }

    /// `member`'s console log (to show when a test fails).
    pub fn log(&self, member: Member) -> String {
        std::fs::read_to_string(broker::console_log(&setup::instance(&self.dir, member)))
            .unwrap_or_default()
    }
}

impl Drop for ArtemisPair {
    fn drop(&mut self) {
        // Blocking on purpose: a Drop cannot await, and the brokers must be gone before the
        // slot's lock is (the next pair in the slot would find them on its ports).
        setup::remove(&self.dir);
    }
}
