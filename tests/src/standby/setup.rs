//! A pair's folder and what is done to it as a whole: made fresh (`DIR/primary` and
//! `DIR/standby`, the primary's synchronous standby, logs `DIR/primary.log`,
//! `DIR/standby.log`), a server made again as the other's standby, and the folder removed with
//! both servers stopped. The folder's parent must be one the postgres user may enter.

use std::path::{Path, PathBuf};

use super::conf::{self, MARK, PAIR_CONF};
use super::{Server, pg, template};

/// The data directory of `server` in the pair's folder `dir`, which must hold a pair.
pub fn server_dir(dir: &Path, server: Server) -> Result<PathBuf, String> {
    if !dir.join(MARK).exists() {
        return Err(format!("{} holds no standby pair", dir.display()));
    }
    Ok(dir.join(server.name()))
}

/// Stops and removes what a pair left in `dir`, then makes the primary on 127.0.0.1:`primary_port`
/// and its synchronous standby on `standby_port` (both also on the services address, for the
/// pods); returns once the primary says the standby is synchronous.
pub fn make(dir: &Path, primary_port: u16, standby_port: u16) -> Result<(), String> {
    pg::check()?;
    remove(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
    pg::give_to_postgres(dir)?;
    std::fs::write(dir.join(MARK), "").map_err(|e| format!("mark {}: {e}", dir.display()))?;
    if !pg::may_write(dir) {
        return Err(format!(
            "the postgres user cannot write in {}: choose a folder whose parents it may enter (e.g. under /tmp)",
            dir.display()
        ));
    }
    let primary = dir.join(Server::Primary.name());
    let template = template::get(&primary, primary_port)?;
    if primary.exists() {
        std::fs::remove_dir_all(&primary)
            .map_err(|e| format!("remove {}: {e}", primary.display()))?;
    }
    template::copy_tree(&template, &primary)?;
    let _ = std::fs::remove_file(primary.join(MARK));
    pg::write_as_postgres(&primary.join(PAIR_CONF), &conf::primary_conf(primary_port))?;
    pg::start(&primary)?;
    let standby = dir.join(Server::Standby.name());
    pg::basebackup(primary_port, &standby, &dir.join("basebackup.log"))?;
    set_up_standby(&standby, standby_port)?;
    pg::start(&standby)?;
    pg::wait_sync(primary_port, dir)
}

/// The settings of a standby in `data` (made by pg_basebackup -R) on `port`.
fn set_up_standby(data: &Path, port: u16) -> Result<(), String> {
    pg::write_as_postgres(&data.join(PAIR_CONF), &conf::standby_conf(port))?;
    let auto = data.join("postgresql.auto.conf");
    let written =
        std::fs::read_to_string(&auto).map_err(|e| format!("read {}: {e}", auto.display()))?;
    let named = conf::name_the_standby(&written).ok_or_else(|| {
        format!(
            "pg_basebackup -R wrote no primary_conninfo in {}",
            auto.display()
        )
    })?;
    // Written in place: the file stays postgres's.
    std::fs::write(&auto, named).map_err(|e| format!("write {}: {e}", auto.display()))
}

/// `server` (down: killed, or a standby left behind) is made again as the synchronous standby
/// of the other, which must run as a primary: a new base backup of it (what pg_rewind would
/// spare on a large database), then the other waits for it at every commit again. After a
/// promotion and this, the two servers have swapped roles; each keeps its name and `ports`'
/// port (primary's, standby's).
pub fn rejoin(dir: &Path, server: Server, ports: (u16, u16)) -> Result<(), String> {
    let port_of = |server| match server {
        Server::Primary => ports.0,
        Server::Standby => ports.1,
    };
    let data = server_dir(dir, server)?;
    let source = server_dir(dir, server.other())?;
    let (port, source_port) = (port_of(server), port_of(server.other()));
    if pg::query(source_port, "postgres", "select pg_is_in_recovery()")? != "f" {
        return Err(format!(
            "the server on {source_port} is not a primary: promote it first"
        ));
    }
    pg::stop(&data, "immediate")?;
    std::fs::remove_dir_all(&data).map_err(|e| format!("remove {}: {e}", data.display()))?;
    pg::basebackup(source_port, &data, &dir.join("basebackup.log"))?;
    set_up_standby(&data, port)?;
    pg::start(&data)?;
    pg::write_as_postgres(&source.join(PAIR_CONF), &conf::primary_conf(source_port))?;
    pg::reload(&source)?;
    pg::wait_sync(source_port, dir)
}

/// Stops both servers at once (immediate) and removes `dir`; a folder that holds no pair is
/// left alone, and said.
pub fn remove(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.join(MARK).exists() {
        return Err(format!(
            "{} holds no standby pair: not removed",
            dir.display()
        ));
    }
    for server in [Server::Primary, Server::Standby] {
        let data = dir.join(server.name());
        if data.join("postmaster.pid").exists() {
            pg::stop(&data, "immediate")?;
        }
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("remove {}: {e}", dir.display()))
}
