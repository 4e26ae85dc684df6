//! A container's memory as the node's kernel counts it: the anonymous memory (`total_rss` of
//! cgroup v1's `memory.stat`) of the container's cgroup, which the kubelet (cgroupfs driver)
//! names after the container's id under the node's cgroup root. That is the memory a leak
//! grows, without the page cache a log file adds.

use std::path::{Path, PathBuf};

const MEMORY_HIERARCHY: &str = "/sys/fs/cgroup/memory";
/// kubepods / QoS class / pod / container: a container's cgroup is never deeper.
const MAX_DEPTH: usize = 5;

/// The cgroup directory named `name` under `dir`, searched depth first.
fn find_dir(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    if depth == 0 {
        return None;
    }
    let entries = std::fs::read_dir(dir).ok()?;
    let children: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    if let Some(found) = children
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == name))
    {
        return Some(found.clone());
    }
    children
        .iter()
        .find_map(|child| find_dir(child, name, depth - 1))
}

/// `total_rss` of a `memory.stat` text, in MiB.
fn total_rss_mib(stat: &str) -> Option<f64> {
    let bytes: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("total_rss "))?
        .trim()
        .parse()
        .ok()?;
    Some(bytes as f64 / (1024.0 * 1024.0))
}

/// The anonymous memory of container `container_id` (a pod's `containerID`, with or without
/// `containerd://`) on the node whose cgroup root is `cgroup_root`, in MiB; None when it has no
/// cgroup (not started, or gone).
pub fn container_rss_mib(cgroup_root: &str, container_id: &str) -> Option<f64> {
    let id = container_id
        .strip_prefix("containerd://")
        .unwrap_or(container_id);
    let root = Path::new(MEMORY_HIERARCHY).join(cgroup_root.trim_start_matches('/'));
    let dir = find_dir(&root, id, MAX_DEPTH)?;
    total_rss_mib(&std::fs::read_to_string(dir.join("memory.stat")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_rss_is_read_from_memory_stat() {
        let stat = "cache 4096\nrss 1048576\ntotal_cache 8192\ntotal_rss 3145728\n";
        assert_eq!(total_rss_mib(stat), Some(3.0));
        assert_eq!(total_rss_mib("cache 1\n"), None);
    }

    #[test]
    fn a_container_is_found_under_its_pod_and_qos_class() {
        let root = std::env::temp_dir().join(format!("soak-cgroups-{}", uuid::Uuid::new_v4()));
        let container = root.join("kubepods/burstable/pod1234/abcdef");
        std::fs::create_dir_all(&container).unwrap();
        std::fs::create_dir_all(root.join("kubepods/besteffort/pod99/other")).unwrap();
        assert_eq!(find_dir(&root, "abcdef", MAX_DEPTH), Some(container));
        assert_eq!(find_dir(&root, "missing", MAX_DEPTH), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
