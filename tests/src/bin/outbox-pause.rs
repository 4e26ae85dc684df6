//! The pod sandbox ("pause") program of the tests' node, and the first process of the node's own
//! namespaces: it holds a namespace open by doing nothing, reaps the children the kernel hands
//! it (a pid namespace's first process inherits every orphan, e.g. containerd's shims), and
//! exits on SIGTERM or SIGINT. Nothing can be pulled on the test machines, so the sandbox image
//! that kubelets usually pull from a registry is built from this program (see `tests/src/node`).

fn main() {
    // SAFETY: plain signal-mask and wait calls on this process's own state.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut set, signal);
        }
        // Blocked and taken with sigwait: a pid namespace's first process gets no default
        // action for signals it has no handler for, so a handler-less TERM would be ignored.
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut signal = 0;
            if libc::sigwait(&set, &mut signal) != 0 {
                continue;
            }
            if signal == libc::SIGCHLD {
                while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            } else {
                std::process::exit(0);
            }
        }
    }
}
