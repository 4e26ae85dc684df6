//! Another process's TCP connections and their keepalive options, read from the running
//! process: each of its descriptors is copied into this one with `pidfd_getfd(2)` (Linux 5.6;
//! it needs the right to ptrace the process, which a test has over a child it started as the
//! same user) and asked with `getsockopt`. `ss` shows a keepalive timer but not the probes'
//! settings nor `TCP_USER_TIMEOUT`, which are what a test of them must read.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use socket2::SockRef;

/// One connected TCP socket of the process, with the options that bound a silent peer.
#[derive(Debug)]
pub struct TcpConnection {
    pub peer: SocketAddr,
    pub keepalive: bool,
    pub idle: Duration,
    pub interval: Duration,
    pub probes: u32,
    pub user_timeout: Option<Duration>,
}

/// The connected TCP sockets of process `pid` at this moment.
pub fn tcp_connections_of(pid: i32) -> std::io::Result<Vec<TcpConnection>> {
    let pidfd = pidfd_open(pid)?;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Some(target_fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A descriptor closed since the listing is simply not there any more.
        let Ok(copy) = pidfd_getfd(&pidfd, target_fd) else {
            continue;
        };
        if let Some(connection) = describe(SockRef::from(&copy)) {
            found.push(connection);
        }
    }
    Ok(found)
}

fn describe(socket: SockRef<'_>) -> Option<TcpConnection> {
    if socket.r#type().ok()? != socket2::Type::STREAM {
        return None;
    }
    let peer = socket.peer_addr().ok()?.as_socket()?;
    Some(TcpConnection {
        peer,
        keepalive: socket.keepalive().ok()?,
        idle: socket.tcp_keepalive_time().ok()?,
        interval: socket.tcp_keepalive_interval().ok()?,
        probes: socket.tcp_keepalive_retries().ok()?,
        user_timeout: socket.tcp_user_timeout().ok()?,
    })
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes plain integers; a descriptor it returns is ours to own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_getfd(pidfd: &OwnedFd, target_fd: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd(2) takes plain integers; the copy it returns is ours to own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
