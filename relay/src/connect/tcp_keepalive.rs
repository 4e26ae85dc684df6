//! Keepalive probes and `TCP_USER_TIMEOUT` on the process's own TCP connections, so a
//! connection whose peer went silent (a partition: no RST, no FIN) fails on this side too,
//! within a stated bound, instead of after the kernel's default keepalive (about two hours on
//! Linux) or, with data in flight, some fifteen minutes of retransmissions.
//!
//! The relay's waits are bounded anyway (each database step, the commit, the publish deadline,
//! the AMQP heartbeat); what this adds is that a dead connection lying idle in a pool, or
//! waiting for a reply, errors by itself, so the next use does not sit out its whole bound first.
//!
//! Neither driver offers a hook for its socket's options: sqlx opens its sockets itself and sets
//! only `TCP_NODELAY` (launchbadge/sqlx#3540 is open; PRs #3559 and #4355 are unmerged), and the
//! AMQP clients connect on their own too. So right after each connect the caller has this module
//! walk the process's descriptors (`/proc/self/fd`) and arm every connected TCP socket that has
//! no keepalive yet. That is a handful of system calls per connect, never on a batch's path. A
//! descriptor closed and reused by another thread between the walk and the `setsockopt` is at
//! worst another socket of this process armed too, which is what the walk does anyway; a
//! descriptor that is no socket any more only fails the call, which is ignored.
//!
//! The bound is the process's `--dead-client-timeout`, set once at start
//! ([`set_process_bound`]); the server's side of the same bound is `database::session_bounds`.
//! Where `/proc` is missing (not Linux), nothing is armed.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::OnceLock;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive, Type};

use crate::defaults;

/// Keepalive probes that end within a bound: the first after a third of it, then three more at
/// equal steps over most of the rest, so the last goes unanswered within it. Whole seconds, as
/// PostgreSQL's `tcp_keepalives_*` settings and Linux's `TCP_KEEP*` options take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probes {
    pub idle_s: u64,
    pub interval_s: u64,
    pub count: u64,
}

/// Probes after an unanswered first one (PostgreSQL's `tcp_keepalives_count`, `TCP_KEEPCNT`).
const PROBES: u64 = 3;

impl Probes {
    /// The probes that notice a silent peer within `bound` (at least four seconds: one probe
    /// and three retries take whole seconds).
    pub fn within(bound: Duration) -> Self {
        let total = bound.as_secs().max(PROBES + 1);
        let idle_s = (total / 3).max(1);
        let interval_s = ((total - idle_s) / PROBES).max(1);
        Self {
            idle_s,
            interval_s,
            count: PROBES,
        }
    }
}

static PROCESS_BOUND: OnceLock<Duration> = OnceLock::new();

/// Sets the bound every later [`arm_new_sockets`] uses; the first call wins (one process, one
/// `--dead-client-timeout`). Without a call, [`defaults::DEAD_CLIENT_TIMEOUT`] applies.
pub fn set_process_bound(bound: Duration) {
    let _ = PROCESS_BOUND.set(bound);
}

fn process_bound() -> Duration {
    PROCESS_BOUND
        .get()
        .copied()
        .unwrap_or(defaults::DEAD_CLIENT_TIMEOUT)
}

/// Arms every connected TCP socket of this process that has no keepalive yet with the process's
/// bound; returns how many it armed.
pub fn arm_new_sockets() -> usize {
    arm_new_sockets_within(process_bound())
}

/// Arms one socket the caller opened itself with the process's bound (the AMQP 1.0 client takes
/// a stream); whether it was armed now.
pub fn arm(stream: &impl std::os::fd::AsFd) -> bool {
    let bound = process_bound();
    arm_socket(SockRef::from(stream), &keepalive_within(bound), bound)
}

/// [`arm_new_sockets`] with an explicit bound.
pub fn arm_new_sockets_within(bound: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let keepalive = keepalive_within(bound);
    let fds: Vec<RawFd> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut armed = 0;
    for fd in fds {
        // SAFETY: the descriptor is only used for getsockopt/setsockopt during this borrow. If
        // another thread closed it since the walk, the calls fail with EBADF, and if it was
        // reused they reach another descriptor of this process; neither touches memory, and
        // both outcomes are handled below (see the module's comment).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        if arm_socket(SockRef::from(&fd), &keepalive, bound) {
            armed += 1;
        }
    }
    armed
}

/// The socket option for [`Probes::within`] `bound`.
fn keepalive_within(bound: Duration) -> TcpKeepalive {
    let probes = Probes::within(bound);
    TcpKeepalive::new()
        .with_time(Duration::from_secs(probes.idle_s))
        .with_interval(Duration::from_secs(probes.interval_s))
        .with_retries(probes.count as u32)
}

/// Arms `socket` if it is a connected TCP socket without keepalive; whether it did.
fn arm_socket(socket: SockRef<'_>, keepalive: &TcpKeepalive, bound: Duration) -> bool {
    let is_connected_tcp = socket.r#type().is_ok_and(|kind| kind == Type::STREAM)
        && socket
            .peer_addr()
            .is_ok_and(|peer| peer.as_socket().is_some());
    if !is_connected_tcp || socket.keepalive().unwrap_or(true) {
        return false;
    }
    // TCP_USER_TIMEOUT bounds a connection with data in flight, which the kernel does not probe
    // but retransmits to for about fifteen minutes; keepalives bound an idle one.
    socket.set_tcp_keepalive(keepalive).is_ok() && socket.set_tcp_user_timeout(Some(bound)).is_ok()
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn the_probes_end_within_the_bound() {
        for bound in [1, 2, 4, 5, 10, 15, 16, 30, 60, 600] {
            let p = Probes::within(Duration::from_secs(bound));
            let noticed = p.idle_s + p.interval_s * p.count;
            assert!(
                noticed <= bound.max(PROBES + 1),
                "{bound}s: probes end at {noticed}s ({p:?})"
            );
            assert!(p.idle_s >= 1 && p.interval_s >= 1, "{p:?}");
        }
        assert_eq!(
            Probes::within(Duration::from_secs(15)),
            Probes {
                idle_s: 5,
                interval_s: 3,
                count: 3
            }
        );
    }

    #[test]
    fn a_connection_is_armed_once_and_a_listener_never() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let bound = Duration::from_secs(9);
        let keepalive = keepalive_within(bound);

        for stream in [&client, &accepted] {
            assert!(arm_socket(SockRef::from(stream), &keepalive, bound));
            let socket = SockRef::from(stream);
            assert!(socket.keepalive().unwrap());
            assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(3));
            assert_eq!(
                socket.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(2)
            );
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
            assert_eq!(socket.tcp_user_timeout().unwrap(), Some(bound));
            // Armed is left as it is.
            assert!(!arm_socket(SockRef::from(stream), &keepalive, bound));
        }
        assert!(!arm_socket(SockRef::from(&listener), &keepalive, bound));
        assert!(!SockRef::from(&listener).keepalive().unwrap());
    }

    #[test]
    fn the_walk_finds_a_new_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        assert!(!SockRef::from(&client).keepalive().unwrap());
        // At least this test's two ends (other tests' sockets may be armed beside them).
        assert!(arm_new_sockets_within(Duration::from_secs(9)) >= 1);
        assert!(SockRef::from(&client).keepalive().unwrap());
    }
}
