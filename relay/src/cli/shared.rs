//! What the commands share: exit codes, logging and connecting to the table.

use std::process::ExitCode;

use sqlx::{Connection, PgConnection};

use crate::config::{LogFormat, TableArgs, TableConfig, resolve_table};
use crate::table::inspect::InspectError;

/// Exit code for bad input: the user must change something.
pub const USAGE: u8 = 2;

pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,lapin=warn"));
    // Colours only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

pub fn usage_error(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(USAGE)
}

pub fn failure(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::FAILURE
}

/// Resolves the table options and connects; bad input exits 2 before anything is written.
pub async fn connect(args: &TableArgs) -> Result<(TableConfig, PgConnection), ExitCode> {
    let config = resolve_table(args).map_err(usage_error)?;
    let conn = PgConnection::connect(config.database_url.expose())
        .await
        .map_err(|e| failure(format!("cannot connect to {}: {e}", config.database_url)))?;
    Ok((config, conn))
}

pub fn inspect_failure(e: InspectError) -> ExitCode {
    if e.is_user_error() {
        usage_error(e)
    } else {
        failure(e)
    }
}
