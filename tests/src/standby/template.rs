//! The data directory every pair's primary is copied from: database `test` made by initdb and
//! one start, kept in the cache (initdb and CREATE DATABASE take seconds on a busy machine, each
//! pair's own), one per server version and per hash of the recipe ([`super::conf`]'s settings,
//! initdb's arguments), so that a change to either makes a new one.

use std::path::{Path, PathBuf};

use super::conf::{self, MARK, PAIR_CONF};
use super::pg;

/// The statement the template runs once, on its one start.
const CREATE_DATABASE: &str = "create database test";

/// Where the template for this server version and recipe is kept.
fn cache_path(version: &str) -> PathBuf {
    let key = crate::cache_key::of(&[
        &pg::INITDB_ARGS.join(" "),
        &conf::template_settings(),
        &conf::template_hba(),
        CREATE_DATABASE,
    ]);
    crate::cache_dir()
        .join("standby-pair")
        .join(format!("template-{key}-{version}"))
}

/// The template's path, made first when the cache lacks it: in `scratch` (a data directory
/// the caller then removes), with `port` free for the one start that creates the database.
pub fn get(scratch: &Path, port: u16) -> Result<PathBuf, String> {
    let version = pg::version()?;
    let cache = cache_path(&version);
    if cache.join(MARK).exists() {
        return Ok(cache);
    }
    eprintln!(
        "standby pair: a template data directory for PostgreSQL {version} in {}",
        cache.display()
    );
    pg::initdb(scratch)?;
    append(&scratch.join("postgresql.conf"), &conf::template_settings())?;
    append(&scratch.join("pg_hba.conf"), &conf::template_hba())?;
    pg::write_as_postgres(&scratch.join(PAIR_CONF), &format!("port = {port}\n"))?;
    pg::start(scratch)?;
    let created = pg::query(port, "postgres", CREATE_DATABASE);
    pg::stop(scratch, "fast")?;
    created?;
    let mut initdb_log = scratch.as_os_str().to_owned();
    initdb_log.push(".initdb.log");
    for leftover in [
        pg::log_of(scratch),
        initdb_log.into(),
        scratch.join(PAIR_CONF),
    ] {
        let _ = std::fs::remove_file(leftover);
    }
    // Copied under another name and renamed: a pair made meanwhile never copies half a
    // template. `cp -a` keeps postgres's ownership and modes.
    let parent = cache.parent().expect("the cache path has a parent");
    std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    // A name of this call's own: pairs of one test process may make it side by side.
    let copy = parent.join(crate::unique(
        &cache.file_name().expect("a file name").to_string_lossy(),
    ));
    copy_tree(scratch, &copy)?;
    std::fs::write(copy.join(MARK), "").map_err(|e| format!("mark {}: {e}", copy.display()))?;
    if std::fs::rename(&copy, &cache).is_err() {
        // Another test made it first: theirs is as good.
        let _ = std::fs::remove_dir_all(&copy);
    }
    Ok(cache)
}

/// `cp -a FROM TO`: the tree with its owners and modes.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .map_err(|e| format!("run cp: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cp -a {} {} failed", from.display(), to.display()))
    }
}

/// Appends `text` to the file at `path` (which keeps its owner).
fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("append to {}: {e}", path.display()))
}
