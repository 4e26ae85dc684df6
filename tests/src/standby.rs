//! A PostgreSQL primary with a synchronous streaming standby of one test's own, made fresh
//! (Debian's PostgreSQL 15, `pg_basebackup -R`), and the faults a failover test drives on it:
//! the primary killed, the standby stopped and started again, the standby promoted. Dropped, it
//! stops both servers and removes their folder.
//!
//! Each pair takes a slot: two ports and a folder of its own, held by a lock file while the
//! pair lives, so tests (and other test processes) run pairs side by side without meeting.
//!
//! The set-up lives beside it: [`conf`] the settings, [`pg`] the PostgreSQL tools run as
//! postgres, [`template`] the cached data directory each primary is copied from, [`setup`] a
//! pair's folder made, a server made again, the folder removed.

mod conf;
mod pg;
mod setup;
mod template;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The first port of the slots, beside every server `scripts/services.sh` starts and the
/// other fixtures' (all in scripts/services/ports.env).
const FIRST_PORT: u16 = crate::ports::STANDBY_PAIR_FIRST_PORT;
/// Slots of two ports each.
const SLOTS: u16 = crate::ports::STANDBY_PAIR_SLOTS;

/// One of the pair's two servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Primary,
    Standby,
}

impl Server {
    /// The name the server was made with: after a promotion the standby is the primary.
    pub fn name(self) -> &'static str {
        match self {
            Server::Primary => "primary",
            Server::Standby => "standby",
        }
    }

    pub fn other(self) -> Self {
        match self {
            Server::Primary => Server::Standby,
            Server::Standby => Server::Primary,
        }
    }
}

/// How a server is stopped (`pg_ctl stop -m`): `Fast` ends sessions with 57P01 and a
/// checkpoint; `Immediate` is a crash as a client sees it (the socket closes, no SQLSTATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Fast,
    Immediate,
}

pub struct StandbyPair {
    dir: PathBuf,
    pub primary_port: u16,
    pub standby_port: u16,
    /// The slot's lock: held (open, locked) as long as the pair lives.
    _slot: std::fs::File,
}

/// Where the pairs' folders and slot locks live: a folder the postgres user may enter.
fn base_dir() -> PathBuf {
    std::env::temp_dir().join("outbox-standby")
}

/// True when nothing listens on 127.0.0.1:`port` now.
fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Locks slot `slot`'s file without waiting; `None` when another pair (of this process or
/// another) holds it.
fn lock_slot(slot: u16) -> Option<std::fs::File> {
    crate::lock_file::lock(&base_dir().join(format!("slot-{slot}.lock")), false)
}

impl StandbyPair {
    /// A fresh pair in a free slot: both servers up, the standby synchronous, database `test`
    /// empty. What an earlier run left in the slot (a test killed before its clean-up) is
    /// removed first.
    pub async fn start() -> Self {
        std::fs::create_dir_all(base_dir()).expect("the standby pairs' folder");
        for slot in 0..SLOTS {
            let Some(lock) = lock_slot(slot) else {
                continue;
            };
            let primary_port = FIRST_PORT + 2 * slot;
            let pair = Self {
                dir: base_dir().join(format!("slot-{slot}")),
                primary_port,
                standby_port: primary_port + 1,
                _slot: lock,
            };
            pair.step(setup::remove).await;
            // A port some other program holds: leave this slot to it.
            if !port_free(pair.primary_port) || !port_free(pair.standby_port) {
                continue;
            }
            let (primary, standby) = (pair.primary_port, pair.standby_port);
            pair.step(move |dir| setup::make(dir, primary, standby))
                .await;
            return pair;
        }
        panic!(
            "no free standby-pair slot: ports {FIRST_PORT}-{} are all taken",
            FIRST_PORT + 2 * SLOTS - 1
        )
    }

    /// Runs `step` on the pair's folder off the async workers (it waits for servers, and the
    /// test's other tasks go on meanwhile); a failed step fails the test.
    async fn step<F>(&self, step: F)
    where
        F: FnOnce(&Path) -> Result<(), String> + Send + 'static,
    {
        if let Err(e) = self.try_step(step).await {
            panic!("{e}")
        }
    }

    async fn try_step<F>(&self, step: F) -> Result<(), String>
    where
        F: FnOnce(&Path) -> Result<(), String> + Send + 'static,
    {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || step(&dir))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    pub fn port(&self, server: Server) -> u16 {
        match server {
            Server::Primary => self.primary_port,
            Server::Standby => self.standby_port,
        }
    }

