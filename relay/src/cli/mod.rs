//! The `outbox-relay` commands: run the relay, migrate the table, show the lag, or generate
//! load. Each command resolves its options, does its work and maps the outcome to an exit code:
//! 2 when the user must change something, 1 for any other failure.

mod consume;
mod dead_letters;
mod lag;
mod migrate;
mod replay;
mod run;
mod seed;
mod shared;
mod signals;

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
    /// Relay pending rows to the broker until SIGTERM (SIGUSR1 suspends delivery, SIGUSR2
    /// resumes it).
    Run(Box<RunArgs>),
    /// Create the pending-row index, the report table and queue-friendly autovacuum settings.
    Migrate(migrate::MigrateArgs),
    /// Print the backlog and the age of the oldest pending row.
    Lag(lag::LagArgs),
    /// Insert test rows: bulk with COPY, or steadily with --rate.
    Seed(seed::SeedArgs),
    /// Count messages arriving on a queue bound to the exchange (for demos and benchmarks).
    Consume(consume::ConsumeArgs),
    /// List the dead letters grouped by cause, send a group again, or settle it for good.
    DeadLetters(dead_letters::DeadLettersArgs),
    /// Send rows already relayed again, chosen by time range, type, key or ids, marked x-outbox-replay.
    Replay(replay::ReplayArgs),
}

/// Parses the command line and runs the command.
/// `run` listens for SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 before the runtime starts (see
/// [`signals`]); the other commands keep the signals' default action.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let signals = match &cli.command {
        Command::Run(_) => match signals::listen() {
            Ok(signals) => Some(signals),
            Err(e) => return shared::failure(format!("cannot listen for signals: {e}")),
        },
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return shared::failure(format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => {
                let (shutdown, suspension) = match signals {
                    Some(s) => (s.shutdown, s.suspension),
                    None => Default::default(),
                };
                run::command(*args, shutdown, suspension).await
            }
            Command::Migrate(args) => migrate::command(args).await,
            Command::Lag(args) => lag::command(args).await,
            Command::Seed(args) => seed::command(args).await,
            Command::Consume(args) => consume::command(args).await,
            Command::DeadLetters(args) => dead_letters::command(args).await,
            Command::Replay(args) => replay::command(args).await,
        }
    })
}
