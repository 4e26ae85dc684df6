//! Debian's PostgreSQL 15 tools, as a standby pair runs them: `initdb`, `pg_ctl` and
//! `pg_basebackup` as the postgres user (the servers' files are its own), `psql` as the test,
//! over TCP. Blocking: the pair's steps run off the async workers
//! (`tokio::task::spawn_blocking`), and its `Drop` cannot await.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::conf::HOST;

/// Debian's PostgreSQL 15 (REFERENCE.md has the recipe and what a client sees in each fault).
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// How long `pg_ctl` waits for a start, stop or promotion.
const PG_CTL_WAIT_SECONDS: &str = "60";

/// The pair's steps need root: they run the servers as postgres and keep its files in root's
/// cache (the tests that use a pair run as root, as the node's do).
pub fn check() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "a standby pair runs PostgreSQL as the postgres user: run the test as root".into(),
        );
    }
    let basebackup = Path::new(BIN).join("pg_basebackup");
    if !basebackup.exists() {
        return Err(format!(
            "{} is missing: install Debian's postgresql-15 (apt-get install postgresql-15)",
            basebackup.display()
        ));
    }
    Ok(())
}

fn tool(name: &str) -> PathBuf {
    Path::new(BIN).join(name)
}

/// `program` run as postgres, from a folder it may enter.
fn as_postgres(program: &Path) -> Command {
    let mut command = Command::new("runuser");
    command
        .args(["-u", "postgres", "--"])
        .arg(program)
        .current_dir("/")
        .stdin(Stdio::null());
    command
}

/// Runs `command` with its output in `log` (made new); on failure, the log's last 20 lines
/// after `what`.
fn run_logged(command: &mut Command, log: &Path, what: &str) -> Result<(), String> {
    let file = std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    let stderr = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let status = command
        .stdout(file)
        .stderr(stderr)
        .status()
        .map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} (log: {}):\n{}", log.display(), tail(log)))
    }
}

/// Runs `command` quietly; `Err(what)` with its stderr when it fails.
fn run_quiet(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{what}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The last 20 lines of the file at `path`.
fn tail(path: &Path) -> String {
    crate::daemon::log_tail(path, 20)
}

/// The server log `pg_ctl` writes for data directory `data`: `DATA.log` beside it.
pub fn log_of(data: &Path) -> PathBuf {
    let mut log = data.as_os_str().to_owned();
    log.push(".log");
    log.into()
}

/// The server's version, `15.x` (the template is made once per version).
pub fn version() -> Result<String, String> {
    let output = Command::new(tool("pg_config"))
        .arg("--version")
        .output()
        .map_err(|e| format!("pg_config --version: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .strip_prefix("PostgreSQL ")
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .ok_or_else(|| format!("pg_config --version said {text:?}"))
}

/// The arguments the template is made with, after `-D DATA` (part of its cache key). Trust:
/// the servers listen on this machine's own addresses only. No sync: throw-away servers.
pub const INITDB_ARGS: [&str; 8] = [
    "-U",
    "postgres",
    "-E",
    "UTF8",
    "--locale=C.UTF-8",
    "-A",
    "trust",
    "--no-sync",
];

/// `initdb` into `data` (its output in `DATA.initdb.log`).
pub fn initdb(data: &Path) -> Result<(), String> {
    let mut log = data.as_os_str().to_owned();
    log.push(".initdb.log");
    run_logged(
        as_postgres(&tool("initdb"))
            .arg("-D")
            .arg(data)
            .args(INITDB_ARGS),
        Path::new(&log),
        "initdb failed",
    )
}

/// Starts the server of `data` (its port is in its outbox-pair.conf) and waits until it
/// accepts connections.
pub fn start(data: &Path) -> Result<(), String> {
    let log = log_of(data);
    let status = as_postgres(&tool("pg_ctl"))
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", PG_CTL_WAIT_SECONDS, "start"])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("run pg_ctl: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the server in {} did not start (log: {}):\n{}",
            data.display(),
            log.display(),
            tail(&log)
        ))
    }
}

