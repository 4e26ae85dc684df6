//! Where a worker's next claim starts.
//!
//! A claim starting at the head of the pending index walks the entries processed rows leave
//! there until vacuum removes them: with vacuum late or off, every such full claim reads more
//! pages than the last (measured: 34,653 index pages two minutes into a 50,000 msg/s drain,
//! 49,019 a minute later), and drags them through the shared buffers, evicting the pages the
//! marks need (mark mode slowed by a fifth over seven minutes on a machine with 128 MB of
//! shared buffers). So claims come in three widths:
//!
//! - the seek, after a batch: from the last claimed row's claim position;
//! - the recent claim, about once a second: from the earlier of the first pending row the
//!   previous wide claim found and the database's now() minus [`RECENT_WINDOW`]. It picks up
//!   rows committed late with a recent claim position, and rows another worker released
//!   since, walking only the dead entries of that stretch;
//! - the full claim, from the head: at start, after a failure or a batch that left rows
//!   pending, at least once a minute, and when the worker is idle and it is affordable. It is
//!   what picks up rows committed later than [`RECENT_WINDOW`] after their claim position.
//!
//! The wide claims run on a schedule set by their own measured cost, so they never take more
//! than a fixed share of a worker's time.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::claim::ClaimStart;
use super::report::{BatchReport, ClaimFound};

/// While batches come back full, the recent claim runs about this often when it is cheap.
pub const RECENT_CLAIM_EVERY: Duration = Duration::from_secs(1);

/// However much it costs, the full claim runs at least this often: the longest a row committed
/// late with an older claim position waits while newer rows keep coming.
pub const FULL_CLAIM_AT_LEAST_EVERY: Duration = Duration::from_secs(60);

/// A wide claim may take at most 1/CLAIM_COST_SHARE of a worker's time: after one that took
/// `t`, the next of its kind waits at least `t × CLAIM_COST_SHARE`.
pub const CLAIM_COST_SHARE: u32 = 20;

/// How much of the pending index a claim can see: a wider claim sees all a narrower one does.
fn width(start: ClaimStart) -> u8 {
    match start {
        ClaimStart::After(_) => 0,
        ClaimStart::Recent { .. } => 1,
        ClaimStart::Head => 2,
    }
}

/// When a kind of wide claim last ran and what it cost.
#[derive(Debug, Default, Clone, Copy)]
struct Schedule {
    last: Option<Instant>,
    cost: Duration,
}

impl Schedule {
    fn since(&self, now: Instant) -> Option<Duration> {
        self.last.map(|at| now.saturating_duration_since(at))
    }

    /// Its cost is at most 1/CLAIM_COST_SHARE of the time since it last ran.
    fn affordable(&self, now: Instant) -> bool {
        self.since(now)
            .is_none_or(|since| since >= self.cost * CLAIM_COST_SHARE)
    }
}

#[derive(Debug, Default)]
pub struct ClaimCursor {
    /// Claim position of the last row of the last batch that left nothing pending behind it.
    bound: Option<DateTime<Utc>>,
    /// Claim position of the first row the last wide claim that found rows claimed: up to
    /// there, nothing was pending that this worker could take.
    horizon: Option<DateTime<Utc>>,
    /// The last batch came back short: the head of the pending rows is near, so a recent claim
    /// (which sees late rows) is worth running as soon as it is affordable.
    head_near: bool,
    /// The last claim found nothing.
    last_empty: bool,
    recent: Schedule,
    full: Schedule,
    /// Where the claim last handed out by `next_start` starts.
    handed_out: ClaimStart,
}

impl ClaimCursor {
    /// Where the next claim starts.
    pub fn next_start(&mut self) -> ClaimStart {
        self.next_start_at(Instant::now())
    }

    /// Records what the claim `next_start` handed out found; `limit` is the most it could take.
    pub fn claimed(&mut self, found: &ClaimFound, limit: usize) {
        self.claimed_at(found, limit, Instant::now());
    }

    /// Records how the batch ended: rows it left pending lie behind the bound, for a full claim.
    pub fn settled(&mut self, report: &BatchReport) {
        let left_pending =
            report.broker_broken.is_some() || report.retried > 0 || report.untouched > 0;
        if left_pending {
            self.bound = None;
        }
    }

    /// After a claim that found nothing: true when the worker should wait for new rows, false
    /// when a wider claim is due now (an empty seek says nothing about rows before its start).
    pub fn idle_after_empty_claim(&self) -> bool {
        self.idle_after_empty_claim_at(Instant::now())
    }

