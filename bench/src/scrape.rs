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

/// The table-health gauges the measuring relay exports, by name without the prefix.
pub fn table_health(text: &str) -> BTreeMap<String, f64> {
    [
        "cleanup_horizon_age_seconds",
        "cleanup_horizon_age_xids",
        "table_dead_tuples",
        "table_live_tuples",
        "pending_index_bytes",
    ]
    .into_iter()
    .filter_map(|name| {
        Some((
            name.to_string(),
            value(text, &format!("outbox_relay_{name}"))?,
        ))
    })
    .collect()
}

pub fn published(text: &str) -> Option<u64> {
    value(text, "outbox_relay_messages_published_total").map(|v| v as u64)
}

/// Time of one batch stage: how many batches it covers, the mean, and the 99th percentile
/// estimated from the histogram's buckets.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StageTime {
    pub count: u64,
    pub mean_ms: f64,
    pub p99_ms: f64,
}

/// The label value `name="…"` of a sample's label set, if present.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    labels[start..].split('"').next()
}

/// The `q` quantile of a cumulative histogram given as (upper bound, count) pairs in bound
/// order, interpolating linearly within the bucket it falls in, as Prometheus'
/// histogram_quantile does. Falls back to the highest finite bound for the +Inf bucket.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut previous = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return previous.0;
            }
            let in_bucket = count - previous.1;
            let share = if in_bucket > 0.0 {
                (rank - previous.1) / in_bucket
            } else {
                1.0
            };
            return previous.0 + (bound - previous.0) * share;
        }
        previous = (bound, count);
    }
    previous.0
}

/// The 99th percentile of every batch stage, in ms, from the histogram's buckets.
fn stage_p99s(text: &str) -> BTreeMap<String, f64> {
    stage_buckets(text)
        .into_iter()
        .map(|(stage, points)| (stage, quantile(&points, 0.99) * 1000.0))
        .collect()
}

/// The `q` quantile, in ms, of one stage over several relay processes' histograms: their
/// buckets (the same bounds in every process) added up.
pub fn merged_stage_quantile(texts: &[String], stage: &str, q: f64) -> f64 {
    let mut merged: Vec<(f64, f64)> = Vec::new();
    for text in texts {
        let Some(points) = stage_buckets(text).remove(stage) else {
            continue;
        };
        if merged.is_empty() {
            merged = points;
        } else {
            for (sum, (_, count)) in merged.iter_mut().zip(points) {
                sum.1 += count;
            }
        }
    }
    quantile(&merged, q) * 1000.0
}

/// Every stage's cumulative histogram as (upper bound in seconds, count), in bound order.
fn stage_buckets(text: &str) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("outbox_relay_stage_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let (Some(stage), Some(le), Ok(count)) = (
            label(labels, "stage"),
            label(labels, "le"),
            value.trim().parse(),
        ) else {
            continue;
        };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            match le.parse() {
                Ok(bound) => bound,
                Err(_) => continue,
            }
        };
        buckets
            .entry(stage.to_string())
            .or_default()
            .push((bound, count));
    }
    for points in buckets.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    buckets
}

/// Mean and 99th percentile of every batch stage (claim, slot, publish, confirm, mark,
/// commit).
pub fn stages(text: &str) -> BTreeMap<String, StageTime> {
    let p99s = stage_p99s(text);
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
            let p99_ms = p99s.get(&stage).copied().unwrap_or_default();
            (
                stage,
                StageTime {
                    count: count as u64,
                    mean_ms,
                    p99_ms,
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
        outbox_relay_stage_duration_seconds_count{stage=\"claim\"} 100\n\
        outbox_relay_stage_duration_seconds_bucket{stage=\"claim\",le=\"0.001\"} 50\n\
        outbox_relay_stage_duration_seconds_bucket{stage=\"claim\",le=\"0.002\"} 90\n\
        outbox_relay_stage_duration_seconds_bucket{stage=\"claim\",le=\"0.004\"} 100\n\
        outbox_relay_stage_duration_seconds_bucket{stage=\"claim\",le=\"+Inf\"} 100\n";

    #[test]
    fn reads_counter_and_stages() {
        assert_eq!(published(SAMPLE), Some(1234));
        let stages = stages(SAMPLE);
        assert_eq!(stages["claim"].count, 100);
        assert!((stages["claim"].mean_ms - 5.0).abs() < 1e-9);
        // Rank 99 falls in the 2–4 ms bucket (counts 90 → 100): 2 + 2 × 9/10.
        assert!(
            (stages["claim"].p99_ms - 3.8).abs() < 1e-9,
            "{:?}",
            stages["claim"]
        );
    }

    #[test]
    fn a_quantile_in_the_open_bucket_is_the_highest_finite_bound() {
        let buckets = [(0.001, 10.0), (0.002, 50.0), (f64::INFINITY, 100.0)];
        assert!((quantile(&buckets, 0.99) - 0.002).abs() < 1e-12);
        assert!((quantile(&buckets, 0.05) - 0.0005).abs() < 1e-12);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }
}
