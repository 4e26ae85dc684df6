//! The real relay binary, started as its own process on a prepared table and stopped with
//! SIGTERM, as a deployment would.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use outbox_relay::broker::BrokerProtocol;

use crate::broker::Destination;
use crate::env::Env;
use crate::fixture::Fixture;
use crate::scrape;

/// The `run` arguments that point the relay at `destination` over `protocol`.
pub fn broker_args(env: &Env, destination: &Destination, protocol: BrokerProtocol) -> Vec<String> {
    match protocol {
        BrokerProtocol::Amqp091 => vec!["--exchange".into(), destination.exchange.clone()],
        BrokerProtocol::Amqp10 => vec![
            "--broker-protocol".into(),
            "amqp10".into(),
            "--broker-url".into(),
            env.amqp10_url.clone(),
            "--address".into(),
            destination.amqp10_address(),
        ],
    }
}

pub struct RelayProcess {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

/// A free local port for the relay's metrics server.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl RelayProcess {
    /// Starts `outbox-relay run` with `extra` settings on top of its defaults and waits until
    /// its metrics endpoint answers. `broker` says where it publishes (see [`broker_args`]).
    pub async fn start(
        env: &Env,
        fixture: &Fixture,
        broker: &[String],
        extra: &[String],
        label: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(env.logs())?;
        let log = env.logs().join(format!("{}-{label}.log", fixture.name()));
        let port = free_port()?;
        let child = Command::new(&env.relay_bin)
            .arg("run")
            .args(["--table", &fixture.name()])
            .args(broker)
            .args(["--mode", fixture.table.mode.as_str()])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("DATABASE_URL", &env.database_url)
            .env("AMQP_URL", &env.amqp_url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", env.relay_bin.display()))?;
        let mut relay = Self { child, port, log };
        for _ in 0..200 {
            if let Some(status) = relay.child.try_wait()? {
                bail!(
                    "the relay exited at start ({status}); see {}",
                    relay.log.display()
                );
            }
            if scrape::fetch(port).await.is_ok() {
                return Ok(relay);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "the relay's metrics endpoint never answered; see {}",
            relay.log.display()
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or_default()
    }

    pub async fn metrics(&self) -> Option<String> {
        scrape::fetch(self.port).await.ok()
    }

    pub async fn published(&self) -> Option<u64> {
        scrape::published(&self.metrics().await?)
    }

    /// SIGTERM, then wait: the relay must finish its batch in flight and exit 0.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let status = tokio::time::timeout(Duration::from_secs(40), self.child.wait())
            .await
            .context("the relay did not exit within 40 s of SIGTERM")??;
        if !status.success() {
            bail!(
                "the relay exited with {status} after SIGTERM; see {}",
                self.log.display()
            );
        }
        Ok(())
    }
}