    pub fn addr(&self, server: Server) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port(server)))
    }

    /// A single-host URL of `server`, database `test`.
    pub fn url(&self, server: Server) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port(server))
    }

    pub fn primary_url(&self) -> String {
        self.url(Server::Primary)
    }

    pub fn standby_url(&self) -> String {
        self.url(Server::Standby)
    }

    /// libpq's multi-host URL of both, the primary first, asking for a read-write session.
    pub fn multi_host_url(&self) -> String {
        self.multi_host_url_on(&std::net::Ipv4Addr::LOCALHOST.to_string())
    }

    /// [`Self::multi_host_url`] as the pods of the tests' cluster reach the pair: on the
    /// services address, where the servers listen too.
    pub fn multi_host_url_for_pods(&self) -> String {
        self.multi_host_url_on(&crate::services::SERVICES_ADDRESS.to_string())
    }

    fn multi_host_url_on(&self, host: &str) -> String {
        format!(
            "postgres://postgres@{host}:{},{host}:{}/test?target_session_attrs=read-write",
            self.primary_port, self.standby_port
        )
    }

    /// `pg_ctl stop -m fast|immediate` on `server`.
    pub async fn stop(&self, server: Server, how: Stop) {
        let mode = match how {
            Stop::Fast => "fast",
            Stop::Immediate => "immediate",
        };
        self.step(move |dir| pg::stop(&setup::server_dir(dir, server)?, mode))
            .await;
    }

    /// Starts `server` again (its data as it was left); returns once it accepts connections.
    /// Never the old primary after a promotion: a read-write client would find two primaries.
    pub async fn start_server(&self, server: Server) {
        self.step(move |dir| pg::start(&setup::server_dir(dir, server)?))
            .await;
    }

    /// The primary crashes (`-m immediate`): its clients see the socket close.
    pub async fn kill_primary(&self) {
        self.stop(Server::Primary, Stop::Immediate).await;
    }

    /// The synchronous standby goes away (`-m fast`): the primary's commits wait for it.
    pub async fn stop_standby(&self) {
        self.stop(Server::Standby, Stop::Fast).await;
    }

    pub async fn start_standby(&self) {
        self.start_server(Server::Standby).await;
    }

    /// The standby becomes a primary; returns once it accepts writes.
    pub async fn promote(&self) {
        self.promote_server(Server::Standby).await;
    }

    /// `server` becomes a primary (after [`Self::rejoin`] the roles are swapped, so the server
    /// called primary may be the standby).
    pub async fn promote_server(&self, server: Server) {
        self.step(move |dir| pg::promote(&setup::server_dir(dir, server)?))
            .await;
    }

    /// `server` (killed, or left behind by a promotion) is made again from a base backup of
    /// the other, which must be a primary, as its synchronous standby: the roles swap, each
    /// server keeps its name and port. Returns once the new standby is synchronous.
    pub async fn rejoin(&self, server: Server) -> Result<(), String> {
        let ports = (self.primary_port, self.standby_port);
        self.try_step(move |dir| setup::rejoin(dir, server, ports))
            .await
    }

    /// `pg_is_in_recovery()` of `server`.
    pub async fn in_recovery(&self, server: Server) -> bool {
        let mut conn = crate::db::connect_to(&self.url(server)).await;
        sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .expect("pg_is_in_recovery()")
    }

    /// The standby's `sync_state` as the server made primary sees it (`sync`, `async`, …);
    /// `None` while it is not connected (or after a [`Self::rejoin`], where the roles swapped).
    pub async fn sync_state(&self) -> Option<String> {
        let mut conn = crate::db::connect_to(&self.primary_url()).await;
        sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'replica1'",
        )
        .fetch_optional(&mut conn)
        .await
        .expect("pg_stat_replication")
    }

    /// Waits until the standby is the primary's synchronous standby again (after
    /// [`Self::start_standby`]); false after `timeout`.
    pub async fn wait_until_synchronous(&self, timeout: Duration) -> bool {
        crate::wait::holds("the standby is synchronous", timeout, || async {
            self.sync_state().await.as_deref() == Some("sync")
        })
        .await
    }

    /// The server log of `server` (to show when a test fails).
    pub fn log(&self, server: Server) -> String {
        std::fs::read_to_string(pg::log_of(&self.dir.join(server.name()))).unwrap_or_default()
    }
}

impl Drop for StandbyPair {
    fn drop(&mut self) {
        // Blocking on purpose: a Drop cannot await, and the servers must be gone before the
        // slot's lock is (the next pair in the slot would find them on its ports).
        if let Err(e) = setup::remove(&self.dir) {
            eprintln!(
                "could not remove the standby pair in {}: {e}",
                self.dir.display()
            );
        }
    }
}
