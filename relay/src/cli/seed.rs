//! `outbox-relay seed`.

use std::process::ExitCode;

use indicatif::ProgressBar;

use super::shared::{connect, failure, inspect_failure, progress_style, usage_error};
use crate::config::{ConfigError, TableArgs};
use crate::table::inspect::inspect;
use crate::tools::seed;

#[derive(clap::Args)]
pub struct SeedArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Rows to insert.
    #[arg(long, default_value_t = 100_000, allow_hyphen_values = true)]
    pub rows: i64,
    /// Approximate payload size in bytes (the article's payload is about 50).
    #[arg(long, default_value_t = 50, allow_hyphen_values = true)]
    pub payload_bytes: i64,
    /// Distinct partition keys, taking turns row by row, when the table maps a partition-key
    /// column (--ordering per-key --partition-key-column COLUMN).
    #[arg(long, default_value_t = seed::DEFAULT_KEYS as i64, allow_hyphen_values = true)]
    pub keys: i64,
    /// Insert steadily at this many rows per second instead of one bulk COPY.
    #[arg(long, allow_hyphen_values = true)]
    pub rate: Option<f64>,
    /// Create the table (reference article's columns, with the configured names) if missing.
    #[arg(long)]
    pub create_table: bool,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub async fn command(args: SeedArgs) -> ExitCode {
    if args.rows < 1 {
        return usage_error(ConfigError::new(
            "rows",
            format!("must be at least 1, got {}", args.rows),
        ));
    }
    if !(0..=100_000_000).contains(&args.payload_bytes) {
        return usage_error(ConfigError::new(
            "payload-bytes",
            "must be between 0 and 100000000",
        ));
    }
    if args.keys < 1 {
        return usage_error(ConfigError::new(
            "keys",
            format!("must be at least 1, got {}", args.keys),
        ));
    }
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        return usage_error(ConfigError::new(
            "rate",
            format!("must be a positive number, got {rate}"),
        ));
    }
    let (config, mut conn) = match connect(&args.table, "seed", true).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    if args.create_table
        && let Err(e) = seed::create_table(&mut conn, &config.table).await
    {
        return failure(format!("cannot create {}: {e}", config.table.name));
    }
    if let Err(e) = inspect(&mut conn, &config.table).await {
        return inspect_failure(e);
    }
    let rows = args.rows as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(rows)
    };
    bar.set_style(progress_style(PROGRESS));
    let shape = seed::RowShape {
        payload_bytes: args.payload_bytes as usize,
        keys: args.keys as u64,
    };
    let result = match args.rate {
        None => {
            seed::copy_rows_shaped(&mut conn, &config.table, rows, shape, |n| {
                bar.set_position(n);
            })
            .await
        }
        Some(rate) => {
            seed::insert_shaped_at_rate(&mut conn, &config.table, rate, rows, shape, |n| {
                bar.set_position(n);
            })
            .await
            .map(|_| ())
        }
    };
    bar.finish();
    match result {
        Ok(()) => {
            println!("inserted {rows} rows into {}", config.table.name);
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

/// The progress line; `{rate}` is whole rows per second (see `shared::progress_style`).
pub(crate) const PROGRESS: &str =
    "{spinner} seeding [{bar:40}] {pos}/{len} rows ({rate}, eta {eta})";
