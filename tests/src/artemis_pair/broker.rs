//! A member's broker process: started from its instance (`bin/artemis run`) in a session of its
//! own, found again by its pid file (`data/artemis.pid`, as scripts/services/artemis.sh keeps
//! the private brokers'), stopped by a signal, and the waits for it to answer. Blocking: the
//! pair's steps run off the async workers, and its `Drop` cannot await.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon;

/// How long a broker has to answer (Java starts slowly on a busy machine).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a signalled broker has to exit before it is killed. Polled finely: a failover test
/// times from the kill, and a SIGKILLed broker is gone at once.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a backup logs once it waits for its primary's lock on the shared store.
const BACKUP_WAITING: &str = "AMQ221109";

fn pid_file(instance: &Path) -> PathBuf {
    instance.join("data/artemis.pid")
}

/// The console log of the broker of `instance`.
pub fn console_log(instance: &Path) -> PathBuf {
    instance.join("log/console.log")
}

/// Starts the broker of `instance`, its console in `log/console.log`, its pid in
/// `data/artemis.pid`.
pub fn launch(instance: &Path) -> Result<(), String> {
    for folder in ["data", "log"] {
        let path = instance.join(folder);
        std::fs::create_dir_all(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
    }
    let log = console_log(instance);
    let console = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let stderr = console
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    daemon::spawn(
        Command::new(instance.join("bin/artemis"))
            .arg("run")
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(stderr),
        &pid_file(instance),
    )
    .map(|_pid| ())
}

/// The broker of `instance` when it runs (its command line names the instance).
fn running_pid(instance: &Path) -> Option<i32> {
    daemon::running(&pid_file(instance), instance.as_os_str())
}

/// Stops the broker of `instance` when it runs: SIGTERM (a graceful shutdown), or SIGKILL (a
/// crash) when `kill`; killed anyway after [`STOP_TIMEOUT`].
pub fn stop(instance: &Path, kill: bool) {
    let signal = if kill { libc::SIGKILL } else { libc::SIGTERM };
    match running_pid(instance) {
        Some(pid) => daemon::stop(pid, signal, STOP_TIMEOUT, &pid_file(instance)),
        None => {
            let _ = std::fs::remove_file(pid_file(instance));
        }
    }
}

/// Whether 127.0.0.1:`port` answers the AMQP 1.0 SASL protocol header with an AMQP 1.0 header
/// of its own (as scripts/services/common.sh's `amqp10_up` asks).
pub fn amqp10_up(port: u16) -> bool {
    let timeout = Duration::from_secs(5);
    let answer = || -> std::io::Result<[u8; 5]> {
        let mut stream =
            TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(b"AMQP\x03\x01\x00\x00")?;
        let mut reply = [0; 5];
        stream.read_exact(&mut reply)?;
        Ok(reply)
    };
    answer().is_ok_and(|reply| &reply == b"AMQP\x03")
}

/// Waits until `ready` holds for the broker of `instance`; `Err(what)` with its console's end
/// when it does not within [`START_TIMEOUT`], or when its process is gone (after 2 s: its pid
/// file is written as it starts).
fn wait(instance: &Path, what: &str, ready: impl Fn() -> bool) -> Result<(), String> {
    let started = Instant::now();
    loop {
        if ready() {
            return Ok(());
        }
        let gone = started.elapsed() > Duration::from_secs(2) && running_pid(instance).is_none();
        if gone || started.elapsed() > START_TIMEOUT {
            return Err(format!(
                "{what}; its console ({}) ends:\n{}",
                console_log(instance).display(),
                daemon::log_tail(&console_log(instance), 30)
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Waits until the primary of `instance` answers AMQP 1.0 on `port`.
pub fn wait_answering(instance: &Path, port: u16) -> Result<(), String> {
    wait(
        instance,
        &format!(
            "the Artemis primary in {} did not answer on 127.0.0.1:{port}",
            instance.display()
        ),
        || amqp10_up(port),
    )
}

/// Waits until the backup of `instance` says it waits for its primary (it does not listen
/// until then, nor after: its acceptors start when it activates).
pub fn wait_backing_up(instance: &Path) -> Result<(), String> {
    wait(
        instance,
        &format!(
            "the Artemis backup in {} did not start waiting for its primary ({BACKUP_WAITING})",
            instance.display()
        ),
        || {
            std::fs::read_to_string(console_log(instance))
                .is_ok_and(|console| console.contains(BACKUP_WAITING))
        },
    )
}
