//! What a publish that just ended badly tells the process's other workers, so that the ones
//! queued behind it for a publish slot, their rows already claimed, do not each repeat it:
//!
//! - it ended on a connection the broker blocks (a memory or disk alarm): the next holders give
//!   their claims back instead of publishing into the alarm, before the blocked worker's loop has
//!   counted its connection on the blocked gauge;
//! - it got no confirm within its deadline: the next holders whose connection is older than that
//!   publish most likely share its silent path (a cut), so they give their rows back and
//!   reconnect instead of each waiting out a deadline of its own. A connection opened since has
//!   proven the path and publishes.
//!
//! Both are noted before the slot is released, and read once per batch, under one lock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a notice holds the next slot holders back: longer than a batch's commit and the
/// worker's return to its loop, where the blocked connection is counted.
const NOTICE: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct PublishNotices {
    last: Mutex<Last>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Last {
    blocked: Option<Instant>,
    timed_out: Option<Instant>,
}

/// Why a batch about to publish is held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldBack {
    /// A publish just ended on a blocked connection.
    Blocked,
    /// A publish just timed out on a connection opened before it.
    PeerTimedOut,
}

impl PublishNotices {
    fn last(&self) -> std::sync::MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A publish just ended on a blocked connection.
    pub fn note_blocked(&self) {
        self.last().blocked = Some(Instant::now());
    }

    /// A publish just got no confirm within its deadline.
    pub fn note_timed_out(&self) {
        self.last().timed_out = Some(Instant::now());
    }

    /// Whether a batch about to publish on a connection opened at `opened` must wait, and why.
    pub fn hold_back(&self, opened: Instant) -> Option<HoldBack> {
        let last = *self.last();
        let recent = |at: Option<Instant>| at.filter(|at| at.elapsed() < NOTICE);
        if recent(last.blocked).is_some() {
            Some(HoldBack::Blocked)
        } else if recent(last.timed_out).is_some_and(|at| at > opened) {
            Some(HoldBack::PeerTimedOut)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_publish_holds_back_everyone_and_a_timed_out_one_only_older_connections() {
        let notices = PublishNotices::default();
        let before = Instant::now();
        assert_eq!(notices.hold_back(before), None);

        notices.note_timed_out();
        assert_eq!(notices.hold_back(before), Some(HoldBack::PeerTimedOut));
        let reconnected = Instant::now();
        assert_eq!(notices.hold_back(reconnected), None);

        notices.note_blocked();
        assert_eq!(notices.hold_back(reconnected), Some(HoldBack::Blocked));
        assert_eq!(notices.hold_back(Instant::now()), Some(HoldBack::Blocked));
    }

    #[test]
    fn a_notice_expires() {
        let notices = PublishNotices::default();
        let long_ago = Instant::now() - NOTICE - Duration::from_secs(1);
        notices.last().blocked = Some(long_ago);
        notices.last().timed_out = Some(long_ago);
        assert_eq!(notices.hold_back(long_ago - Duration::from_secs(1)), None);
    }
}
