//! What a node needs from the machine, checked before anything starts, so a machine that cannot
//! run one gets one line naming what is missing and how to get it, not a kubelet log.

use std::path::Path;

use anyhow::bail;

use super::containerd::CNI_BIN_DIR;

/// Programs the node runs, with the Debian package that has each.
const PROGRAMS: &[(&str, &str)] = &[
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("iptables", "iptables"),
    ("ip", "iproute2"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("buildah", "buildah"),
];

const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback"];

pub fn check() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the tests' Kubernetes node needs root (namespaces, cgroups, a bridge and iptables): run make test as root"
        );
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir() {
        bail!(
            "the tests' Kubernetes node needs the cgroup v1 memory controller at /sys/fs/cgroup/memory, which this machine does not have"
        );
    }
    let mut missing: Vec<&str> = Vec::new();
    let mut packages: Vec<&str> = Vec::new();
    for (program, package) in PROGRAMS {
        if !on_path(program) {
            missing.push(program);
            packages.push(package);
        }
    }
    for plugin in CNI_PLUGINS {
        if !Path::new(CNI_BIN_DIR).join(plugin).exists() {
            missing.push(plugin);
            packages.push("containernetworking-plugins");
        }
    }
    if !missing.is_empty() {
        packages.dedup();
        bail!(
            "the tests' Kubernetes node needs {} (apt-get install {}; .ci/run installs them)",
            missing.join(", "),
            packages.join(" ")
        );
    }
    crate::services::check_address()?;
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}
