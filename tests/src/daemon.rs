//! Servers a fixture starts in a session of their own and finds again by the pid file written
//! as they start (an Artemis pair's brokers, a registry): a test's Ctrl-C does not take them
//! down half-way, one left running by a killed test (or on purpose, `make dist`'s registry) is
//! found and stopped by the next, and a pid file that outlived its process is not believed.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Starts `command` in a session of its own (as the shell's `setsid` did) and writes its pid to
/// `pid_file`. The process is reaped as soon as it exits, so that a stop sees it gone (a zombie
/// still answers `kill 0`); nothing else waits for it.
pub fn spawn(command: &mut Command, pid_file: &Path) -> Result<i32, String> {
    // SAFETY: setsid(2) is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = command
        .spawn()
        .map_err(|e| format!("start {:?}: {e}", command.get_program()))?;
    let pid = child.id() as i32;
    std::fs::write(pid_file, format!("{pid}\n"))
        .map_err(|e| format!("write {}: {e}", pid_file.display()))?;
    std::thread::spawn(move || child.wait());
    Ok(pid)
}

/// The pid in `pid_file` when that process still runs and its command line holds `mark` (a
/// path of its own: a pid file can outlive its process, and the pid be reused).
pub fn running(pid_file: &Path, mark: &OsStr) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mark = mark.as_encoded_bytes();
    cmdline
        .windows(mark.len())
        .any(|window| window == mark)
        .then_some(pid)
}

/// Whether process `pid` exists.
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Sends `signal` to `pid` and waits up to `timeout` for it to exit, polling finely (a
/// failover test times from a kill); then SIGKILL. Removes `pid_file`.
pub fn stop(pid: i32, signal: i32, timeout: Duration, pid_file: &Path) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe { libc::kill(pid, signal) };
    let deadline = Instant::now() + timeout;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if alive(pid) {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = std::fs::remove_file(pid_file);
}

/// The last `lines` lines of the log at `path` ("" when it cannot be read), for a message.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
