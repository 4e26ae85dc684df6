//! Processes that die with the test process: every child is started with `PR_SET_PDEATHSIG`
//! (SIGKILL), so a panic, a timeout or a `kill -9` of the test binary takes its control plane,
//! node and relays with it.
//!
//! The kernel sends the parent-death signal when the *thread* that forked the child exits, not
//! the process. Test threads end with their test, so children that must outlive one test (the
//! control plane shared by a test binary) are forked by one spawner thread that lives as long
//! as the process.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Arranges for `command`'s process to get SIGKILL when the thread that spawns it exits.
pub fn die_with_parent(command: &mut Command) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl(2) and getppid(2) are async-signal-safe and touch only the child between
    // fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("parent exited before exec"));
            }
            Ok(())
        })
    }
}

/// Like `tokio::process::Command`'s spawn, for the async side: the child dies with the thread
/// that spawns it (a runtime worker, so with the test's runtime) or with the process.
pub fn die_with_parent_tokio(
    command: &mut tokio::process::Command,
) -> &mut tokio::process::Command {
    // SAFETY: as above.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Spawns `command` from the process-long spawner thread, so it lives until the test process
/// exits (or until it is killed), whichever test thread asked for it.
pub fn spawn_for_process_lifetime(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("process-lifetime-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(die_with_parent(&mut command).spawn());
                }
            })
            .expect("start the spawner thread");
        requests
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}
