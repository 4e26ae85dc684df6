//! `outbox-relay run`.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::shared::{failure, init_logs, usage_error};
use crate::config::{RunArgs, resolve_run};
use crate::connect::tcp_keepalive;
use crate::metrics::Metrics;
use crate::runtime::run;
use crate::runtime::suspend::Suspension;
use crate::telemetry::settings::otlp_target;

/// Runs the relay until `shutdown` is cancelled (by SIGTERM or SIGINT, see `signals`), with
/// delivery suspended while `suspension` says so (SIGUSR1 until SIGUSR2).
pub async fn command(
    args: RunArgs,
    shutdown: CancellationToken,
    suspension: Suspension,
) -> ExitCode {
    let config = match resolve_run(&args) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    let otlp = match otlp_target(|name| std::env::var(name).ok()) {
        Ok(otlp) => otlp,
        Err(e) => return usage_error(e),
    };
    init_logs(config.log_format);
    // The relay's own connections notice a silent peer within the bound the server gets too.
    tcp_keepalive::set_process_bound(config.db.session_bounds.dead_client);
    match run::run(config, otlp, Metrics::new(), shutdown, suspension).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_user_error() => usage_error(e),
        Err(e) => failure(e),
    }
}
