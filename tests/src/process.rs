//! Real `outbox-relay` processes, started, killed and stopped like a kubelet would.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The workspace's `target/<profile>` folder, found from the running executable (a test in
/// `target/<profile>/deps/`, or a binary such as `outbox-chaos` in `target/<profile>/`), so the
/// relay built alongside it is the one used.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable has a folder");
    if dir.ends_with("deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

pub fn binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace --all-targets)",
        path.display()
    );
    path
}

/// The environment variable that moves [`log_path`]'s folder (`make cluster` keeps the logs of
/// its operator and pods next to its other files).
pub const LOG_DIR_ENV: &str = "OUTBOX_TEST_LOG_DIR";

/// Runs a setup script that prints a path on stdout (its progress goes to our stderr), as
/// `tests/control-plane/build.sh` and `scripts/helm-tools.sh` do; `failure` says what a
/// failing script means for the tests.
pub fn path_printed_by(
    script: &std::path::Path,
    args: &[&std::ffi::OsStr],
    failure: &str,
) -> Result<PathBuf, String> {
    let output = std::process::Command::new(script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!("{} failed: {failure}", script.display()));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}

/// Where a process's stderr goes, so a failing test can show the relay's own words:
/// `target/<profile>/test-logs/`, or the folder [`LOG_DIR_ENV`] names.
pub fn log_path(name: &str) -> PathBuf {
    let dir = std::env::var_os(LOG_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("test-logs"));
    std::fs::create_dir_all(&dir).expect("log dir");
    dir.join(format!("{name}.log"))
}

/// A relay log's lines at WARN or above (the text format's level column), and those of them a
/// library wrote rather than the relay: what a person grepping for trouble sees.
pub fn loud_lines(log: &str) -> (Vec<&str>, Vec<&str>) {
    let loud: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    let libraries = loud
        .iter()
        .copied()
        .filter(|line| !line.contains("outbox_relay"))
        .collect();
    (loud, libraries)
}

pub struct RelayProcess {
    pub child: Child,
    pub log: PathBuf,
}

/// `run` arguments for a test relay on `table` publishing to `exchange`: an ephemeral metrics
/// port and short poll and report intervals, then `extra`.
pub fn run_args<'a>(table: &'a str, exchange: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = run_args_without_exchange(table, &["--exchange", exchange]);
    args.extend_from_slice(extra);
    args
}

/// [`run_args`] without an exchange, for a broker named entirely by `extra` (AMQP 1.0).
pub fn run_args_without_exchange<'a>(table: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--table",
        table,
        "--metrics-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "50ms",
        "--report-interval",
        "1s",
    ];
    args.extend_from_slice(extra);
    args
}

/// Runs `outbox-relay <args>` with the test's database and broker URLs in the environment.
pub fn spawn_relay(name: &str, args: &[&str]) -> RelayProcess {
    spawn_relay_with_env(name, args, &[])
}

/// Like [`spawn_relay`], with these environment variables added.
pub fn spawn_relay_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
    spawn_relay_program(&binary("outbox-relay"), name, args, env)
}

/// Like [`spawn_relay_with_env`], with another build's `outbox-relay` (a previous release's).
pub fn spawn_relay_program(
    program: &std::path::Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> RelayProcess {
    let log = log_path(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("open log");
    let child = Command::new(program)
        .args(args)
        .env("DATABASE_URL", crate::database_url())
        .env("AMQP_URL", crate::amqp_url())
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn outbox-relay");
    RelayProcess { child, log }
}

/// Runs `outbox-relay <args>` to completion and returns (exit code, stdout, stderr).
pub async fn run_relay_command(args: &[&str]) -> (i32, String, String) {
    run_relay_command_with_env(args, &[]).await
}

/// `outbox-relay migrate --table <table> --notify` against the test's database: the migration
/// with the trigger that wakes LISTENing relays.
pub async fn migrate_with_notify(table: &str) -> (i32, String, String) {
    let url = crate::database_url();
    run_relay_command(&[
        "migrate",
        "--database-url",
        &url,
        "--table",
        table,
        "--notify",
    ])
    .await
}

/// Like [`run_relay_command`], with these environment variables set (and no inherited
/// `DATABASE_URL`/`AMQP_URL` unless given here).
pub async fn run_relay_command_with_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let output = Command::new(binary("outbox-relay"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run outbox-relay");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs an `outbox-relay` command that must stop at a setting (exit 2), and returns its stderr
/// after asserting that it says each of `says` and never shows `secret`.
pub async fn run_relay_refusing_settings(
    args: &[&str],
    env: &[(&str, &str)],
    says: &[&str],
    secret: &str,
) -> String {
    let (code, _, stderr) = run_relay_command_with_env(args, env).await;
    assert_eq!(code, 2, "{stderr}");
    for part in says {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    assert!(!stderr.contains(secret), "a secret in: {stderr}");
    stderr
}

impl RelayProcess {
    pub fn pid(&self) -> i32 {
        self.child.id().expect("process still running") as i32
    }

    /// SIGKILL: no chance to finish the batch in flight.
    pub async fn kill9(&mut self) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        let _ = self.child.wait().await;
    }

    /// Sends `signal` (e.g. `libc::SIGUSR1`) and returns at once.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// SIGTERM and wait for the exit code.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address of its /metrics server, once it logged it (within 20 s, else a panic with
    /// the log).
    pub async fn metrics_addr(&self) -> String {
        crate::wait::for_value(
            "the relay logs its metrics address",
            Duration::from_secs(20),
            || async { crate::http::metrics_addr(&self.log_text()) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}:\n{}", self.log_text()))
    }
}

/// Runs `command` (`kubectl apply -f -`, say) with `stdin` as its standard input, and returns
/// its exit status, stdout and stderr.
pub fn output_with_stdin(
    command: &mut std::process::Command,
    stdin: &str,
) -> std::io::Result<std::process::Output> {
    use std::io::Write as _;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Written from its own thread: a large input and a large output would block each other.
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_string();
    let writer = std::thread::spawn(move || input.write_all(stdin.as_bytes()));
    let output = child.wait_with_output()?;
    writer.join().expect("the stdin writer does not panic")?;
    Ok(output)
}
