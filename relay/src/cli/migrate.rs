//! `outbox-relay migrate`.

use std::process::ExitCode;
use std::time::Duration;

use super::shared::{connect, failure, init_logs, inspect_failure, usage_error};
use crate::config::{LogFormat, TableArgs, positive_duration};
use crate::defaults;
use crate::table::migrate::{MigrateError, MigrationOptions, migrate};

#[derive(clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Build the reference article's covering index (payload INCLUDEd). Only for payloads known
    /// to stay well under 2.7 kB: a larger row then fails to INSERT.
    #[arg(long)]
    pub covering_index: bool,
    /// Install the NOTIFY trigger that wakes idle relays at once.
    #[arg(long)]
    pub notify: bool,
    /// Leave the table's autovacuum settings as they are.
    #[arg(long)]
    pub skip_autovacuum: bool,
    /// How long to keep retrying while another migration holds the lock, e.g. 5m. Default: 5m.
    #[arg(long, value_parser = positive_duration)]
    pub wait: Option<Duration>,
}

pub async fn command(args: MigrateArgs) -> ExitCode {
    init_logs(LogFormat::Text);
    let wait = args.wait.unwrap_or(defaults::MIGRATE_WAIT);
    let (config, mut conn) = match connect(&args.table, "migrate", true).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let options = MigrationOptions {
        covering_index: args.covering_index,
        notify: args.notify,
        skip_autovacuum: args.skip_autovacuum,
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match migrate(&mut conn, &config.table, &options).await {
            Ok(report) => {
                for line in report.lines() {
                    println!("{}: {line}", config.table.name);
                }
                return ExitCode::SUCCESS;
            }
            Err(MigrateError::LockBusy) if tokio::time::Instant::now() < deadline => {
                eprintln!(
                    "another migration of {} is running; waiting",
                    config.table.name
                );
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(MigrateError::Table(e)) => return inspect_failure(e),
            // The user must change the table: bad input, exit 2.
            Err(e @ MigrateError::IdNotUnique { .. }) => return usage_error(e),
            Err(e) => return failure(e),
        }
    }
}
