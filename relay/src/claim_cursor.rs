//! Where a worker's next claim starts, and when it runs the full claim.
//!
//! The full claim walks the pending index from its head, where the entries of processed rows
//! stay until vacuum removes them: with vacuum late or off, every full claim reads more pages
//! than the last (measured: 34,653 index pages two minutes into a 50,000 msg/s drain, 49,019 a
//! minute later). So after a batch the next claim seeks to the last claimed row's claim
//! position, and the full claim — what picks up rows committed late with an older position,
//! rows another worker released and rows left pending for a retry — runs on a schedule set by
//! its own measured cost, so it never takes more than a fixed share of a worker's time.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::batch::BatchReport;

/// While batches come back full, the full claim runs about this often when it is cheap.
pub const FULL_CLAIM_EVERY: Duration = Duration::from_secs(1);

/// However much it costs, the full claim runs at least this often: the longest a row committed
/// late with an older claim position waits while newer rows keep coming.
pub const FULL_CLAIM_AT_LEAST_EVERY: Duration = Duration::from_secs(60);

/// The full claim may take at most 1/FULL_CLAIM_COST_SHARE of a worker's time: after a full
/// claim that took `t`, the next waits at least `t × FULL_CLAIM_COST_SHARE`.
pub const FULL_CLAIM_COST_SHARE: u32 = 20;

#[derive(Debug, Default)]
pub struct ClaimCursor {
    /// Claim position of the last row of the last batch that left nothing pending behind it.
    bound: Option<DateTime<Utc>>,
    /// The last batch came back short: the head of the pending rows is near, so a full claim
    /// (the only one that sees late rows) is worth running as soon as it is affordable.
    head_near: bool,
    last_full_claim: Option<Instant>,
    full_claim_cost: Duration,
    /// The claim last handed out by `next_bound` is a full one.
    claiming_full: bool,
}

impl ClaimCursor {
    /// The claim position to seek from, or None for a full claim.
    pub fn next_bound(&mut self) -> Option<DateTime<Utc>> {
        self.next_bound_at(Instant::now())
    }

    /// Records the outcome of the claim `next_bound` handed out.
    pub fn advance(&mut self, report: &BatchReport, batch_size: usize) {
        self.advance_at(report, batch_size, Instant::now());
    }

    /// After a claim that found nothing: true when the worker should wait for new rows, false
    /// when a full claim is due now (an empty seek says nothing about rows before the bound).
    pub fn idle_after_empty_claim(&self) -> bool {
        self.idle_after_empty_claim_at(Instant::now())
    }

    /// After a failure the rows of the batch are pending again, behind the bound.
    pub fn reset(&mut self) {
        self.bound = None;
    }

    fn next_bound_at(&mut self, now: Instant) -> Option<DateTime<Utc>> {
        self.claiming_full = self.bound.is_none() || self.full_claim_due(now);
        if self.claiming_full { None } else { self.bound }
    }

    fn idle_after_empty_claim_at(&self, now: Instant) -> bool {
        self.claiming_full || !self.full_claim_due(now)
    }

    fn full_claim_due(&self, now: Instant) -> bool {
        let Some(at) = self.last_full_claim else {
            return true;
        };
        let since = now.saturating_duration_since(at);
        if since >= FULL_CLAIM_AT_LEAST_EVERY {
            return true;
        }
        let affordable = since >= self.full_claim_cost * FULL_CLAIM_COST_SHARE;
        affordable && (self.head_near || since >= FULL_CLAIM_EVERY)
    }

    fn advance_at(&mut self, report: &BatchReport, batch_size: usize, now: Instant) {
        if self.claiming_full {
            self.last_full_claim = Some(now);
            self.full_claim_cost = report.claim_time;
        }
        let left_pending =
            report.broker_broken.is_some() || report.retried > 0 || report.untouched > 0;
        if left_pending {
            self.bound = None;
            return;
        }
        // An empty claim moves nothing; a last row without a claim position (NULL sorts
        // last, and a seek would pass such rows by) means a full claim next.
        if report.claimed > 0 {
            self.bound = report.last_claimed;
        }
        self.head_near = report.claimed < batch_size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BATCH: usize = 10;

    fn position(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn batch(claimed: usize, last: i64, claim_ms: u64) -> BatchReport {
        BatchReport {
            claimed,
            published: claimed,
            last_claimed: (claimed > 0).then(|| position(last)),
            claim_time: Duration::from_millis(claim_ms),
            ..Default::default()
        }
    }

    /// A cursor that has just run a full claim costing `cost_ms` on a full batch ending at 1.
    fn after_full_claim(t0: Instant, cost_ms: u64) -> ClaimCursor {
        let mut cursor = ClaimCursor::default();
        assert_eq!(
            cursor.next_bound_at(t0),
            None,
            "the first claim is a full one"
        );
        cursor.advance_at(&batch(BATCH, 1, cost_ms), BATCH, t0);
        cursor
    }

    #[test]
    fn seeks_from_the_last_claimed_row_and_claims_fully_every_second_when_cheap() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 2);
        let t = t0 + Duration::from_millis(500);
        assert_eq!(cursor.next_bound_at(t), Some(position(1)));
        cursor.advance_at(&batch(BATCH, 2, 1), BATCH, t);
        assert_eq!(cursor.next_bound_at(t), Some(position(2)));
        cursor.advance_at(&batch(BATCH, 3, 1), BATCH, t);
        assert_eq!(
            cursor.next_bound_at(t0 + FULL_CLAIM_EVERY),
            None,
            "a cheap full claim runs every second while batches are full"
        );
    }

