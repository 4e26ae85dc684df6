//! What the fixtures that run a helper program as a child of the test share (the OpenTelemetry
//! Collector, Toxiproxy): the program built once by a script of `scripts/` that prints its path,
//! started with its output appended to a log file, and waited for until it accepts on its
//! loopback port. Each fixture keeps what is its own: its arguments, its readiness beyond
//! accepting, its files.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The program `script` (a path under the repository) builds and prints, built once per test
/// process (`built`, the caller's own cell) and once per machine thanks to the script's cache;
/// off the async workers, since a first build takes minutes. `failure` says what a failing
/// script means for the tests.
pub async fn built_by(
    built: &'static OnceLock<Result<PathBuf, String>>,
    script: &'static str,
    failure: &'static str,
) -> PathBuf {
    let path = tokio::task::spawn_blocking(move || {
        built
            .get_or_init(|| {
                crate::process::path_printed_by(&crate::repo_root().join(script), &[], failure)
            })
            .clone()
    })
    .await
    .expect("a build script's run does not panic");
    path.unwrap_or_else(|e| panic!("{e}"))
}

/// Starts `command` with stdin closed and stdout and stderr appended to `log`.
pub fn spawn_logged(command: &mut Command, log: &Path) -> Child {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
    let stdout = log_file
        .try_clone()
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(log_file))
        .spawn()
        .unwrap_or_else(|e| panic!("run {:?}: {e}", command.get_program()))
}

/// Waits until `child` accepts on 127.0.0.1:`port`. `Err` says why it did not (it exited, or
/// did not accept within `timeout`), with the process gone.
pub async fn until_accepting(
    child: &mut Child,
    port: u16,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status}) on port {port}"));
        }
        if tokio::time::Instant::now() >= deadline {
            stop(child);
            return Err(format!(
                "it did not accept on port {port} within {timeout:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills `child` and reaps it.
pub fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A port of 127.0.0.1 nobody listens on now.
pub fn free_loopback_port() -> u16 {
    crate::control_plane::free_port().expect("a free port on 127.0.0.1")
}
