//! The broker's alarm (`connection.blocked`) as one state for the whole process. RabbitMQ's
//! alarm is the broker's, but it tells each connection on its own, and only once that
//! connection publishes: so the workers pool what their connections say, and whether the
//! process is blocked, whether to say so and whether it is over are decided under one lock.
//! Decided apart, a worker that read "blocked" just before another found it over would open a
//! second episode and say both lines again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::announce::Announcer;
use crate::metrics::GaugeSeat;

/// Why nothing is claimed while the broker blocks publishing, and what to look at.
pub const BROKER_BLOCKED: &str = "the broker blocks publishing (connection.blocked: a memory or \
     disk alarm; `rabbitmqctl status` lists the alarms): nothing is claimed, and no rows are held, \
     until it lifts";

/// Shared by the workers of one process.
#[derive(Debug, Clone, Default)]
pub struct BrokerAlarm {
    /// How many of the workers' connections the broker has blocked.
    blocked: Arc<Mutex<usize>>,
    said: Announcer,
}

/// What a worker does after its look at the alarm.
#[derive(Debug, PartialEq, Eq)]
pub enum AlarmTurn {
    /// Some connection of the process is blocked: claim nothing. `say` is true for the one
    /// worker that tells it (first, or as the minute's reminder).
    Blocked { say: bool },
    /// No connection is blocked. `over` is how long the alarm lasted, for the one worker that
    /// tells that it ended.
    Clear { over: Option<Duration> },
}

/// One worker's place in the alarm: whether its own connection is blocked, counted in the
/// `outbox_relay_broker_blocked` gauge.
#[derive(Debug)]
pub struct AlarmSeat {
    alarm: BrokerAlarm,
    seat: GaugeSeat,
}

impl BrokerAlarm {
    /// A seat for one worker, not blocked.
    pub fn seat(&self, gauge: prometheus::IntGauge) -> AlarmSeat {
        AlarmSeat {
            alarm: self.clone(),
            seat: GaugeSeat::new(gauge),
        }
    }
}

impl AlarmSeat {
    /// Records whether this worker's connection is blocked and decides, for the process as a
    /// whole, what the worker does and says.
    pub fn turn(&mut self, connection_blocked: bool) -> AlarmTurn {
        let shared = Arc::clone(&self.alarm.blocked);
        let mut blocked = lock(&shared);
        self.count(&mut blocked, connection_blocked);
        if *blocked > 0 {
            AlarmTurn::Blocked {
                say: self.alarm.said.should_say(BROKER_BLOCKED),
            }
        } else {
            AlarmTurn::Clear {
                over: self.alarm.said.over(),
            }
        }
    }

    /// The worker's connection is gone (or never was): it no longer counts as blocked.
    pub fn leave(&mut self) {
        let shared = Arc::clone(&self.alarm.blocked);
        let mut blocked = lock(&shared);
        self.count(&mut blocked, false);
    }

    /// The process's count and the gauge move together, under the caller's lock.
    fn count(&mut self, blocked: &mut usize, now: bool) {
        if self.seat.hold(now) {
            if now {
                *blocked += 1;
            } else {
                *blocked -= 1;
            }
        }
    }
}

impl Drop for AlarmSeat {
    fn drop(&mut self) {
        self.leave();
    }
}

fn lock(slot: &Mutex<usize>) -> std::sync::MutexGuard<'_, usize> {
    // A panic while holding the lock cannot leave a counter half-written.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge() -> prometheus::IntGauge {
        prometheus::IntGauge::new("blocked", "test").expect("a valid gauge")
    }

    #[test]
    fn one_alarm_met_by_two_workers_is_said_once_and_ended_once() {
        let alarm = BrokerAlarm::default();
        let gauge = gauge();
        let mut first = alarm.seat(gauge.clone());
        let mut second = alarm.seat(gauge.clone());
        assert_eq!(first.turn(true), AlarmTurn::Blocked { say: true });
        // The second worker's connection has not published yet: it waits all the same, quietly.
        assert_eq!(second.turn(false), AlarmTurn::Blocked { say: false });
        assert_eq!(gauge.get(), 1);
        assert_eq!(second.turn(true), AlarmTurn::Blocked { say: false });
        assert_eq!(gauge.get(), 2);
        // The first connection is unblocked before the second: the process is still blocked.
        assert_eq!(first.turn(false), AlarmTurn::Blocked { say: false });
        assert!(matches!(
            second.turn(false),
            AlarmTurn::Clear { over: Some(_) }
        ));
        assert_eq!(first.turn(false), AlarmTurn::Clear { over: None });
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn a_worker_that_leaves_blocked_does_not_keep_the_process_blocked() {
        let alarm = BrokerAlarm::default();
        let gauge = gauge();
        let mut staying = alarm.seat(gauge.clone());
        {
            let mut leaving = alarm.seat(gauge.clone());
            assert_eq!(leaving.turn(true), AlarmTurn::Blocked { say: true });
        }
        assert_eq!(gauge.get(), 0);
        assert!(matches!(
            staying.turn(false),
            AlarmTurn::Clear { over: Some(_) }
        ));
    }
}
