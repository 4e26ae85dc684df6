//! One measurement of the real relay: fresh exchange (and queue and consumer process for the
//! realistic workload), the relay started on the prepared table, sampled through its metrics,
//! stopped with SIGTERM, then checked: nothing settled with an error, nothing settled without
//! its confirm, and in a full drain every row delivered exactly once to the consumer.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use outbox_relay::broker::BrokerProtocol;

use crate::broker::Destination;
use crate::consumer_process::ConsumerProcess;
use crate::env::Env;
use crate::fixture::Fixture;
use crate::measure::{Measurement, sample};
use crate::names::{RunNames, next_run};
use crate::procstat::peak_rss_mib;
use crate::relay_process::{RelayProcess, broker_args};
use crate::scrape;

/// How a relay run ends.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// After this long (or when the table drains first).
    Window(Duration),
    /// When every pending row was relayed; fails after the timeout. Checks delivery end to end.
    Drained { timeout: Duration },
}

pub async fn measure_relay(
    env: &Env,
    names: &RunNames,
    fixture: &Fixture,
    label: &str,
    args: &[String],
    protocol: BrokerProtocol,
    until: Until,
) -> anyhow::Result<Measurement> {
    let pending_before = fixture.pending().await? as u64;
    ensure!(pending_before > 0, "the table has no pending rows to relay");
    let what = format!("{}.{label}.{}", fixture.workload.name(), next_run());
    let destination = Destination::declare(
        &env.amqp_url,
        names.exchange(&what),
        fixture.workload.has_consumer().then(|| names.queue(&what)),
    )
    .await?;
    let drain = matches!(until, Until::Drained { .. });
    let consumer = match &destination.queue {
        Some(_) => {
            Some(ConsumerProcess::start(env, &destination, drain.then_some(pending_before)).await?)
        }
        None => None,
    };
    let broker = broker_args(env, &destination, protocol);
    let result = run_and_check(
        env,
        fixture,
        &broker,
        label,
        args,
        until,
        pending_before,
        consumer,
    )
    .await;
    destination.delete(&env.amqp_url).await?;
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_and_check(
    env: &Env,
    fixture: &Fixture,
    broker: &[String],
    label: &str,
    args: &[String],
    until: Until,
    pending_before: u64,
    consumer: Option<ConsumerProcess>,
) -> anyhow::Result<Measurement> {
    let relay = RelayProcess::start(env, fixture, broker, args, label).await?;
    let window = match until {
        Until::Window(window) => window,
        Until::Drained { timeout } => timeout,
    };
    let sampled = sample(
        || relay.published(),
        &[relay.pid()],
        window,
        Some(pending_before),
    )
    .await;
    let metrics = relay.metrics().await.unwrap_or_default();
    let peak_rss = peak_rss_mib(relay.pid());
    let stopped = relay.stop().await;
    let mut measured = sampled.with_context(|| format!("relay run {label}"))?;
    stopped?;
    measured.peak_rss_mib = peak_rss;
    measured.stages = scrape::stages(&metrics);
    measured.table_health = scrape::table_health(&metrics);
    let confirmed = scrape::published(&metrics).unwrap_or_default();

    let pending_after = fixture.pending().await? as u64;
    let failed = fixture.failed().await?;
    ensure!(
        failed == 0,
        "the relay settled {failed} row(s) with an error in {}",
        fixture.name()
    );
    let settled = pending_before.saturating_sub(pending_after);
    ensure!(
        settled >= confirmed,
        "the relay reported {confirmed} confirmed messages but only {settled} rows were settled"
    );

    if let Until::Drained { timeout } = until {
        if pending_after != 0 {
            bail!(
                "the relay left {pending_after} of {pending_before} rows pending in {}",
                fixture.name()
            );
        }
        if let Some(consumer) = consumer {
            let consumed = consumer.finish(timeout).await?;
            ensure!(
                consumed.distinct == Some(pending_before),
                "the consumer received {} messages with {:?} distinct ids; {pending_before} rows were relayed",
                consumed.received,
                consumed.distinct
            );
        }
    } else if let Some(consumer) = consumer {
        consumer.kill().await;
    }
    Ok(measured)
}
