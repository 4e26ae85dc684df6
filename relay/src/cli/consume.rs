//! `outbox-relay consume`.

use std::process::ExitCode;
use std::time::Duration;

use indicatif::ProgressBar;

use super::shared::{failure, progress_style, usage_error};
use crate::broker::routing::ExchangeType;
use crate::config::{ConfigError, one_of, positive_duration};
use crate::connect::secret_url::{SecretUrl, UrlKind};
use crate::defaults;
use crate::tools::consume;

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// RabbitMQ URL.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,
    /// Exchange to bind to (declared durable if missing).
    #[arg(long, default_value = "outbox")]
    pub exchange: String,
    /// Exchange type used when declaring it: fanout, topic, direct or headers.
    #[arg(long, value_parser = one_of::<ExchangeType>, default_value = "fanout")]
    pub exchange_type: ExchangeType,
    /// Durable queue to declare, bind and drain. Default: <exchange>.consumer.
    #[arg(long)]
    pub queue: Option<String>,
    /// Binding key ("#" suits a topic exchange).
    #[arg(long, default_value = "")]
    pub binding_key: String,
    /// Stop after this many messages.
    #[arg(long)]
    pub expect: Option<u64>,
    /// Stop when nothing arrived for this long, e.g. 30s. Default: 30s.
    #[arg(long, value_parser = positive_duration)]
    pub idle_timeout: Option<Duration>,
    /// Only declare the exchange, queue and binding, then exit.
    #[arg(long)]
    pub setup_only: bool,
    /// Delete the queue first, so messages left from an earlier run are not counted.
    #[arg(long)]
    pub fresh: bool,
    /// Count distinct message ids too.
    #[arg(long)]
    pub distinct: bool,
    /// Hide the progress line.
    #[arg(long)]
    pub quiet: bool,
}

pub async fn command(args: ConsumeArgs) -> ExitCode {
    let Some(url_text) = args.amqp_url.as_deref() else {
        return usage_error(ConfigError::new(
            "amqp-url",
            "is missing; pass --amqp-url or set AMQP_URL",
        ));
    };
    let url = match SecretUrl::parse(url_text, UrlKind::Amqp) {
        Ok(url) => url,
        Err(e) => return usage_error(ConfigError::new("amqp-url", e.to_string())),
    };
    let idle = args.idle_timeout.unwrap_or(defaults::CONSUME_IDLE_TIMEOUT);
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("{}.consumer", args.exchange));
    let topology = consume::Topology {
        exchange: &args.exchange,
        kind: args.exchange_type,
        queue: &queue,
        binding_key: &args.binding_key,
    };
    if args.setup_only {
        let result = async {
            let connection =
                lapin::Connection::connect(url.expose(), lapin::ConnectionProperties::default())
                    .await?;
            let channel = connection.create_channel().await?;
            if args.fresh {
                channel
                    .queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await?;
            }
            consume::declare(&channel, &topology).await?;
            connection.close(200, "done".into()).await
        }
        .await;
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(format!("cannot declare on {url}: {e}")),
        };
    }
    let bar = match (args.quiet, args.expect) {
        (true, _) => ProgressBar::hidden(),
        (false, Some(n)) => ProgressBar::new(n),
        (false, None) => ProgressBar::new_spinner(),
    };
    bar.set_style(progress_style(PROGRESS));
    let result = consume::consume(&url, &topology, args.expect, idle, args.distinct, |n| {
        if n.is_multiple_of(1000) {
            bar.set_position(n);
        }
    })
    .await;
    bar.finish_and_clear();
    match result {
        Ok(summary) => {
            let secs = summary.elapsed.as_secs_f64().max(1e-9);
            println!(
                "received {} messages in {:.1} s ({:.0} msg/s){}",
                summary.received,
                secs,
                summary.received as f64 / secs,
                summary
                    .distinct
                    .map(|d| format!(", {d} distinct ids"))
                    .unwrap_or_default()
            );
            if args.expect.is_some_and(|n| summary.received < n) {
                return failure(format!(
                    "expected {} messages, nothing more arrived for {idle:?}",
                    args.expect.unwrap_or(0)
                ));
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(format!("consuming from {url}: {e}")),
    }
}

/// The progress line; `{rate}` is whole messages per second (see `shared::progress_style`).
pub(crate) const PROGRESS: &str =
    "{spinner} consumed [{bar:40}] {pos}/{len} messages ({rate}, eta {eta})";
