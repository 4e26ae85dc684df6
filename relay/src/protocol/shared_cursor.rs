//! One claim cursor for all the workers of a process: they take turns at the claim statement,
//! and each claim starts where the process's cursor says — a seek past the furthest row any of
//! them took, the wide claims on one schedule for the process.
//!
//! Why: a claim steps over every pending-index entry between where it starts and the first
//! row it can lock — the rows other workers hold (locked until their batch commits) and the
//! rows they just settled (dead entries vacuum has not removed yet). When each worker kept its
//! own cursor, the batches of all the others lay ahead of its seek, and each ran its own recent
//! claim every second over the same stretch; so the entries a claim stepped over, and with them
//! its buffers and its time, grew with the workers (measured: 2.9 pending-index entries per
//! claimed row at 2 workers, 41 at 32, 79 at 64; 147 buffers per claimed row at 64). Taking
//! turns on one cursor, a seek starts past every batch of its own process, and a process runs
//! one recent claim a second, not one per worker: what a claim steps over no longer grows with
//! the workers of a pod, only with the pods.
//!
//! What a cursor promises holds as before: rows behind the seek (committed late, or given back
//! by a batch that failed) are the wide claims' to find (see [`super::cursor`]).

use tokio::sync::{Mutex, MutexGuard};

use super::claim::ClaimStart;
use super::cursor::ClaimCursor;
use super::report::{BatchReport, ClaimFound};

/// Shared by the workers of one process, under unordered claims (per-key claims start at the
/// head of their own lanes and keep no cursor).
#[derive(Debug, Default)]
pub struct SharedCursor {
    cursor: Mutex<ClaimCursor>,
}

/// One worker's turn at the claim: no other worker of the process claims until it ends.
pub struct ClaimTurn<'a> {
    cursor: MutexGuard<'a, ClaimCursor>,
    pub start: ClaimStart,
}

impl SharedCursor {
    /// Waits for the turn; the claim starts at `turn.start`.
    pub async fn turn(&self) -> ClaimTurn<'_> {
        let mut cursor = self.cursor.lock().await;
        let start = cursor.next_start();
        ClaimTurn { cursor, start }
    }

    /// Records how a batch ended (see [`ClaimCursor::settled`]).
    pub async fn settled(&self, report: &BatchReport) {
        self.cursor.lock().await.settled(report);
    }

    /// After a failed batch: its rows are pending again, behind the seek.
    pub async fn reset(&self) {
        self.cursor.lock().await.reset();
    }

    /// See [`ClaimCursor::idle_after_empty_claim`].
    pub async fn idle_after_empty_claim(&self) -> bool {
        self.cursor.lock().await.idle_after_empty_claim()
    }
}

impl ClaimTurn<'_> {
    /// Ends the turn with what the claim found; `limit` is the most it could take.
    pub fn claimed(mut self, found: &ClaimFound, limit: usize) {
        self.cursor.claimed(found, limit);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{DateTime, Utc};

    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn found(claimed: usize, first: i64, last: i64) -> ClaimFound {
        ClaimFound {
            claimed,
            first: Some(at(first)),
            last: Some(at(last)),
            time: Duration::from_millis(1),
        }
    }

    #[tokio::test]
    async fn each_seek_starts_past_every_row_the_process_claimed() {
        let shared = SharedCursor::default();
        let turn = shared.turn().await;
        assert_eq!(turn.start, ClaimStart::Head, "nothing claimed yet");
        turn.claimed(&found(10, 0, 9), 10);
        // Two workers in a row: the second starts past the first's rows, not at its own.
        let turn = shared.turn().await;
        assert_eq!(turn.start, ClaimStart::After(at(9)));
        turn.claimed(&found(10, 10, 19), 10);
        let turn = shared.turn().await;
        assert_eq!(turn.start, ClaimStart::After(at(19)));
    }

    #[tokio::test]
    async fn a_batch_that_left_rows_pending_sends_the_next_claim_to_the_head() {
        let shared = SharedCursor::default();
        shared.turn().await.claimed(&found(10, 0, 9), 10);
        shared
            .settled(&BatchReport {
                claimed: 10,
                untouched: 10,
                ..Default::default()
            })
            .await;
        assert_eq!(shared.turn().await.start, ClaimStart::Head);
        shared.turn().await.claimed(&found(10, 0, 9), 10);
        shared.reset().await;
        assert_eq!(shared.turn().await.start, ClaimStart::Head, "a failure");
    }

    #[tokio::test]
    async fn workers_take_turns() {
        let shared = SharedCursor::default();
        let turn = shared.turn().await;
        let second = tokio::time::timeout(Duration::from_millis(50), shared.turn()).await;
        assert!(second.is_err(), "a second claim waits for the first");
        turn.claimed(&ClaimFound::default(), 10);
        let _turn = shared.turn().await;
    }
}
