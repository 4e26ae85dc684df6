//! `outbox-relay run`.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::shared::{failure, init_logs, usage_error};
use crate::config::{RunArgs, resolve_run};
use crate::metrics::Metrics;
use crate::runtime::run;

/// Cancels the token on SIGTERM or SIGINT.
///
/// The listeners are registered here, synchronously, and not inside the spawned task: until
/// they exist a SIGTERM takes its default action and kills the process with no exit code, so a
/// pod stopped while it starts up would look like a crash. Call it before any other work.
fn on_signal(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

pub async fn command(args: RunArgs) -> ExitCode {
    let shutdown = CancellationToken::new();
    if let Err(e) = on_signal(shutdown.clone()) {
        return failure(format!("cannot listen for SIGTERM: {e}"));
    }
    let config = match resolve_run(&args) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    init_logs(config.log_format);
    match run::run(config, Metrics::new(), shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_user_error() => usage_error(e),
        Err(e) => failure(e),
    }
}
