//! What the commands share: exit codes, logging and connecting to the table.

use std::process::ExitCode;

use chrono::{DateTime, SecondsFormat, Utc};
use indicatif::{HumanCount, ProgressState, ProgressStyle};
use sqlx::PgConnection;

use crate::config::{ConfigError, LogFormat, TableArgs, TableConfig, resolve_table};
use crate::database::{ConnectFailure, DatabaseTarget, FailureKind};
use crate::table::inspect::InspectError;

/// Exit code for bad input: the user must change something.
pub const USAGE: u8 = 2;

/// The log filter unless `RUST_LOG` gives one (docs/troubleshooting.md).
pub const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,lapin=warn";

/// Libraries' lines for what the relay itself says, once for the process and with the fix:
/// lapin's channel and connection errors (a missing exchange, a refused login, a lost
/// connection: several lines per attempt, at ERROR) and rustls-platform-verifier's verification
/// failures (the relay names the CA file). Off ahead of `RUST_LOG` too, which turns one back on
/// by naming its target (`RUST_LOG=info,lapin::channel=debug`); the libraries' other lines stay.
pub const EXPLAINED_LIBRARY_LINES: &str = "lapin::channel=off,lapin::channels=off,\
     lapin::io_loop=off,rustls_platform_verifier::verification=off";

/// The filter directives: the explained libraries' lines off, then `RUST_LOG` (or the default),
/// whose directive for the same target wins.
pub fn log_filter(rust_log: Option<&str>) -> String {
    let chosen = rust_log
        .map(str::trim)
        .filter(|text| !text.is_empty())
        .unwrap_or(DEFAULT_LOG_FILTER);
    format!("{EXPLAINED_LIBRARY_LINES},{chosen}")
}

pub fn init_logs(format: LogFormat) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::new(log_filter(rust_log.as_deref()));
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
/// `command` (e.g. "migrate") runs on one session: its advisory lock and its statements (named,
/// prepared once) need one, so under `--database-pool-mode transaction` it connects through
/// `--session-database-url`, and without one it is refused, naming both settings.
/// `writes`: the command writes, so a URL choosing read-only sessions is refused.
pub async fn connect(
    args: &TableArgs,
    command: &str,
    writes: bool,
) -> Result<(TableConfig, PgConnection), ExitCode> {
    let config = resolve_table(args).map_err(usage_error)?;
    if writes {
        config.require_writes().map_err(usage_error)?;
    }
    let target = config
        .session_database(&format!("`outbox-relay {command}`"))
        .map_err(usage_error)?;
    let conn = crate::database::connect(target)
        .await
        .map_err(|e| connect_failure(target, &e))?;
    Ok((config, conn))
}

/// A command cannot connect: a wrong setting, certificate or password exits 2 (the user must
/// change something), an outage exits 1.
pub fn connect_failure(target: &DatabaseTarget, e: &ConnectFailure) -> ExitCode {
    let text = format!("cannot connect to {target}: {e}");
    match e.kind {
        FailureKind::Unreachable | FailureKind::Other | FailureKind::ReadOnly => failure(text),
        FailureKind::Settings | FailureKind::Tls | FailureKind::Auth => usage_error(text),
    }
}

pub fn inspect_failure(e: InspectError) -> ExitCode {
    if e.is_user_error() {
        usage_error(e)
    } else {
        failure(e)
    }
}

/// A claim-order time as the commands print it: RFC 3339, UTC, milliseconds.
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Reads a time option (`--from`, `--since`, ...); the error names the option.
pub fn parse_time(
    option: &str,
    text: &Option<String>,
) -> Result<Option<DateTime<Utc>>, ConfigError> {
    let Some(text) = text else { return Ok(None) };
    DateTime::parse_from_rfc3339(text)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|e| {
            ConfigError::new(
                option,
                format!("{text:?} is not an RFC 3339 time ({e}); e.g. 2026-12-05T04:00:00Z"),
            )
        })
}

/// The progress bar of `seed` and `consume`: indicatif's own `{per_sec}` prints four decimals
/// ("1,518.3588/s"), so the template's `{rate}` key prints whole messages per second instead,
/// like the summary lines.
pub fn progress_style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("static template")
        .with_key(
            "rate",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&format_rate(state.per_sec()));
            },
        )
        .progress_chars("=> ")
}

/// Whole messages per second with thousands separators: `1518.3588` becomes "1,518/s".
pub fn format_rate(per_sec: f64) -> String {
    // NaN or infinite (no time elapsed yet) shows as 0 rather than a nonsense number.
    let whole = if per_sec.is_finite() && per_sec > 0.0 {
        per_sec.round() as u64
    } else {
        0
    };
    format!("{}/s", HumanCount(whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines a filter of `log_filter(rust_log)` lets through, of one line per target at
    /// `ERROR`, written with each target named.
    fn passed(rust_log: Option<&str>) -> String {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(log_filter(rust_log)))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "lapin::channel", "channel closed");
            tracing::error!(target: "rustls_platform_verifier::verification::others", "unverified");
            tracing::error!(target: "lapin::connection", "unexplained");
            tracing::warn!(target: "outbox_relay::runtime::worker", "the relay's own");
        });
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn explained_library_lines_stay_off_unless_rust_log_names_them() {
        for rust_log in [None, Some(""), Some("info"), Some("debug")] {
            let text = passed(rust_log);
            assert!(!text.contains("channel closed"), "{rust_log:?}: {text}");
            assert!(!text.contains("unverified"), "{rust_log:?}: {text}");
            assert!(text.contains("unexplained"), "{rust_log:?}: {text}");
            assert!(text.contains("the relay's own"), "{rust_log:?}: {text}");
        }
        let named = passed(Some("info,lapin::channel=debug"));
        assert!(named.contains("channel closed"), "{named}");
    }

    #[test]
    fn rates_are_whole_messages_per_second() {
        assert_eq!(format_rate(1518.3588), "1,518/s");
        assert_eq!(format_rate(0.4), "0/s");
        assert_eq!(format_rate(999.6), "1,000/s");
        assert_eq!(format_rate(f64::NAN), "0/s");
        assert_eq!(format_rate(f64::INFINITY), "0/s");
    }

    #[test]
    fn progress_templates_use_the_whole_number_rate() {
        // The templates of seed and consume must not fall back to indicatif's `{per_sec}`.
        for template in [
            super::super::seed::PROGRESS,
            super::super::consume::PROGRESS,
        ] {
            assert!(template.contains("{rate}"), "{template}");
            assert!(!template.contains("per_sec"), "{template}");
            progress_style(template);
        }
    }
}