    /// After a failure the rows of the batch are pending again, behind the bound.
    pub fn reset(&mut self) {
        self.bound = None;
    }

    fn next_start_at(&mut self, now: Instant) -> ClaimStart {
        self.handed_out = self.start_due(now);
        self.handed_out
    }

    fn idle_after_empty_claim_at(&self, now: Instant) -> bool {
        width(self.start_due(now)) <= width(self.handed_out)
    }

    fn start_due(&self, now: Instant) -> ClaimStart {
        let Some(bound) = self.bound else {
            return ClaimStart::Head;
        };
        let full_overdue = self
            .full
            .since(now)
            .is_none_or(|since| since >= FULL_CLAIM_AT_LEAST_EVERY);
        // Idle at the head the full claim evicts nothing a busy worker needs: it runs as often
        // as its cost allows.
        if full_overdue || (self.last_empty && self.full.affordable(now)) {
            return ClaimStart::Head;
        }
        let since_wide = self.recent.since(now);
        let recent_due = self.recent.affordable(now)
            && (self.head_near || since_wide.is_none_or(|since| since >= RECENT_CLAIM_EVERY));
        if recent_due {
            ClaimStart::Recent {
                horizon: self.horizon,
            }
        } else {
            ClaimStart::After(bound)
        }
    }

    fn claimed_at(&mut self, found: &ClaimFound, limit: usize, now: Instant) {
        match self.handed_out {
            ClaimStart::Head => {
                self.full = Schedule {
                    last: Some(now),
                    cost: found.time,
                };
                // The full claim sees all the recent one does, so it resets its schedule too.
                self.recent.last = Some(now);
                // An empty full claim: nothing this worker could take was pending anywhere.
                self.horizon = found.first;
            }
            ClaimStart::Recent { .. } => {
                self.recent = Schedule {
                    last: Some(now),
                    cost: found.time,
                };
                if found.claimed > 0 {
                    self.horizon = found.first;
                }
            }
            ClaimStart::After(_) => {}
        }
        self.last_empty = found.claimed == 0;
        self.head_near = found.claimed < limit;
        // An empty claim moves nothing. A wide claim that came back short found the few rows
        // behind the bound (committed late, given back): the seeks stay where they were, past
        // the rows the other workers sharing this cursor hold. One that came back full may
        // have more right after its rows (a backfill with old claim positions): the seeks go
        // on from there. A last row without a claim position (NULL sorts last, and a seek
        // would pass such rows by) means a full claim next.
        if found.claimed > 0 {
            self.bound = match (self.bound, found.last) {
                (Some(bound), Some(last)) if found.claimed < limit => Some(bound.max(last)),
                (_, last) => last,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::BrokerFailure;

    const BATCH: usize = 10;

    fn position(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    /// A batch of `claimed` rows at claim positions `first..=last`, whose claim took `claim_ms`.
    fn batch(claimed: usize, first: i64, last: i64, claim_ms: u64) -> BatchReport {
        BatchReport {
            claimed,
            published: claimed,
            found: ClaimFound {
                claimed,
                first: (claimed > 0).then(|| position(first)),
                last: (claimed > 0).then(|| position(last)),
                time: Duration::from_millis(claim_ms),
            },
            ..Default::default()
        }
    }

    fn empty(claim_ms: u64) -> BatchReport {
        batch(0, 0, 0, claim_ms)
    }

    /// Hands out the next claim at `at` and records `report` as its outcome.
    fn claim(cursor: &mut ClaimCursor, at: Instant, report: &BatchReport) -> ClaimStart {
        let start = cursor.next_start_at(at);
        cursor.claimed_at(&report.found, BATCH, at);
        cursor.settled(report);
        start
    }

    /// A cursor that has just run a full claim costing `cost_ms` on a full batch at 0..=1.
    fn after_full_claim(t0: Instant, cost_ms: u64) -> ClaimCursor {
        let mut cursor = ClaimCursor::default();
        let start = claim(&mut cursor, t0, &batch(BATCH, 0, 1, cost_ms));
        assert_eq!(start, ClaimStart::Head, "the first claim is a full one");
        cursor
    }

    fn recent_from(first: i64) -> ClaimStart {
        ClaimStart::Recent {
            horizon: Some(position(first)),
        }
    }

    #[test]
    fn seeks_from_the_last_claimed_row_and_claims_recent_rows_every_second() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 2);
        let t = t0 + Duration::from_millis(500);
        assert_eq!(
            claim(&mut cursor, t, &batch(BATCH, 2, 3, 1)),
            ClaimStart::After(position(1))
        );
        assert_eq!(
            claim(&mut cursor, t, &batch(BATCH, 4, 5, 1)),
            ClaimStart::After(position(3))
        );
        assert_eq!(
            claim(&mut cursor, t0 + RECENT_CLAIM_EVERY, &batch(BATCH, 6, 7, 1)),
            recent_from(0),
            "while batches are full, the recent claim runs every second from the horizon \
             the full claim found"
        );
        assert_eq!(
            cursor.next_start_at(t0 + RECENT_CLAIM_EVERY),
            ClaimStart::After(position(7))
        );
    }

    #[test]
    fn the_recent_claim_moves_the_horizon_to_the_first_row_it_finds() {
        let t0 = Instant::now();
        // The full claim cost 500 ms: 10 s away, so an empty recent claim does not bring it on.
        let mut cursor = after_full_claim(t0, 500);
        let t1 = t0 + RECENT_CLAIM_EVERY;
        assert_eq!(
            claim(&mut cursor, t1, &batch(BATCH, 5, 9, 1)),
            recent_from(0)
        );
        let t2 = t1 + RECENT_CLAIM_EVERY;
        assert_eq!(claim(&mut cursor, t2, &empty(1)), recent_from(5));
        assert_eq!(
            cursor.next_start_at(t2 + RECENT_CLAIM_EVERY),
            recent_from(5),
            "an empty recent claim keeps the horizon"
        );
    }

    #[test]
    fn a_wide_claim_that_finds_rows_behind_the_seek_leaves_the_seek_where_it_was() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 2);
        let t = t0 + Duration::from_millis(100);
        claim(&mut cursor, t, &batch(BATCH, 2, 9, 1));
        // A few rows committed late, behind the bound, found by the recent claim.
        let t1 = t0 + RECENT_CLAIM_EVERY;
        assert_eq!(claim(&mut cursor, t1, &batch(3, 4, 5, 1)), recent_from(0));
        assert_eq!(
            cursor.next_start_at(t1),
            ClaimStart::After(position(9)),
            "the seek does not walk back over the rows claimed since"
        );
    }

