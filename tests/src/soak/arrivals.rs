//! The soak's consumer: every message id the queue delivers, and each first delivery's
//! end-to-end latency, from the insert to here. The producer's ids are UUIDv7, whose first 48
//! bits are the insert's millisecond on this machine's clock, so no payload or header is needed
//! to time a message.
//!
//! It reads node 1 of the RabbitMQ cluster (the soak never restarts that node) and acks each
//! message after recording it, so a broker fault can only redeliver, never drop, what it has.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio::task::JoinHandle;
use uuid::Uuid;

#[derive(Default)]
struct State {
    seen: HashSet<Uuid>,
    repeats: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    delivered: u64,
    latencies_ms: Vec<f64>,
}

pub struct Arrivals {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

/// Milliseconds from the UUIDv7's timestamp to now; None for other ids.
fn latency_ms(id: &Uuid) -> Option<f64> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    let sent = Duration::new(secs, nanos);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    Some(now.saturating_sub(sent).as_secs_f64() * 1000.0)
}

/// The 99th percentile of `values` (sorted in place); None when empty.
pub fn p99(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let rank = (values.len() as f64 * 0.99).ceil() as usize;
    values.get(rank.checked_sub(1)?).copied()
}

impl Arrivals {
    /// Consumes `queue` at `url` until stopped, reconnecting after an error.
    pub fn start(url: String, queue: String) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                loop {
                    if let Err(e) = consume(&url, &queue, &state).await {
                        eprintln!("soak consumer: {e}; reconnecting");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
        Self { state, task }
    }

    /// Distinct ids received so far.
    pub fn distinct(&self) -> usize {
        self.state.lock().unwrap().seen.len()
    }

    /// Deliveries of an id already received.
    pub fn repeats(&self) -> u64 {
        self.state.lock().unwrap().repeats
    }

    pub fn has(&self, id: &Uuid) -> bool {
        self.state.lock().unwrap().seen.contains(id)
    }

    /// From the first new id received to the last.
    pub fn span(&self) -> Option<Duration> {
        let state = self.state.lock().unwrap();
        Some(state.last?.duration_since(state.first?))
    }

    /// The first deliveries since the last call and their latency p99; a new period begins.
    pub fn take_period(&self) -> (u64, Option<f64>) {
        let mut state = self.state.lock().unwrap();
        let delivered = std::mem::take(&mut state.delivered);
        let mut latencies = std::mem::take(&mut state.latencies_ms);
        (delivered, p99(&mut latencies))
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn consume(url: &str, queue: &str, state: &Mutex<State>) -> anyhow::Result<()> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(1_000, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "soak".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| Uuid::parse_str(id.as_str()).ok());
        if let Some(id) = id {
            let mut state = state.lock().unwrap();
            if state.seen.insert(id) {
                let now = Instant::now();
                state.first.get_or_insert(now);
                state.last = Some(now);
                state.delivered += 1;
                if let Some(ms) = latency_ms(&id) {
                    state.latencies_ms.push(ms);
                }
            } else {
                state.repeats += 1;
            }
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    anyhow::bail!("the consumer's stream ended")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_value_at_the_99th_rank() {
        let mut values: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        assert_eq!(p99(&mut values), Some(198.0));
        assert_eq!(p99(&mut [7.0]), Some(7.0));
        assert_eq!(p99(&mut []), None);
    }

    #[test]
    fn a_v7_id_made_now_is_a_few_milliseconds_old_and_a_v4_id_has_no_age() {
        let age = latency_ms(&Uuid::now_v7()).unwrap();
        assert!((0.0..1_000.0).contains(&age), "{age}");
        assert_eq!(latency_ms(&Uuid::new_v4()), None);
    }
}
