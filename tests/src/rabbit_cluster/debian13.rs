//! The Debian 13 root that RabbitMQ 4.0 runs from (Erlang 27 needs Debian 13's C library, which
//! this Debian 12 host lacks): made and cached by `scripts/services.sh rabbitmq4-root`
//! (scripts/services/rabbitmq4.sh, the single RabbitMQ 4 node's script, which keys it by its
//! inputs), and entered here the way that script's `r4_enter` does: chroot, in a mount namespace
//! of the process's own where /proc and (read-only) /sys are mounted, the host's /etc/hosts and
//! /etc/resolv.conf are bound in, and the cluster's folder is bound at /outbox. The root itself
//! is only read, and every mount goes with the namespace's last process.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where the cluster's folder is seen inside the root.
pub(super) const DATA: &str = "/outbox";

/// The root's folder. The first call of a process asks `scripts/services.sh rabbitmq4-root`,
/// which makes the root when it is missing (over a minute, once per machine and stamp) under the
/// RabbitMQ 4 script's lock; it blocks meanwhile, so call it off the async workers first.
pub(super) fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let output = Command::new(crate::repo_root().join("scripts/services.sh"))
            .arg("rabbitmq4-root")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run scripts/services.sh rabbitmq4-root: {e}"));
        assert!(
            output.status.success(),
            "scripts/services.sh rabbitmq4-root failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let root = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        assert!(
            root.join("outbox-packages").is_file(),
            "scripts/services.sh rabbitmq4-root printed {root:?}, which is no made root"
        );
        root
    })
}

/// Makes `command` (a program path inside the root) run inside `root`, with `data` at
/// [`DATA`]: the mounts and the chroot happen in the child, between fork and exec.
pub(super) fn enter(command: &mut Command, root: &Path, data: &Path) {
    let path = |inside: &str| {
        let mut bytes = root.as_os_str().as_bytes().to_vec();
        bytes.extend_from_slice(inside.as_bytes());
        CString::new(bytes).expect("a path without NUL")
    };
    let host = |path: &Path| CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    // Made here, not in the child: between fork and exec nothing may allocate.
    let mounts = [
        Mount::new(c"proc", path("/proc"), Some(c"proc"), 0),
        Mount::new(c"sysfs", path("/sys"), Some(c"sysfs"), libc::MS_RDONLY),
        Mount::bind(c"/etc/hosts", path("/etc/hosts")),
        Mount::bind(c"/etc/resolv.conf", path("/etc/resolv.conf")),
        Mount::bind_owned(host(data), path(DATA)),
    ];
    let root = host(root);
    // SAFETY: only system calls (unshare, mount, chroot, chdir) on strings made before the fork.
    unsafe {
        command.pre_exec(move || {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing mounted here reaches the host's namespace.
            check(libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for mount in &mounts {
                mount.apply()?;
            }
            check(libc::chroot(root.as_ptr()))?;
            check(libc::chdir(c"/".as_ptr()))?;
            Ok(())
        });
    }
}

/// One mount(2) call, its strings made in advance.
struct Mount {
    source: CString,
    target: CString,
    kind: Option<&'static std::ffi::CStr>,
    flags: libc::c_ulong,
}

impl Mount {
    fn new(
        source: &std::ffi::CStr,
        target: CString,
        kind: Option<&'static std::ffi::CStr>,
        flags: libc::c_ulong,
    ) -> Self {
        Self {
            source: source.to_owned(),
            target,
            kind,
            flags,
        }
    }

    fn bind(source: &std::ffi::CStr, target: CString) -> Self {
        Self::bind_owned(source.to_owned(), target)
    }

    fn bind_owned(source: CString, target: CString) -> Self {
        Self {
            source,
            target,
            kind: None,
            flags: libc::MS_BIND,
        }
    }

    /// # Safety
    /// Between fork and exec: a system call only.
    unsafe fn apply(&self) -> std::io::Result<()> {
        let kind = self.kind.map_or(std::ptr::null(), |kind| kind.as_ptr());
        // SAFETY: NUL-terminated strings owned by self, a null data pointer.
        check(unsafe {
            libc::mount(
                self.source.as_ptr(),
                self.target.as_ptr(),
                kind,
                self.flags,
                std::ptr::null(),
            )
        })
    }
}

/// A system call's result: 0 is success, anything else the error in errno.
fn check(result: libc::c_int) -> std::io::Result<()> {
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
