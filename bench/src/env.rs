//! Where the services, the relay binary and the output directory are.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Env {
    pub database_url: String,
    pub amqp_url: String,
    /// The same broker's AMQP 1.0 endpoint, for the AMQP 1.0 contenders.
    pub amqp10_url: String,
    /// The real relay binary, run as a separate process like in production.
    pub relay_bin: PathBuf,
    /// target/bench: JSON, plot and process logs.
    pub out_dir: PathBuf,
}

impl Env {
    pub fn logs(&self) -> PathBuf {
        self.out_dir.join("logs")
    }
}

/// The relay binary next to this one (both are built into the same target directory).
pub fn sibling_relay_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("outbox-relay")))
        .unwrap_or_else(|| PathBuf::from("target/release/outbox-relay"))
}

/// target/bench, next to the binary's target directory when it can be found.
pub fn default_out_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(|target| target.join("bench")))
        .unwrap_or_else(|| PathBuf::from("target/bench"))
}
