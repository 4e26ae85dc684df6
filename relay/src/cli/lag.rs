//! `outbox-relay lag`.

use std::process::ExitCode;

use super::shared::{connect, failure, inspect_failure, usage_error};
use crate::config::{ConfigError, TableArgs};
use crate::defaults;
use crate::table::inspect::inspect;
use crate::table::reports::measure_backlog;
use crate::table::sql::Statements;

#[derive(clap::Args)]
pub struct LagArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Stop counting at this many rows.
    #[arg(long, default_value_t = defaults::BACKLOG_CAP, allow_hyphen_values = true)]
    pub cap: i64,
}

pub async fn command(args: LagArgs) -> ExitCode {
    if args.cap < 1 {
        return usage_error(ConfigError::new(
            "cap",
            format!("must be at least 1, got {}", args.cap),
        ));
    }
    let (config, mut conn) = match connect(&args.table).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let shape = match inspect(&mut conn, &config.table).await {
        Ok(shape) => shape,
        Err(e) => return inspect_failure(e),
    };
    let statements = Statements::new(&config.table, shape.payload);
    match measure_backlog(&mut conn, &statements, args.cap).await {
        Ok(backlog) if args.json => {
            let value = serde_json::json!({
                "table": config.table.name.to_string(),
                "backlog": backlog.pending,
                "backlogCapped": backlog.capped,
                "oldestAgeSeconds": backlog.oldest_age_seconds,
            });
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok(backlog) => {
            let more = if backlog.capped {
                " or more (count capped)"
            } else {
                ""
            };
            println!("table: {}", config.table.name);
            println!("backlog: {}{more}", backlog.pending);
            match backlog.oldest_age_seconds {
                Some(age) => println!("oldest pending age: {age:.1} s"),
                None => println!("oldest pending age: none pending"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}
