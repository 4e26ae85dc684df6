//! SIGTERM and SIGINT for `run`: listened for before the async runtime exists.
//!
//! A pod stopped while it starts up must stop cleanly, not die of the signal's default action.
//! Listening from inside the multi-threaded runtime leaves a window: tokio installs the
//! process's handler first and subscribes the listener after, and a runtime worker parked on
//! the I/O driver can take a signal that lands in between and broadcast it to nobody (seen
//! under load in CI). Here the listeners are made on a thread of their own, with a
//! current-thread runtime, before any other runtime exists: nothing can broadcast until that
//! thread's future yields, which is after both listeners are in place.
//!
//! One more window sits inside the registration itself: signal-hook-registry (under tokio)
//! installs the process's handler before it stores the action the handler calls, and a signal
//! landing in between is dropped as if it were ignored (seen in CI: SIGTERM sent the moment
//! `/proc/<pid>/status` showed it caught was lost). So SIGTERM and SIGINT are blocked while the
//! listeners are made: one that arrives then stays pending and is delivered when the mask is
//! restored, to a handler that is complete by then.

use std::sync::mpsc;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Returns a token that the first SIGTERM or SIGINT cancels, once both are being listened for.
pub fn listen() -> std::io::Result<CancellationToken> {
    // The signal thread inherits the block; it is lifted here (on the only other thread) once
    // both listeners exist.
    let _held = HeldSignals::block()?;
    let token = CancellationToken::new();
    let cancel = token.clone();
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
                let listeners = signal(SignalKind::terminate())
                    .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
                let (mut term, mut interrupt) = match listeners {
                    Ok(listeners) => listeners,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
                cancel.cancel();
                // Later signals are still caught (and ignored): the batches in flight finish.
                std::future::pending::<()>().await;
            });
        })?;
    is_ready
        .recv()
        .map_err(|_| std::io::Error::other("the signal thread ended before listening"))??;
    Ok(token)
}

/// SIGTERM and SIGINT blocked on the calling thread until dropped, when its previous mask is
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
