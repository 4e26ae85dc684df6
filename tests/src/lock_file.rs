//! Lock files that tests hold while they use something shared between test processes (a
//! standby-pair slot, the RabbitMQ cluster). flock(2) locks belong to the open file, so two
//! opens conflict even within one process, and a lock goes with the process that held it: a
//! killed test leaves nothing to clean up.

use std::os::fd::AsRawFd as _;
use std::path::Path;

/// Opens (or creates) `path` and locks it: waits for the lock when `wait`, otherwise gives
/// `None` when someone else holds it.
pub fn lock(path: &Path, wait: bool) -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let flags = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock(2) takes a descriptor this File owns and plain flags.
    let locked = unsafe { libc::flock(file.as_raw_fd(), flags) } == 0;
    locked.then_some(file)
}
