//! A pair's folder as a whole: `DIR/primary` and `DIR/backup` (instances kept for the next
//! pair), both with their journal in `DIR/shared`, started fresh; and both killed with the
//! journal emptied.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{Member, broker, member};

/// Where Artemis is installed: by `scripts/services.sh artemis-home`, which downloads it once
/// into the cache as it does for the tests' shared broker (the one place that installs servers).
fn home() -> Result<PathBuf, String> {
    static HOME: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HOME.get_or_init(|| {
        crate::process::path_printed_by(
            &crate::repo_root().join("scripts/services.sh"),
            &[std::ffi::OsStr::new("artemis-home")],
            "ActiveMQ Artemis could not be installed (it comes from Maven Central); the lines above say why",
        )
    })
    .clone()
}

/// The instance folder of `member` in the pair's folder `dir`.
pub fn instance(dir: &Path, member: Member) -> PathBuf {
    dir.join(member.name())
}

/// Kills both members and empties the journal; the instances stay, for the next pair.
pub fn remove(dir: &Path) {
    broker::stop(&instance(dir, Member::Backup), true);
    broker::stop(&instance(dir, Member::Primary), true);
    let _ = std::fs::remove_dir_all(dir.join("shared"));
}

/// Kills what a pair left in `dir`, then makes (once) and starts the primary, answering AMQP
/// 1.0 on 127.0.0.1:`primary_port`, and the backup, waiting for the primary's lock on the
/// journal. A waiting backup does not listen at all: a connect to `backup_port` is refused
/// until the primary is gone. It activates when it gets the lock: at once when the primary dies
/// (the kernel drops a dead process's file locks), and on a graceful stop (failover-on-shutdown).
pub fn make(dir: &Path, primary_port: u16, backup_port: u16) -> Result<(), String> {
    let home = home()?;
    remove(dir);
    let shared = dir.join("shared");
    let members = [
        (Member::Primary, primary_port, backup_port),
        (Member::Backup, backup_port, primary_port),
    ];
    for (which, port, other) in members {
        member::Instance {
            role: which.name(),
            port,
            other,
            shared: &shared,
        }
        .make(&home, &instance(dir, which))?;
    }
    std::fs::create_dir_all(&shared).map_err(|e| format!("create {}: {e}", shared.display()))?;
    let primary = instance(dir, Member::Primary);
    broker::launch(&primary)?;
    broker::wait_answering(&primary, primary_port)?;
    // Started second, so that the primary holds the store: the backup then says it waits.
    let backup = instance(dir, Member::Backup);
    broker::launch(&backup)?;
    broker::wait_backing_up(&backup)
}
