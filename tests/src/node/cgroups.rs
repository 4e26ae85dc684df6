//! The node's cgroup root. Cgroups are not namespaced here (cgroup v1, no cgroup namespace):
//! every node's kubelet would put its `kubepods` tree at the top of each hierarchy and two nodes
//! would manage the same cgroups. Each node gets its own root, `outbox-node-<pid>-<id>` in every
//! v1 hierarchy, given to the kubelet as `cgroupRoot`. Empty cgroup directories outlive their
//! processes, so they are removed when the node stops, and roots of test processes that are
//! gone (killed before they could clean up) when the next node starts.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
const PREFIX: &str = "outbox-node-";

pub struct CgroupRoot {
    /// The root as the kubelet names it: `/outbox-node-<pid>-<id>`.
    pub name: String,
    /// Its directory in each hierarchy.
    dirs: Vec<PathBuf>,
}

/// The roots a node of process `pid` made, in every hierarchy (a process may have started
/// several nodes).
pub fn roots_of(pid: u32) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for hierarchy in hierarchies()? {
        for entry in std::fs::read_dir(&hierarchy)?.flatten() {
            if root_pid(&entry.file_name().to_string_lossy()) == Some(pid) {
                found.push(entry.path());
            }
        }
    }
    Ok(found)
}

/// Removes the roots of nodes whose process is gone (killed without a chance to clean up).
pub fn remove_stale() -> anyhow::Result<()> {
    for hierarchy in hierarchies()? {
        remove_stale_roots(&hierarchy);
    }
    Ok(())
}

impl CgroupRoot {
    pub fn create() -> anyhow::Result<CgroupRoot> {
        remove_stale()?;
        let hierarchies = hierarchies()?;
        let leaf = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let mut root = CgroupRoot {
            name: format!("/{leaf}"),
            dirs: Vec::new(),
        };
        for hierarchy in hierarchies {
            let dir = hierarchy.join(&leaf);
            std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
            root.dirs.push(dir.clone());
            // A new cpuset cgroup has no CPUs or memory nodes until given its parent's.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("write {}", dir.join(file).display()))?;
                }
            }
        }
        Ok(root)
    }
}

impl CgroupRoot {
    /// Its directory in each hierarchy.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for CgroupRoot {
    /// Runs after the node's processes got SIGKILL; the last of them may still be exiting.
    fn drop(&mut self) {
        let started = std::time::Instant::now();
        loop {
            for dir in &self.dirs {
                remove_tree(dir);
            }
            let left = self.dirs.iter().any(|dir| dir.exists());
            if !left || started.elapsed() > std::time::Duration::from_secs(10) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The v1 hierarchies: the directories under /sys/fs/cgroup (the `cpu` and `cpuacct` links to
/// `cpu,cpuacct` are the same hierarchy; the near-empty cgroup2 mount is not used here).
fn hierarchies() -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(CGROUP_MOUNT).context("read /sys/fs/cgroup")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() && name != "unified" {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Roots whose test process is gone.
fn remove_stale_roots(hierarchy: &Path) {
    let Ok(entries) = std::fs::read_dir(hierarchy) else {
        return;
    };
    for entry in entries.flatten() {
        if let Some(pid) = root_pid(&entry.file_name().to_string_lossy())
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            remove_tree(&entry.path());
        }
    }
}

/// The pid in a root's name, `outbox-node-<pid>-<id>`.
fn root_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Removes a cgroup directory and its children, deepest first (a cgroup directory goes with
/// rmdir once it has no children and no processes; its files cannot be unlinked).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
