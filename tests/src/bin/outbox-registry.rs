//! `outbox-registry`: the OCI registry `make dist` pushes to when it is given none
//! (scripts/dist.sh): Debian's docker-registry, storing in the cache
//! (`~/.cache/outbox-relay/registry`), plain HTTP on 127.0.0.1:`REGISTRY_PORT`
//! (scripts/services/ports.env). `start` leaves it running for the next `make dist`; `stop` ends
//! it, keeping what it stores. The tests start registries of their own
//! (`outbox_tests::registry::Registry`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_tests::registry::machine;

#[derive(Parser)]
#[command(about = "The local OCI registry make dist pushes to when it is given none")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Starts it (installing docker-registry once), or finds it up.
    Start,
    /// Stops it, keeping what it stores.
    Stop,
}

fn main() -> ExitCode {
    match Args::parse().command {
        Command::Start => match machine::start() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("outbox-registry: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Stop => {
            machine::stop();
            ExitCode::SUCCESS
        }
    }
}
