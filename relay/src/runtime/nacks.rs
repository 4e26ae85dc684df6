//! The pause after the broker nacked messages. A `basic.nack` is the broker's state (a quorum
//! queue without a majority, a full queue with `x-overflow: reject-publish`), not the
//! messages' fault: the rows stay pending with no attempt spent, and sending them again at once
//! would only be nacked again. So the worker pauses, longer while nothing at all is taken, and
//! says so once per spell, not once per batch.

use std::time::Duration;

use tracing::{info, warn};

use crate::metrics::BrokerMetrics;
use crate::protocol::batch::BatchReport;
use crate::runtime::backoff::Backoff;

/// The first pause after a nack; it doubles while the broker takes nothing, up to [`MAX`].
pub const BASE: Duration = Duration::from_millis(100);
/// The longest pause: short enough that a queue a consumer frees, or a quorum that returns,
/// is used again within seconds.
pub const MAX: Duration = Duration::from_secs(5);

/// One worker's spell of nacks.
#[derive(Debug)]
pub struct NackPause {
    backoff: Backoff,
    /// Messages nacked since the spell began; 0 outside one.
    nacked: u64,
}

impl Default for NackPause {
    fn default() -> Self {
        Self {
            backoff: Backoff::new(BASE, MAX),
            nacked: 0,
        }
    }
}

impl NackPause {
    /// After a batch: how long to wait before the next, when the broker nacked part of it.
    pub fn after(&mut self, report: &BatchReport, metrics: &BrokerMetrics) -> Option<Duration> {
        if report.nacked == 0 {
            if self.nacked > 0 && report.published > 0 {
                info!(
                    nacked = self.nacked,
                    "the broker takes messages again; {} message(s) were nacked meanwhile, none \
                     spent an attempt",
                    self.nacked
                );
                self.nacked = 0;
                self.backoff.reset();
            }
            return None;
        }
        if self.nacked == 0 {
            warn!(
                nacked = report.nacked,
                "the broker nacked {} message(s) (a basic.nack, or RabbitMQ 4's AMQP 1.0 \
                 rejected without a reason: a quorum queue without a majority of its nodes, or \
                 a full queue with x-overflow reject-publish); they stay \
                 pending, spend no attempt, and go again after a pause of up to {MAX:?} while \
                 the broker takes nothing",
                report.nacked
            );
        }
        self.nacked += report.nacked as u64;
        // Some of the batch was taken (a full queue that a consumer frees): the broker is
        // working, so the pause stays short.
        if report.published > 0 {
            self.backoff.reset();
        }
        metrics.nack_pauses.inc();
        Some(self.backoff.next_delay())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn report(published: usize, nacked: usize) -> BatchReport {
        BatchReport {
            claimed: published + nacked,
            published,
            untouched: nacked,
            nacked,
            ..Default::default()
        }
    }

    #[test]
    fn pauses_grow_while_nothing_is_taken_and_stay_short_while_some_is() {
        let metrics = Metrics::new();
        let mut pause = NackPause::default();
        assert_eq!(pause.after(&report(10, 0), &metrics.broker), None);
        let mut last = Duration::ZERO;
        for _ in 0..12 {
            last = pause.after(&report(0, 10), &metrics.broker).unwrap();
            assert!(last <= MAX);
        }
        assert!(last >= MAX / 2, "{last:?}");
        let partial = pause.after(&report(3, 7), &metrics.broker).unwrap();
        assert!(partial <= BASE, "{partial:?}");
        assert_eq!(pause.after(&report(10, 0), &metrics.broker), None);
        assert_eq!(pause.nacked, 0);
        assert!(
            metrics
                .render()
                .contains("outbox_relay_broker_nack_pauses_total 13")
        );
    }
}
