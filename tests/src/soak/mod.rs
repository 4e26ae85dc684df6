//! The soak (issue 54, point 4): an OutboxRelay's pods, run by the operator on the real node,
//! under a steady load at about half the ceiling they were just measured at, with faults on a
//! schedule — a relay pod killed, a RabbitMQ node restarted, PostgreSQL restarted, a transaction
//! held open — and one record per period of throughput, backlog, end-to-end latency p99, the
//! relay's and the operator's memory, and the table's dead tuples and size. The verdict fails
//! it on a leak, a fall in throughput, a latency that does not come back, or a lost message.
//!
//! `make soak` runs it for 90 one-minute periods (`MINUTES=` to change); `make test` runs 18
//! periods of 6 seconds, which checks that the same faults, readings and verdict work.

pub mod arrivals;
pub mod memory;
pub mod plot;
pub mod producer;
pub mod record;
pub mod sampler;
pub mod schedule;
pub mod verdict;

use std::path::PathBuf;
use std::time::Duration;

use schedule::{MIN_PERIODS, Schedule};

/// How a soak is run, from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub schedule: Schedule,
    /// Rows seeded before the load, drained to measure the ceiling.
    pub ceiling_rows: u64,
    /// The offered rate given (`SOAK_RATE`), instead of half the ceiling.
    pub rate: Option<f64>,
    /// The highest offered rate: the short version runs beside other tests.
    pub max_rate: f64,
    /// Where the CSV, the Markdown table and the plot go.
    pub dir: PathBuf,
}

/// The short version's periods.
const SHORT_PERIOD: Duration = Duration::from_secs(6);

fn number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Ok(text) if !text.is_empty() => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={text} is not a number")),
        _ => Ok(None),
    }
}

impl Settings {
    /// `SOAK_MINUTES` (one-minute periods; unset: the short version), `SOAK_RATE`,
    /// `SOAK_CEILING_ROWS`, `SOAK_DIR`.
    pub fn from_env() -> Result<Self, String> {
        let minutes: Option<u32> = number("SOAK_MINUTES")?;
        let (schedule, ceiling_rows, max_rate) = match minutes {
            Some(minutes) => (
                Schedule::of(minutes, Duration::from_secs(60))?,
                200_000,
                f64::INFINITY,
            ),
            None => (Schedule::of(MIN_PERIODS, SHORT_PERIOD)?, 20_000, 400.0),
        };
        let dir = std::env::var_os("SOAK_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/soak"),
            PathBuf::from,
        );
        Ok(Self {
            schedule,
            ceiling_rows: number("SOAK_CEILING_ROWS")?.unwrap_or(ceiling_rows),
            rate: number("SOAK_RATE")?,
            max_rate,
            dir,
        })
    }

    /// The rate to offer after measuring `ceiling` msg/s.
    pub fn offered_rate(&self, ceiling: f64) -> f64 {
        self.rate.unwrap_or((ceiling / 2.0).min(self.max_rate))
    }
}
