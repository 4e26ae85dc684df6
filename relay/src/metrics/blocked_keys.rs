//! Keys held back under per-key ordering: a key whose next message the broker refused waits
//! (head of line) until that message is confirmed or dead-lettered. The workers of a process
//! hold disjoint lanes, so one map per process knows every key its workers block, and each
//! key is blocked by one process at a time; summed over pods the count is the relay's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use prometheus::{Gauge, IntGauge, Registry};

use super::registry::registered;

/// What a per-key batch did to one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEvent {
    /// The broker refused the key's next message, which stays pending for another attempt.
    Refused,
    /// A message of the key was settled (confirmed or dead-lettered): it moves on.
    Settled,
}

#[derive(Debug, Clone, Copy)]
struct Blocked {
    lane: i32,
    /// The first refusal this process saw for the key's current head.
    since: Instant,
}

#[derive(Clone)]
pub struct BlockedKeys {
    keys: Arc<Mutex<HashMap<Vec<u8>, Blocked>>>,
    count: IntGauge,
    oldest_age_seconds: Gauge,
}

impl BlockedKeys {
    pub fn new(r: &Registry) -> Self {
        Self {
            keys: Arc::default(),
            count: registered(
                r,
                IntGauge::new(
                    "outbox_relay_blocked_keys",
                    "Partition keys whose next message the broker refused, waiting for a retry",
                ),
            ),
            oldest_age_seconds: registered(
                r,
                Gauge::new(
                    "outbox_relay_blocked_key_oldest_age_seconds",
                    "How long the longest-blocked partition key has waited since its first refusal",
                ),
            ),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Blocked>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies a per-key batch's outcomes, in claim order: (key, lane, what happened).
    pub fn record<'a>(&self, events: impl IntoIterator<Item = (&'a [u8], i32, KeyEvent)>) {
        let mut keys = self.keys();
        for (key, lane, event) in events {
            match event {
                KeyEvent::Refused => {
                    if !keys.contains_key(key) {
                        let since = Instant::now();
                        keys.insert(key.to_vec(), Blocked { lane, since });
                    }
                }
                KeyEvent::Settled => {
                    if !keys.is_empty() {
                        keys.remove(key);
                    }
                }
            }
        }
        self.count.set(keys.len() as i64);
    }

    /// Lanes this process gave up (or lost with a connection): their keys are another
    /// worker's to report now.
    pub fn release_lanes(&self, lanes: &[i32]) {
        if lanes.is_empty() {
            return;
        }
        let mut keys = self.keys();
        keys.retain(|_, blocked| !lanes.contains(&blocked.lane));
        self.count.set(keys.len() as i64);
    }

    /// Sets the age gauge to now; called before every scrape, so the age grows between
    /// batches too.
    pub fn refresh(&self) {
        let keys = self.keys();
        let oldest = keys.values().map(|blocked| blocked.since).min();
        self.oldest_age_seconds
            .set(oldest.map_or(0.0, |since| since.elapsed().as_secs_f64()));
        self.count.set(keys.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges(blocked: &BlockedKeys) -> (i64, f64) {
        blocked.refresh();
        (blocked.count.get(), blocked.oldest_age_seconds.get())
    }

    #[test]
    fn a_key_is_blocked_from_its_refusal_until_it_settles_or_its_lane_goes() {
        let blocked = BlockedKeys::new(&Registry::new());
        assert_eq!(gauges(&blocked), (0, 0.0));
        blocked.record([
            (&b"a"[..], 1, KeyEvent::Refused),
            (b"b", 2, KeyEvent::Settled),
        ]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // A second refusal of the same key keeps its first time.
        blocked.record([
            (&b"a"[..], 1, KeyEvent::Refused),
            (b"c", 3, KeyEvent::Refused),
        ]);
        let (count, age) = gauges(&blocked);
        assert_eq!(count, 2);
        assert!(age >= 0.02, "{age}");
        blocked.record([(&b"a"[..], 1, KeyEvent::Settled)]);
        assert_eq!(gauges(&blocked).0, 1);
        blocked.release_lanes(&[4]);
        assert_eq!(gauges(&blocked).0, 1);
        blocked.release_lanes(&[3]);
        assert_eq!(gauges(&blocked), (0, 0.0));
    }
}