    #[test]
    fn an_expensive_full_claim_runs_less_often() {
        let t0 = Instant::now();
        // 200 ms: affordable again after 20 × 200 ms = 4 s.
        let mut cursor = after_full_claim(t0, 200);
        let t = t0 + Duration::from_secs(3);
        assert_eq!(cursor.next_bound_at(t), Some(position(1)));
        cursor.advance_at(&batch(BATCH, 2, 1), BATCH, t);
        assert_eq!(
            cursor.next_bound_at(t0 + Duration::from_secs(4)),
            None,
            "due once its cost is a twentieth of the time"
        );
    }

    #[test]
    fn however_expensive_the_full_claim_runs_every_minute() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 10_000);
        let t = t0 + FULL_CLAIM_AT_LEAST_EVERY - Duration::from_secs(1);
        assert_eq!(cursor.next_bound_at(t), Some(position(1)));
        cursor.advance_at(&batch(BATCH, 2, 1), BATCH, t);
        assert_eq!(cursor.next_bound_at(t0 + FULL_CLAIM_AT_LEAST_EVERY), None);
    }

    #[test]
    fn a_short_batch_brings_the_full_claim_forward_when_affordable() {
        let t0 = Instant::now();
        let mut cheap = after_full_claim(t0, 1);
        let t = t0 + Duration::from_millis(100);
        cheap.next_bound_at(t);
        cheap.advance_at(&batch(3, 2, 1), BATCH, t);
        assert_eq!(
            cheap.next_bound_at(t),
            None,
            "near the head a cheap full claim runs at once (20 × 1 ms passed)"
        );

        let mut costly = after_full_claim(t0, 50);
        costly.next_bound_at(t);
        costly.advance_at(&batch(3, 2, 1), BATCH, t);
        assert_eq!(
            costly.next_bound_at(t),
            Some(position(2)),
            "20 × 50 ms have not passed: keep seeking though the batch was short"
        );
        assert_eq!(costly.next_bound_at(t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn rows_left_pending_mean_a_full_claim_next() {
        let t0 = Instant::now();
        let t = t0 + Duration::from_millis(10);
        let left_pending = [
            BatchReport {
                retried: 1,
                ..batch(BATCH, 2, 1)
            },
            BatchReport {
                untouched: 1,
                ..batch(BATCH, 2, 1)
            },
            BatchReport {
                broker_broken: Some("gone".into()),
                ..batch(BATCH, 2, 1)
            },
        ];
        for report in left_pending {
            let mut cursor = after_full_claim(t0, 500);
            cursor.next_bound_at(t);
            cursor.advance_at(&report, BATCH, t);
            assert_eq!(cursor.next_bound_at(t), None, "{report:?}");
        }
        let mut cursor = after_full_claim(t0, 500);
        cursor.reset();
        assert_eq!(cursor.next_bound_at(t), None, "a failure");
    }

    #[test]
    fn a_last_row_without_claim_position_means_a_full_claim_next() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 500);
        let t = t0 + Duration::from_millis(10);
        cursor.next_bound_at(t);
        let report = BatchReport {
            last_claimed: None,
            ..batch(BATCH, 2, 1)
        };
        cursor.advance_at(&report, BATCH, t);
        assert_eq!(cursor.next_bound_at(t), None);
    }

    #[test]
    fn an_empty_seek_keeps_the_bound_and_idles_unless_a_full_claim_is_due() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 500);
        let t = t0 + Duration::from_millis(10);
        assert_eq!(cursor.next_bound_at(t), Some(position(1)));
        cursor.advance_at(&batch(0, 0, 1), BATCH, t);
        assert_eq!(cursor.next_bound_at(t), Some(position(1)), "bound kept");
        // The full claim cost 500 ms, so it is 10 s away: the worker waits for new rows.
        assert!(cursor.idle_after_empty_claim_at(t));

        let mut cheap = after_full_claim(t0, 0);
        cheap.next_bound_at(t);
        cheap.advance_at(&batch(0, 0, 1), BATCH, t);
        assert!(
            !cheap.idle_after_empty_claim_at(t),
            "an empty seek says nothing of older rows: a due full claim runs first"
        );
        assert_eq!(cheap.next_bound_at(t), None);
        cheap.advance_at(&batch(0, 0, 1), BATCH, t);
        assert!(
            cheap.idle_after_empty_claim_at(t),
            "an empty full claim idles"
        );
    }
}