    #[test]
    fn a_wide_claim_that_comes_back_full_behind_the_seek_moves_the_seek_there() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 2);
        claim(&mut cursor, t0, &batch(BATCH, 2, 9, 1));
        // A backfill with old claim positions: a full batch behind the bound, more after it.
        let t1 = t0 + RECENT_CLAIM_EVERY;
        assert_eq!(
            claim(&mut cursor, t1, &batch(BATCH, 4, 5, 1)),
            recent_from(0)
        );
        assert_eq!(cursor.next_start_at(t1), ClaimStart::After(position(5)));
    }

    #[test]
    fn an_expensive_recent_claim_runs_less_often() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 2);
        let t1 = t0 + RECENT_CLAIM_EVERY;
        // 200 ms: affordable again after 20 × 200 ms = 4 s.
        assert_eq!(
            claim(&mut cursor, t1, &batch(BATCH, 2, 3, 200)),
            recent_from(0)
        );
        let t = t1 + Duration::from_secs(3);
        assert_eq!(
            claim(&mut cursor, t, &batch(BATCH, 4, 5, 1)),
            ClaimStart::After(position(3))
        );
        assert_eq!(
            cursor.next_start_at(t1 + Duration::from_secs(4)),
            recent_from(2),
            "due once its cost is a twentieth of the time"
        );
    }

    #[test]
    fn however_expensive_the_full_claim_runs_every_minute_and_only_then_while_busy() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 10_000);
        let mut t = t0;
        while t + RECENT_CLAIM_EVERY < t0 + FULL_CLAIM_AT_LEAST_EVERY {
            t += RECENT_CLAIM_EVERY;
            let start = claim(&mut cursor, t, &batch(BATCH, 2, 3, 1));
            assert_ne!(start, ClaimStart::Head, "a full claim while busy at {t:?}");
        }
        assert_eq!(
            cursor.next_start_at(t0 + FULL_CLAIM_AT_LEAST_EVERY),
            ClaimStart::Head
        );
    }

    #[test]
    fn a_short_batch_brings_the_recent_claim_forward_when_affordable() {
        let t0 = Instant::now();
        let t = t0 + Duration::from_millis(100);
        let mut cheap = after_full_claim(t0, 2);
        claim(&mut cheap, t, &batch(3, 2, 2, 1));
        assert_eq!(
            cheap.next_start_at(t),
            recent_from(0),
            "near the head a cheap recent claim runs at once"
        );

        let mut costly = after_full_claim(t0, 2);
        let t1 = t0 + RECENT_CLAIM_EVERY;
        assert_eq!(
            claim(&mut costly, t1, &batch(BATCH, 2, 3, 50)),
            recent_from(0)
        );
        let t = t1 + Duration::from_millis(100);
        claim(&mut costly, t, &batch(3, 4, 4, 1));
        assert_eq!(
            costly.next_start_at(t),
            ClaimStart::After(position(4)),
            "20 × 50 ms have not passed: keep seeking though the batch was short"
        );
        assert_eq!(
            costly.next_start_at(t1 + RECENT_CLAIM_EVERY),
            recent_from(2)
        );
    }

    #[test]
    fn rows_left_pending_mean_a_full_claim_next() {
        let t0 = Instant::now();
        let t = t0 + Duration::from_millis(10);
        let left_pending = [
            BatchReport {
                retried: 1,
                ..batch(BATCH, 2, 3, 1)
            },
            BatchReport {
                untouched: 1,
                ..batch(BATCH, 2, 3, 1)
            },
            BatchReport {
                broker_broken: Some(BrokerFailure::ConfirmTimeout(Duration::from_secs(10))),
                ..batch(BATCH, 2, 3, 1)
            },
        ];
        for report in left_pending {
            let mut cursor = after_full_claim(t0, 500);
            claim(&mut cursor, t, &report);
            assert_eq!(cursor.next_start_at(t), ClaimStart::Head, "{report:?}");
        }
        let mut cursor = after_full_claim(t0, 500);
        cursor.reset();
        assert_eq!(cursor.next_start_at(t), ClaimStart::Head, "a failure");
    }

    #[test]
    fn a_last_row_without_claim_position_means_a_full_claim_next() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 500);
        let t = t0 + Duration::from_millis(10);
        let mut report = batch(BATCH, 2, 3, 1);
        report.found.last = None;
        claim(&mut cursor, t, &report);
        assert_eq!(cursor.next_start_at(t), ClaimStart::Head);
    }

    #[test]
    fn an_empty_seek_widens_the_claim_step_by_step_before_idling() {
        let t0 = Instant::now();
        let t = t0 + Duration::from_millis(100);
        // The full claim cost 500 ms, so it is 10 s away; the recent claim is cheap.
        let mut cursor = after_full_claim(t0, 500);
        assert_eq!(
            claim(&mut cursor, t, &empty(1)),
            ClaimStart::After(position(1))
        );
        assert!(
            !cursor.idle_after_empty_claim_at(t),
            "an empty seek says nothing of older rows: the due recent claim runs first"
        );
        assert_eq!(claim(&mut cursor, t, &empty(1)), recent_from(0));
        assert!(
            cursor.idle_after_empty_claim_at(t),
            "full claim not affordable"
        );
        assert_eq!(
            cursor.next_start_at(t),
            ClaimStart::After(position(1)),
            "the bound is kept"
        );

        let mut cheap = after_full_claim(t0, 0);
        assert_eq!(
            claim(&mut cheap, t, &empty(1)),
            ClaimStart::After(position(1))
        );
        assert!(!cheap.idle_after_empty_claim_at(t));
        assert_eq!(
            claim(&mut cheap, t, &empty(1)),
            ClaimStart::Head,
            "idle at the head, an affordable full claim runs"
        );
        assert!(
            cheap.idle_after_empty_claim_at(t),
            "an empty full claim idles"
        );
        assert_eq!(
            cheap.next_start_at(t + RECENT_CLAIM_EVERY),
            ClaimStart::Head,
            "and runs again when woken while it stays affordable"
        );
    }

    #[test]
    fn an_empty_full_claim_forgets_the_horizon() {
        let t0 = Instant::now();
        let mut cursor = after_full_claim(t0, 0);
        let t = t0 + Duration::from_millis(100);
        claim(&mut cursor, t, &empty(0));
        // Nothing pending anywhere: the next recent claim starts at now() minus the window.
        assert_eq!(claim(&mut cursor, t, &empty(10)), ClaimStart::Head);
        assert_eq!(
            cursor.next_start_at(t + Duration::from_millis(100)),
            ClaimStart::Recent { horizon: None }
        );
    }
}
