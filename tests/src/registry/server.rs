//! An OCI registry process (Debian's docker-registry, the distribution project's registry 2.8):
//! plain HTTP on one address of this machine, no authentication, its blobs under `DIR/data`,
//! its configuration `DIR/config.yml`, its log `DIR/registry.log` and its pid `DIR/registry.pid`
//! (so that a registry left running, `make dist`'s, is found again). One per folder.
//! Installing docker-registry is `scripts/services.sh install-registry`'s, the one place that
//! installs servers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon;

/// How long a started registry has to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stopped registry has to exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

fn pid_file(dir: &Path) -> PathBuf {
    dir.join("registry.pid")
}

fn config_file(dir: &Path) -> PathBuf {
    dir.join("config.yml")
}

/// The registry's configuration: storing under `dir/data`, listening on `at`.
fn config_yml(dir: &Path, at: SocketAddr) -> String {
    format!(
        "version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: {at}
  # One registry behind no balancer: a fixed secret only quiets its warning about a random one.
  secret: outbox-relay-local-registry
",
        data = dir.join("data").display()
    )
}

/// Whether a registry answers `GET /v2/` on `at` (curl, which docker-registry's installation
/// brings).
pub fn answers(at: SocketAddr) -> bool {
    Command::new("curl")
        .args(["-fsS", "-o", "/dev/null", "--max-time", "2"])
        .arg(format!("http://{at}/v2/"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The registry of `dir` when it runs (its command line names its configuration).
fn running_pid(dir: &Path) -> Option<i32> {
    daemon::running(&pid_file(dir), config_file(dir).as_os_str())
}

/// `scripts/services.sh install-registry` when docker-registry or curl is missing.
fn install() -> Result<(), String> {
    let present = |program: &str| {
        Command::new("sh")
            .args(["-c", "command -v \"$1\" >/dev/null", "_", program])
            .status()
            .is_ok_and(|status| status.success())
    };
    if present("docker-registry") && present("curl") {
        return Ok(());
    }
    let script = crate::repo_root().join("scripts/services.sh");
    let status = Command::new(&script)
        .arg("install-registry")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err("docker-registry could not be installed; the lines above say why".into())
    }
}

/// Starts a registry storing under `dir` on `at`, or finds the one `dir` has running there;
/// returns once it answers. In a session of its own: a caller's Ctrl-C does not take it down
/// half-written, and `make dist`'s outlives the command that started it.
pub fn start(dir: &Path, at: SocketAddr) -> Result<(), String> {
    std::fs::create_dir_all(dir.join("data"))
        .map_err(|e| format!("create {}: {e}", dir.display()))?;
    let dir = &std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if running_pid(dir).is_some() {
        if answers(at) {
            eprintln!("services: the registry of {} is up on {at}", dir.display());
            return Ok(());
        }
        return Err(format!(
            "{}'s registry runs but does not answer on {at} (started on another port?): stop it first",
            dir.display()
        ));
    }
    if answers(at) {
        return Err(format!("something else answers on {at}; pick another port"));
    }
    install()?;
    let config = config_file(dir);
    std::fs::write(&config, config_yml(dir, at))
        .map_err(|e| format!("write {}: {e}", config.display()))?;
    let log_path = dir.join("registry.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("open {}: {e}", log_path.display()))?;
    let stderr = log
        .try_clone()
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let pid = daemon::spawn(
        Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr),
        &pid_file(dir),
    )?;
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if answers(at) {
            eprintln!(
                "services: an OCI registry on {at} (plain HTTP), storing under {}",
                dir.join("data").display()
            );
            return Ok(());
        }
        if !daemon::alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "the registry did not answer on {at}; its log ({}) ends:\n{}",
        log_path.display(),
        daemon::log_tail(&log_path, 20)
    ))
}

/// Stops the registry of `dir` when it runs (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]),
/// keeping what it stores.
pub fn stop(dir: &Path) {
    let Ok(dir) = std::path::absolute(dir) else {
        return;
    };
    if let Some(pid) = running_pid(&dir) {
        daemon::stop(pid, libc::SIGTERM, STOP_TIMEOUT, &pid_file(&dir));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_stores_in_the_folder_and_listens_where_asked() {
        let config = config_yml(
            Path::new("/c/registry"),
            SocketAddr::from(([10, 213, 0, 1], 5050)),
        );
        assert!(
            config.contains("    rootdirectory: /c/registry/data\n"),
            "{config}"
        );
        assert!(config.contains("  addr: 10.213.0.1:5050\n"), "{config}");
    }
}
