//! When the soak's faults come. A run is cut into periods (a minute in `make soak`, seconds in
//! `make test`'s short version) and every fault is placed at a fixed share of the run, so that a
//! run of any length meets them in the same order: a relay pod killed, a RabbitMQ node
//! restarted, PostgreSQL restarted, then a transaction held open, and a fault-free tail long
//! enough to show that the latency came back and that nothing kept growing.

use std::time::Duration;

/// The fewest periods a schedule can place its faults in (one unit each, see [`Schedule::of`]).
pub const MIN_PERIODS: u32 = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL to one relay pod's container, through the container runtime: the kubelet
    /// starts it again and the other pod carries on.
    RelayPodKilled,
    /// RabbitMQ node 2 of the three stopped, then started again: the relays on it move to
    /// another node (each is given all three).
    BrokerNodeRestarted,
    /// The database's primary stopped (`pg_ctl stop -m fast`) and started again.
    PostgresRestarted,
    /// A transaction holding a transaction id, left open for this many periods: vacuum cannot
    /// remove what the relay settles meanwhile.
    LongTransaction { periods: u32 },
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::RelayPodKilled => "relay pod killed",
            Fault::BrokerNodeRestarted => "RabbitMQ node restarted",
            Fault::PostgresRestarted => "PostgreSQL restarted",
            Fault::LongTransaction { .. } => "long transaction",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub period: Duration,
    pub periods: u32,
    /// The period whose memory later ones are held to (minute 10 of 90).
    pub baseline: u32,
    /// Periods the latency has to come back in after the long transaction ends (10 of 90).
    pub recovery: u32,
    /// Each fault and the period it starts in, in order.
    pub faults: Vec<(u32, Fault)>,
}

impl Schedule {
    /// `periods` periods of `period`, in units of `periods / 18` periods (5 minutes of 90):
    /// baseline at unit 2, a relay pod killed at 3, a RabbitMQ node restarted at 5, PostgreSQL
    /// restarted at 7, a transaction open from unit 9 for 2 units, and 2 units for the latency
    /// to come back; the remaining 5 units are fault-free.
    pub fn of(periods: u32, period: Duration) -> Result<Self, String> {
        if periods < MIN_PERIODS {
            return Err(format!(
                "a soak needs at least {MIN_PERIODS} periods to place its faults in, not \
                 {periods} (MINUTES={MIN_PERIODS} or more)"
            ));
        }
        let unit = periods / MIN_PERIODS;
        Ok(Self {
            period,
            periods,
            baseline: 2 * unit,
            recovery: 2 * unit,
            faults: vec![
                (3 * unit, Fault::RelayPodKilled),
                (5 * unit, Fault::BrokerNodeRestarted),
                (7 * unit, Fault::PostgresRestarted),
                (9 * unit, Fault::LongTransaction { periods: 2 * unit }),
            ],
        })
    }

    /// The faults that start in `index`.
    pub fn starting_in(&self, index: u32) -> impl Iterator<Item = Fault> + '_ {
        self.faults
            .iter()
            .filter(move |(at, _)| *at == index)
            .map(|(_, fault)| *fault)
    }

    /// The period the long transaction ends in, if the schedule has one.
    pub fn long_transaction_end(&self) -> Option<u32> {
        self.faults.iter().find_map(|(at, fault)| match fault {
            Fault::LongTransaction { periods } => Some(at + periods),
            _ => None,
        })
    }

    /// Seconds from the first period's start to the start of `index`.
    pub fn start_of(&self, index: u32) -> f64 {
        self.period.as_secs_f64() * f64::from(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ninety_minutes_place_the_faults_as_the_issue_reads() {
        let schedule = Schedule::of(90, Duration::from_secs(60)).unwrap();
        assert_eq!(schedule.baseline, 10);
        assert_eq!(schedule.recovery, 10);
        assert_eq!(
            schedule.faults,
            vec![
                (15, Fault::RelayPodKilled),
                (25, Fault::BrokerNodeRestarted),
                (35, Fault::PostgresRestarted),
                (45, Fault::LongTransaction { periods: 10 }),
            ]
        );
        assert_eq!(schedule.long_transaction_end(), Some(55));
        assert_eq!(
            schedule.starting_in(25).collect::<Vec<_>>(),
            [Fault::BrokerNodeRestarted]
        );
        assert_eq!(schedule.starting_in(26).count(), 0);
    }

    #[test]
    fn the_short_run_keeps_the_order_and_a_fault_free_tail() {
        let schedule = Schedule::of(MIN_PERIODS, Duration::from_secs(6)).unwrap();
        let starts: Vec<u32> = schedule.faults.iter().map(|(at, _)| *at).collect();
        assert_eq!(starts, [3, 5, 7, 9]);
        let end = schedule.long_transaction_end().unwrap();
        assert!(end + schedule.recovery < schedule.periods);
        assert_eq!(schedule.start_of(3), 18.0);
    }

    #[test]
    fn too_few_periods_are_refused_naming_minutes() {
        let refused = Schedule::of(10, Duration::from_secs(60)).unwrap_err();
        assert!(refused.contains("MINUTES=18"), "{refused}");
    }
}
