//! Says a recurring state once, then again only when it changes or a while has passed: the
//! workers, the reporter and the listener of a process that all meet the same standby (or the
//! same outage) make one log line between them, not one each per retry.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a state that lasts is said again, so a long wait is still visible in the log.
pub const REMIND_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default)]
pub struct Announcer {
    /// What was said last, and when it was first and last said.
    said: Arc<Mutex<Option<Said>>>,
}

#[derive(Debug)]
struct Said {
    text: String,
    since: Instant,
    at: Instant,
    /// Times the same text came up since it was last said.
    unsaid: u64,
}

impl Announcer {
    /// True when `text` is to be said now: it is new, or it was last said [`REMIND_EVERY`] ago.
    pub fn should_say(&self, text: &str) -> bool {
        self.say_at(text, Instant::now()).is_some()
    }

    /// [`Announcer::should_say`], telling how many times `text` came up unsaid since it was
    /// last said (0 when it is new), for a reminder such as "12 attempts failed since".
    pub fn say(&self, text: &str) -> Option<u64> {
        self.say_at(text, Instant::now())
    }

    fn say_at(&self, text: &str, now: Instant) -> Option<u64> {
        let mut said = lock(&self.said);
        match said.as_mut() {
            Some(last) if last.text == text && now.duration_since(last.at) < REMIND_EVERY => {
                last.unsaid += 1;
                None
            }
            Some(last) if last.text == text => {
                last.at = now;
                Some(std::mem::take(&mut last.unsaid))
            }
            _ => {
                *said = Some(Said {
                    text: text.to_string(),
                    since: now,
                    at: now,
                    unsaid: 0,
                });
                Some(0)
            }
        }
    }

    /// The state is over: how long it lasted since first said, when something was said (so the
    /// caller says once that it is over).
    pub fn over(&self) -> Option<Duration> {
        lock(&self.said).take().map(|said| said.since.elapsed())
    }
}

fn lock(slot: &Mutex<Option<Said>>) -> std::sync::MutexGuard<'_, Option<Said>> {
    // A panic while holding the lock cannot leave an Option half-written.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_text_is_said_once_a_minute_and_a_new_one_at_once() {
        let announcer = Announcer::default();
        let start = Instant::now();
        assert_eq!(announcer.say_at("standby", start), Some(0));
        for second in 1..60 {
            let at = start + Duration::from_secs(second);
            assert_eq!(
                announcer.say_at("standby", at),
                None,
                "said again at {second}s"
            );
        }
        // The reminder counts what went unsaid.
        assert_eq!(announcer.say_at("standby", start + REMIND_EVERY), Some(59));
        assert_eq!(
            announcer.say_at("unreachable", start + REMIND_EVERY),
            Some(0)
        );
        assert!(announcer.over().is_some());
        assert!(announcer.over().is_none());
        assert_eq!(announcer.say_at("standby", start + REMIND_EVERY), Some(0));
    }
}
