//! The consumer of the realistic workload: `outbox-relay consume` in its own process, so its
//! CPU is not the relay's and it drains the queue as a real service would.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::broker::Destination;
use crate::env::Env;

pub struct ConsumerProcess {
    child: Child,
}

/// What the consumer printed when it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consumed {
    pub received: u64,
    pub distinct: Option<u64>,
}

impl ConsumerProcess {
    /// Starts draining `destination`'s queue. With `expect`, it exits by itself after that
    /// many messages and counts distinct message ids.
    pub async fn start(
        env: &Env,
        destination: &Destination,
        expect: Option<u64>,
    ) -> anyhow::Result<Self> {
        let queue = destination
            .queue
            .as_deref()
            .context("a consumer needs a queue")?;
        let mut command = Command::new(&env.relay_bin);
        command
            .arg("consume")
            .args(["--exchange", &destination.exchange, "--queue", queue])
            .args(["--quiet", "--idle-timeout", "60s"])
            .env("AMQP_URL", &env.amqp_url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(n) = expect {
            command.args(["--expect", &n.to_string(), "--distinct"]);
        }
        let child = command.spawn().context("starting the consumer")?;
        Ok(Self { child })
    }

    /// Waits for the consumer to finish (it was started with `expect`) and reads its count.
    pub async fn finish(mut self, timeout: Duration) -> anyhow::Result<Consumed> {
        let status = match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the consumer did not receive every message within {timeout:?}")
            }
        };
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            stdout.read_to_string(&mut out).await?;
        }
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            stderr.read_to_string(&mut err).await?;
        }
        let consumed = parse_summary(&out)
            .with_context(|| format!("consumer output not understood: {out}{err}"))?;
        if !status.success() {
            bail!(
                "the consumer failed ({status}): {}{}",
                out.trim(),
                err.trim()
            );
        }
        Ok(consumed)
    }

    /// Stops a consumer started without `expect`.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Parses "received N messages in … (… msg/s), D distinct ids".
fn parse_summary(text: &str) -> Option<Consumed> {
    let line = text.lines().find(|l| l.starts_with("received "))?;
    let received = line.split_whitespace().nth(1)?.parse().ok()?;
    let distinct = line
        .split(", ")
        .find(|part| part.ends_with("distinct ids"))
        .and_then(|part| part.split_whitespace().next()?.parse().ok());
    Some(Consumed { received, distinct })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_line() {
        let parsed =
            parse_summary("received 2000 messages in 0.4 s (5000 msg/s), 1999 distinct ids\n");
        assert_eq!(
            parsed,
            Some(Consumed {
                received: 2000,
                distinct: Some(1999)
            })
        );
        assert_eq!(
            parse_summary("received 5 messages in 0.1 s (50 msg/s)")
                .unwrap()
                .distinct,
            None
        );
    }
}
