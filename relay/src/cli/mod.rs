//! The `outbox-relay` commands: run the relay, migrate the table, show the lag, or generate
//! load. Each command resolves its options, does its work and maps the outcome to an exit code:
//! 2 when the user must change something, 1 for any other failure.

mod consume;
mod lag;
mod migrate;
mod run;
mod seed;
mod shared;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::RunArgs;

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Relays transactional-outbox rows from PostgreSQL to RabbitMQ"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay pending rows to the broker until SIGTERM.
    Run(Box<RunArgs>),
    /// Create the pending-row index, the report table and queue-friendly autovacuum settings.
    Migrate(migrate::MigrateArgs),
    /// Print the backlog and the age of the oldest pending row.
    Lag(lag::LagArgs),
    /// Insert test rows: bulk with COPY, or steadily with --rate.
    Seed(seed::SeedArgs),
    /// Count messages arriving on a queue bound to the exchange (for demos and benchmarks).
    Consume(consume::ConsumeArgs),
}

/// Parses the command line and runs the command.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::command(*args).await,
        Command::Migrate(args) => migrate::command(args).await,
        Command::Lag(args) => lag::command(args).await,
        Command::Seed(args) => seed::command(args).await,
        Command::Consume(args) => consume::command(args).await,
    }
}
