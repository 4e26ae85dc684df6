//! Reads the relay's Prometheus endpoint: the published counter and the per-stage histograms.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// GET /metrics over a plain TCP connection (HTTP/1.0, so the server closes when done).
pub async fn fetch(port: u16) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

/// The value of an unlabelled sample, e.g. `outbox_relay_messages_published_total`.
pub fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

pub fn published(text: &str) -> Option<u64> {
    value(text, "outbox_relay_messages_published_total").map(|v| v as u64)
}

/// Mean time of one batch stage, and how many batches it covers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StageTime {
    pub count: u64,
    pub mean_ms: f64,
}

/// Mean duration of every batch stage (claim, publish, confirm, mark, commit).
pub fn stages(text: &str) -> BTreeMap<String, StageTime> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        for (suffix, slot) in [("_sum{", 0), ("_count{", 1)] {
            let Some(rest) =
                line.strip_prefix(&format!("outbox_relay_stage_duration_seconds{suffix}"))
            else {
                continue;
            };
            let Some(stage) = rest
                .strip_prefix("stage=\"")
                .and_then(|r| r.split('"').next())
            else {
                continue;
            };
            let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            let entry = sums.entry(stage.to_string()).or_default();
            if slot == 0 { entry.0 = v } else { entry.1 = v }
        }
    }
    sums.into_iter()
        .map(|(stage, (sum, count))| {
            let mean_ms = if count > 0.0 {
                sum / count * 1000.0
            } else {
                0.0
            };
            (
                stage,
                StageTime {
                    count: count as u64,
                    mean_ms,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# HELP x\noutbox_relay_messages_published_total 1234\n\
        outbox_relay_stage_duration_seconds_sum{stage=\"claim\"} 0.5\n\
        outbox_relay_stage_duration_seconds_count{stage=\"claim\"} 100\n";

    #[test]
    fn reads_counter_and_stages() {
        assert_eq!(published(SAMPLE), Some(1234));
        let stages = stages(SAMPLE);
        assert_eq!(stages["claim"].count, 100);
        assert!((stages["claim"].mean_ms - 5.0).abs() < 1e-9);
    }
}