/// Whether the server of `data` runs (`pg_ctl status`).
pub fn running(data: &Path) -> bool {
    as_postgres(&tool("pg_ctl"))
        .arg("-D")
        .arg(data)
        .arg("status")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Stops the server of `data` with `mode` (`fast`, `immediate`) when it runs.
pub fn stop(data: &Path, mode: &str) -> Result<(), String> {
    if !running(data) {
        return Ok(());
    }
    run_quiet(
        as_postgres(&tool("pg_ctl")).arg("-D").arg(data).args([
            "-m",
            mode,
            "-w",
            "-t",
            PG_CTL_WAIT_SECONDS,
            "stop",
        ]),
        &format!("the server in {} did not stop (-m {mode})", data.display()),
    )
}

/// The server of `data` becomes a primary; `pg_ctl -w promote` returns once it accepts writes.
pub fn promote(data: &Path) -> Result<(), String> {
    run_quiet(
        as_postgres(&tool("pg_ctl")).arg("-D").arg(data).args([
            "-w",
            "-t",
            PG_CTL_WAIT_SECONDS,
            "promote",
        ]),
        &format!(
            "the server in {} was not promoted (log: {})",
            data.display(),
            log_of(data).display()
        ),
    )
}

/// The server of `data` reads its settings again.
pub fn reload(data: &Path) -> Result<(), String> {
    run_quiet(
        as_postgres(&tool("pg_ctl"))
            .arg("-D")
            .arg(data)
            .arg("reload"),
        &format!("pg_ctl reload of {}", data.display()),
    )
}

/// A base backup of the primary on `port` into `data`, set up to stream from it (`-R`), its
/// output in `log`.
pub fn basebackup(port: u16, data: &Path, log: &Path) -> Result<(), String> {
    run_logged(
        as_postgres(&tool("pg_basebackup"))
            .arg("-h")
            .arg(HOST.to_string())
            .arg("-p")
            .arg(port.to_string())
            .args(["-U", "postgres", "-D"])
            .arg(data)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]),
        log,
        "pg_basebackup failed",
    )
}

/// Whether postgres may write in `dir` (the folders above it must let it in).
pub fn may_write(dir: &Path) -> bool {
    as_postgres(Path::new("test"))
        .arg("-w")
        .arg(dir)
        .status()
        .is_ok_and(|status| status.success())
}

/// `sql`'s result on the server on `port`, database `database`, as `psql -At` prints it.
pub fn query(port: u16, database: &str, sql: &str) -> Result<String, String> {
    let output = Command::new("psql")
        .arg("-h")
        .arg(HOST.to_string())
        .arg("-p")
        .arg(port.to_string())
        .args([
            "-U",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-Atq",
            "-d",
            database,
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run psql: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(format!(
            "psql on {port}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The postgres user's uid and gid, for files the test writes into its servers' folders.
fn postgres_ids() -> Result<(u32, u32), String> {
    let name = std::ffi::CString::new("postgres").expect("no NUL in a literal");
    // SAFETY: getpwnam reads a NUL-terminated name; its result is read at once, before any
    // other call could overwrite the static buffer it points into.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err("there is no postgres user: install Debian's postgresql-15".into());
    }
    // SAFETY: entry is a valid passwd entry (checked above).
    Ok(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
}

/// Makes `path` postgres's own.
pub fn give_to_postgres(path: &Path) -> Result<(), String> {
    let (uid, gid) = postgres_ids()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| format!("chown postgres {}: {e}", path.display()))
}

/// Writes `text` to `path` as a file of postgres's own (as `runuser -u postgres tee` would).
pub fn write_as_postgres(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    give_to_postgres(path)
}

/// How long [`wait_sync`] waits for the standby.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until the primary on `port` has the standby as its synchronous standby; `dir`, the
/// pair's folder, is for the message.
pub fn wait_sync(port: u16, dir: &Path) -> Result<(), String> {
    let sql = format!(
        "select sync_state from pg_stat_replication where application_name = '{}'",
        super::conf::STANDBY_NAME
    );
    let deadline = std::time::Instant::now() + SYNC_TIMEOUT;
    loop {
        let state = query(port, "postgres", &sql).unwrap_or_default();
        if state == "sync" {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the primary on {port} has no synchronous standby (sync_state '{state}'; logs {}/*.log)",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
