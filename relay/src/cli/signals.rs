//! The signals of `run`, listened for before the async runtime exists: SIGTERM and SIGINT
//! stop the relay (the batches in flight finish), SIGUSR1 suspends delivery and SIGUSR2
//! resumes it (see `runtime::suspend`).
//!
//! Signals rather than an endpoint on the metrics port: that port is often reachable by
//! whatever scrapes it, and has no authentication; a signal takes the rights of the process's
//! owner, as SIGTERM already does.
//!
//! A pod stopped while it starts up must stop cleanly, not die of the signal's default action.
//! Listening from inside the multi-threaded runtime leaves a window: tokio installs the
//! process's handler first and subscribes the listener after, and a runtime worker parked on
//! the I/O driver can take a signal that lands in between and broadcast it to nobody (seen
//! under load in CI). Here the listeners are made on a thread of their own, with a
//! current-thread runtime, before any other runtime exists: nothing can broadcast until that
//! thread's future yields, which is after every listener is in place.
//!
//! One more window sits inside the registration itself: signal-hook-registry (under tokio)
//! installs the process's handler before it stores the action the handler calls, and a signal
//! landing in between is dropped as if it were ignored (seen in CI: SIGTERM sent the moment
//! `/proc/<pid>/status` showed it caught was lost). So the four signals are blocked while the
//! listeners are made: one that arrives then stays pending and is delivered when the mask is
//! restored, to a handler that is complete by then. (SIGUSR1's default action ends the process,
//! so one sent in that window would otherwise kill a relay that meant to listen for it.)

use std::sync::mpsc;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::runtime::suspend::{Suspension, switch};

/// What the signals of `run` steer.
pub struct Signals {
    /// Cancelled by the first SIGTERM or SIGINT.
    pub shutdown: CancellationToken,
    /// Suspended by SIGUSR1, resumed by SIGUSR2.
    pub suspension: Suspension,
}

/// Returns what the signals steer, once all four are being listened for.
pub fn listen() -> std::io::Result<Signals> {
    // The signal thread inherits the block; it is lifted here (on the only other thread) once
    // every listener exists.
    let _held = HeldSignals::block()?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    let (suspend_switch, suspension) = switch();
    let (ready, is_ready) = mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let listeners = (|| {
                    Ok::<_, std::io::Error>((
                        signal(SignalKind::terminate())?,
                        signal(SignalKind::interrupt())?,
                        signal(SignalKind::user_defined1())?,
                        signal(SignalKind::user_defined2())?,
                    ))
                })();
                let (mut term, mut interrupt, mut suspend, mut resume) = match listeners {
                    Ok(listeners) => listeners,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                // A second SIGTERM is caught and ignored: the batches in flight finish.
                loop {
                    tokio::select! {
                        _ = term.recv() => cancel.cancel(),
                        _ = interrupt.recv() => cancel.cancel(),
                        _ = suspend.recv() => suspend_switch.set(true),
                        _ = resume.recv() => suspend_switch.set(false),
                    }
                }
            });
        })?;
    is_ready
        .recv()
        .map_err(|_| std::io::Error::other("the signal thread ended before listening"))??;
    Ok(Signals {
        shutdown: token,
        suspension,
    })
}

/// SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 blocked on the calling thread until dropped, when its previous mask is
/// restored (and a signal that arrived meanwhile is delivered).
struct HeldSignals {
    previous: libc::sigset_t,
}

impl HeldSignals {
    fn block() -> std::io::Result<Self> {
        // SAFETY: sigset_t is plain data that sigemptyset initialises; sigaddset and
        // pthread_sigmask only read and write the sets passed by pointer, which live on this
        // stack frame for the whole call.
        unsafe {
            let mut held: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut held);
            libc::sigaddset(&mut held, libc::SIGTERM);
            libc::sigaddset(&mut held, libc::SIGINT);
            libc::sigaddset(&mut held, libc::SIGUSR1);
            libc::sigaddset(&mut held, libc::SIGUSR2);
            match libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut previous) {
                0 => Ok(Self { previous }),
                errno => Err(std::io::Error::from_raw_os_error(errno)),
            }
        }
    }
}

impl Drop for HeldSignals {
    fn drop(&mut self) {
        // SAFETY: `previous` is the mask pthread_sigmask filled in `block`; restoring it only
        // changes this thread's mask.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut());
        }
    }
}
