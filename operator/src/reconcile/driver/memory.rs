//! What the reconciler remembers about each relay between two reconciles, in this process only:
//! which generation was migrated, the autoscaler's history, the failures in a row.
//!
//! Nothing tells a controller without a finalizer that an object was deleted, so an entry that
//! nobody read or wrote for `forget_after` is dropped: a deleted relay's entries go, and a live
//! relay, reconciled at least every resync or backoff interval, never loses its own. Like the
//! HPA controller's, this memory starts empty after a restart; every step copes with that.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One value per relay key, dropped once untouched for longer than `forget_after`.
#[derive(Debug)]
pub struct RelayMemory<T> {
    entries: Mutex<HashMap<String, Entry<T>>>,
    forget_after: Duration,
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    touched: Instant,
}

impl<T: Clone> RelayMemory<T> {
    pub fn new(forget_after: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            forget_after,
        }
    }

    /// The value for `key`, if remembered; reading it counts as a touch.
    pub fn get(&self, key: &str) -> Option<T> {
        self.get_at(key, Instant::now())
    }

    pub fn put(&self, key: &str, value: T) {
        self.put_at(key, value, Instant::now());
    }

    /// Replaces the value for `key` with `change(old)` and returns the new one.
    pub fn update(&self, key: &str, change: impl FnOnce(Option<T>) -> T) -> T {
        let now = Instant::now();
        let value = change(self.get_at(key, now));
        self.put_at(key, value.clone(), now);
        value
    }

    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// How many relays are remembered (expired entries included until the next write).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get_at(&self, key: &str, now: Instant) -> Option<T> {
        let mut entries = self.lock();
        let entry = entries.get_mut(key)?;
        if now.saturating_duration_since(entry.touched) > self.forget_after {
            entries.remove(key);
            return None;
        }
        entry.touched = now;
        Some(entry.value.clone())
    }

    /// Writes are where the map can grow, so they are where it is swept.
    fn put_at(&self, key: &str, value: T, now: Instant) {
        let mut entries = self.lock();
        entries.retain(|_, e| now.saturating_duration_since(e.touched) <= self.forget_after);
        entries.insert(
            key.to_string(),
            Entry {
                value,
                touched: now,
            },
        );
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<T>>> {
        // A poisoned lock only means another reconcile panicked mid-write; the map is still a
        // valid cache.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_per_key_and_can_be_forgotten() {
        let memory = RelayMemory::new(Duration::from_secs(60));
        memory.put("shop/orders", 1);
        memory.put("shop/billing", 2);
        assert_eq!(memory.get("shop/orders"), Some(1));
        assert_eq!(
            memory.update("shop/orders", |old| old.unwrap_or(0) + 10),
            11
        );
        memory.forget("shop/billing");
        assert_eq!(memory.get("shop/billing"), None);
        assert_eq!(memory.len(), 1);
    }

    #[test]
    fn untouched_entries_are_dropped_and_touched_ones_kept() {
        let memory = RelayMemory::new(Duration::from_secs(60));
        let start = Instant::now();
        memory.put_at("deleted", 1, start);
        memory.put_at("live", 2, start);
        // The live relay is reconciled every 50 s; the deleted one never again.
        for step in 1..=3 {
            let at = start + Duration::from_secs(50 * step);
            assert_eq!(memory.get_at("live", at), Some(2));
        }
        let later = start + Duration::from_secs(150);
        memory.put_at("new", 3, later);
        assert_eq!(memory.len(), 2, "the deleted relay's entry is swept");
        assert_eq!(memory.get_at("deleted", later), None);
        assert_eq!(memory.get_at("live", later), Some(2));
    }

    #[test]
    fn an_expired_entry_is_not_returned_even_before_a_sweep() {
        let memory = RelayMemory::new(Duration::from_secs(60));
        let start = Instant::now();
        memory.put_at("a", 1, start);
        assert_eq!(memory.get_at("a", start + Duration::from_secs(61)), None);
        assert!(memory.is_empty());
    }
}
