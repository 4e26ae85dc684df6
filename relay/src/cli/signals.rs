//! SIGTERM and SIGINT for `run`: listened for before the async runtime exists.
//!
//! A pod stopped while it starts up must stop cleanly, not die of the signal's default action.
//! Listening from inside the multi-threaded runtime leaves a window: tokio installs the
//! process's handler first and subscribes the listener after, and a runtime worker parked on
//! the I/O driver can take a signal that lands in between and broadcast it to nobody (seen
//! under load in CI). Here the listeners are made on a thread of their own, with a
//! current-thread runtime, before any other runtime exists: nothing can broadcast until that
//! thread's future yields, which is after both listeners are in place.

use std::sync::mpsc;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Returns a token that the first SIGTERM or SIGINT cancels, once both are being listened for.
pub fn listen() -> std::io::Result<CancellationToken> {
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
