//! Measures one run: samples a message counter over time, from the first message on, for a
//! fixed window (or until everything was relayed), with the CPU spent meanwhile.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use crate::procstat::{CpuSeconds, CpuSnapshot};
use crate::scrape::StageTime;

/// How often the counter is read; fine enough for a throughput-over-time plot.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long a run may take to deliver its first message before it counts as broken.
const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Measurement {
    /// Messages per second over the measured window.
    pub rate: f64,
    /// Messages counted in the window.
    pub messages: u64,
    pub seconds: f64,
    pub cpu: CpuSeconds,
    /// The same CPU, in microseconds per message counted.
    pub cpu_us_per_message: CpuSeconds,
    /// Peak RSS of the relay process (relay runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mib: Option<f64>,
    /// Mean time per batch stage, from the relay's histograms (relay runs only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<String, StageTime>,
    /// The relay's table-health gauges at the end of the window (relay runs only): what it
    /// reported while the run happened.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub table_health: BTreeMap<String, f64>,
    pub series: Vec<Sample>,
}

/// Samples a counter kept in this process (the ceiling's and the naive loop's), with this
/// process as the CPU subject.
pub async fn sample_in_process(
    counter: &AtomicU64,
    window: Duration,
    total: Option<u64>,
) -> anyhow::Result<Measurement> {
    sample(
        || {
            let n = counter.load(Ordering::Relaxed);
            async move { Some(n) }
        },
        &[std::process::id()],
        window,
        total,
    )
    .await
}

/// Runs the sampling loop. `read` returns the running count (None when it cannot be read
/// right now); `subjects` are the processes whose CPU is the subject's; `total` stops the
/// window early once that many messages were counted.
pub async fn sample<F, Fut>(
    mut read: F,
    subjects: &[u32],
    window: Duration,
    total: Option<u64>,
) -> anyhow::Result<Measurement>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<u64>>,
{
    let started = Instant::now();
    let mut series = Vec::new();
    let mut first: Option<(f64, u64, CpuSnapshot)> = None;
    let mut last = 0u64;
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let t = started.elapsed().as_secs_f64();
        let count = read().await.unwrap_or(last);
        last = count;
        series.push(Sample { t, count });
        match &first {
            None if count > 0 => {
                // The window starts at the sample before the first message, so start-up
                // (connecting) is excluded but no message is.
                let before = series.len().checked_sub(2).map(|i| series[i]);
                let (t0, c0) = before.map_or((0.0, 0), |s| (s.t, s.count));
                first = Some((t0, c0, CpuSnapshot::take(subjects)));
            }
            None if started.elapsed() > FIRST_MESSAGE_TIMEOUT => {
                bail!("no message was counted within {FIRST_MESSAGE_TIMEOUT:?}")
            }
            _ => {}
        }
        if let Some((t0, _, _)) = &first {
            let done = total.is_some_and(|n| count >= n);
            if done || t - t0 >= window.as_secs_f64() {
                break;
            }
        }
    }
    let end = CpuSnapshot::take(subjects);
    let (t0, c0, cpu0) = first.expect("the loop ends only after the first message");
    let last = series.last().copied().expect("at least one sample");
    let seconds = (last.t - t0).max(1e-3);
    let messages = last.count - c0;
    let cpu = cpu0.until(&end);
    Ok(Measurement {
        rate: messages as f64 / seconds,
        messages,
        seconds,
        cpu,
        cpu_us_per_message: cpu.per_message_us(messages),
        peak_rss_mib: None,
        stages: BTreeMap::new(),
        table_health: BTreeMap::new(),
        series,
    })
}
