//! Why the process cannot relay, beyond "not connected": the workers find it out when they
//! connect, `/readyz` and the reporter tell it. The connected gauges say whether; this says why.

use std::sync::{Arc, Mutex};

use crate::announce::Announcer;
use crate::broker::{ConnectError, Refusal};
use crate::database::{ConnectFailure, FailureKind};
use crate::runtime::alarm::{BROKER_BLOCKED, BrokerAlarm};
use crate::table::reports::{Problem, ProblemKind};

/// Shared by the workers, the HTTP endpoints and the reporter of one process.
#[derive(Debug, Clone, Default)]
pub struct Health {
    broker: Arc<Mutex<Option<Problem>>>,
    database: Arc<Mutex<Option<Problem>>>,
    /// What the process last said about the database's state, so its tasks say it once.
    database_said: Announcer,
    /// The broker's alarm (`connection.blocked`), which every worker meets.
    alarm: BrokerAlarm,
    /// Why the lag report cannot be written (a missing report table, a privilege): shown on
    /// `/readyz` beside the state, without making the process unready, since it still relays.
    report: Arc<Mutex<Option<String>>>,
    /// The same for a broker the workers cannot connect to (unreachable, refusing, missing
    /// its exchange): one line for the process, not one per worker per retry.
    broker_said: Announcer,
}

impl Health {
    /// Records where a worker's broker link stands after its connect step: connected (just now
    /// or still), or failed without a known cause, clears what an earlier failure said, so no
    /// stale reason outlives its state.
    pub fn broker_connect(&self, outcome: Result<(), &ConnectError>) {
        *lock(&self.broker) = outcome.err().and_then(problem_of);
    }

    /// The same for a database connect: a cause someone must fix (TLS, login, a setting) is
    /// kept until a connect succeeds.
    pub fn database_connect(&self, outcome: Result<(), &ConnectFailure>) {
        *lock(&self.database) = outcome.err().and_then(database_problem_of);
    }

    /// Records a database connect's outcome: its problem (as [`Health::database_connect`]) and
    /// the `waiting` gauge (1 while only standbys answer). Returns the line to log when the
    /// state is news to the process: the start-up check and every worker share one voice.
    /// `doing` names the attempt, e.g. "cannot connect to PostgreSQL at start".
    pub fn database_attempt(
        &self,
        outcome: Result<(), &ConnectFailure>,
        waiting: &prometheus::IntGauge,
        doing: &str,
    ) -> Option<String> {
        self.database_connect(outcome);
        let read_only = matches!(outcome, Err(e) if e.kind == FailureKind::ReadOnly);
        waiting.set(i64::from(read_only));
        let e = outcome.err()?;
        let state = match e.kind {
            FailureKind::ReadOnly => format!("{e}; waiting for a primary"),
            _ => format!("{doing}: {e}; retrying"),
        };
        self.database_said.should_say(&state).then_some(state)
    }

    /// A worker's broker connection is blocked by an alarm: the problem `/readyz` and the
    /// reports show until a connect or an unblocked connection clears it.
    pub fn broker_blocked(&self) {
        *lock(&self.broker) = Some(Problem {
            kind: ProblemKind::BrokerBlocked,
            message: BROKER_BLOCKED.to_string(),
        });
    }

    /// Records why the lag report cannot be written, or that it can (None).
    pub fn report_problem(&self, problem: Option<String>) {
        *lock(&self.report) = problem;
    }

    /// Why the lag report cannot be written, if it cannot.
    pub fn report_state(&self) -> Option<String> {
        lock(&self.report).clone()
    }

    /// Shared by the workers, for why they cannot connect to the broker.
    pub fn broker_said(&self) -> &Announcer {
        &self.broker_said
    }

    /// Shared by the workers, for the broker's alarm: one state for the process.
    pub fn alarm(&self) -> &BrokerAlarm {
        &self.alarm
    }

    /// Shared by the tasks that connect to the database: a state they all meet is said once.
    pub fn database_said(&self) -> &Announcer {
        &self.database_said
    }

    /// The problem keeping this process from relaying, if one is known; the database's first,
    /// since without it nothing is claimed.
    pub fn problem(&self) -> Option<Problem> {
        lock(&self.database)
            .clone()
            .or_else(|| lock(&self.broker).clone())
    }
}

fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave an Option half-written.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

fn database_problem_of(error: &ConnectFailure) -> Option<Problem> {
    let kind = match error.kind {
        FailureKind::Tls => ProblemKind::DatabaseTls,
        FailureKind::Auth => ProblemKind::DatabaseAuth,
        FailureKind::Settings => ProblemKind::DatabaseSettings,
        FailureKind::ReadOnly => ProblemKind::DatabaseReadOnly,
        FailureKind::Unreachable => ProblemKind::DatabaseUnreachable,
        FailureKind::Other => return None,
    };
    Some(Problem {
        kind,
        message: error.to_string(),
    })
}

/// The reportable problem behind a failed connect: a cause someone must act on, or an outage
/// that retrying usually outlasts ([`ProblemKind::is_outage`]), so `/readyz` and the status
/// name it either way.
fn problem_of(error: &ConnectError) -> Option<Problem> {
    match error {
        ConnectError::ExchangeNotFound { .. } => Some(Problem {
            kind: ProblemKind::ExchangeNotFound,
            message: error.to_string(),
        }),
        ConnectError::AddressNotFound { .. } => Some(Problem {
            kind: ProblemKind::AddressNotFound,
            message: error.to_string(),
        }),
        ConnectError::Refused { kind, .. } => Some(Problem {
            kind: match kind {
                Refusal::Tls => ProblemKind::BrokerTls,
                Refusal::Auth => ProblemKind::BrokerAuth,
                Refusal::Settings => ProblemKind::BrokerSettings,
            },
            message: error.to_string(),
        }),
        ConnectError::Unavailable(_) => Some(Problem {
            kind: ProblemKind::BrokerUnreachable,
            message: format!("cannot reach the broker: {error}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_exchange_is_a_problem_until_a_connect_succeeds() {
        let health = Health::default();
        let missing = ConnectError::ExchangeNotFound {
            exchange: "orders".into(),
            vhost: "/".into(),
        };
        health.broker_connect(Err(&missing));
        let problem = health.problem().expect("a missing exchange is reported");
        assert_eq!(problem.kind, ProblemKind::ExchangeNotFound);
        assert_eq!(
            problem.message,
            "exchange orders does not exist on vhost /: declare it, or pass --declare-exchange TYPE"
        );
        health.broker_connect(Ok(()));
        assert_eq!(health.problem(), None);
    }

    #[test]
    fn an_outage_replaces_an_earlier_reason_and_is_named_as_one() {
        let health = Health::default();
        health.broker_connect(Err(&ConnectError::ExchangeNotFound {
            exchange: "orders".into(),
            vhost: "/".into(),
        }));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        health.broker_connect(Err(&ConnectError::Unavailable(Arc::new(refused))));
        let problem = health.problem().expect("an outage is named");
        assert_eq!(problem.kind, ProblemKind::BrokerUnreachable);
        assert!(problem.kind.is_outage());
        assert!(problem.message.starts_with("cannot reach the broker: "));
        health.broker_connect(Ok(()));
        assert_eq!(health.problem(), None);
    }
}
