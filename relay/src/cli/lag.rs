//! `outbox-relay lag`.

use std::process::ExitCode;

use super::shared::{connect, failure, inspect_failure, usage_error};
use crate::config::{ConfigError, TableArgs};
use crate::defaults;
use crate::table::health::{HorizonClock, TableHealth, measure_table_health};
use crate::table::inspect::inspect;
use crate::table::reports::{Backlog, measure_backlog};
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
    let (config, mut conn) = match connect(&args.table, "lag", false).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let shape = match inspect(&mut conn, &config.table).await {
        Ok(shape) => shape,
        Err(e) => return inspect_failure(e),
    };
    let statements = Statements::new(&config.table, shape.payload);
    let measured = async {
        let backlog = measure_backlog(&mut conn, &statements, args.cap).await?;
        // One look, so a holder PostgreSQL does not date for this role shows as new.
        let health =
            measure_table_health(&mut conn, &config.table, &mut HorizonClock::default()).await?;
        Ok::<_, sqlx::Error>((backlog, health))
    }
    .await;
    match measured {
        Ok((backlog, health)) if args.json => {
            let value = serde_json::json!({
                "table": config.table.name.to_string(),
                "serverVersion": health.server_version(),
                "backlog": backlog.pending,
                "backlogCapped": backlog.capped,
                "oldestAgeSeconds": backlog.oldest_age_seconds,
                "tableHealth": health,
            });
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok((backlog, health)) => {
            print_text(&config.table.name.to_string(), &backlog, &health);
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

fn print_text(table: &str, backlog: &Backlog, health: &TableHealth) {
    let more = if backlog.capped {
        " or more (count capped)"
    } else {
        ""
    };
    println!("table: {table}");
    if let Some(version) = health.server_version() {
        println!("server: PostgreSQL {version}");
    }
    println!("backlog: {}{more}", backlog.pending);
    match backlog.oldest_age_seconds {
        Some(age) => println!("oldest pending age: {age:.1} s"),
        None => println!("oldest pending age: none pending"),
    }
    match &health.horizon {
        Some(holder) => println!(
            "cleanup horizon: {:.0} s, {} transactions old: {holder}",
            holder.age_seconds, holder.age_xids
        ),
        None => println!("cleanup horizon: not held by any other session"),
    }
    let count = |n: Option<i64>| n.map_or("unknown".to_string(), |n| n.to_string());
    println!(
        "tuples: {} live, {} dead",
        count(health.live_tuples),
        count(health.dead_tuples)
    );
    match health.last_vacuum_age_seconds {
        Some(age) => println!("last vacuum: {age:.0} s ago"),
        None => println!("last vacuum: never"),
    }
    let on = |yes: bool| if yes { "on" } else { "OFF" };
    println!(
        "autovacuum: {} for the server, {} for the table",
        on(health.server_autovacuum),
        on(health.table_autovacuum)
    );
}
