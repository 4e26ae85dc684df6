//! Why the process cannot relay, beyond "not connected": the workers find it out when they
//! connect, `/readyz` and the reporter tell it. The connected gauges say whether; this says why.

use std::sync::{Arc, Mutex};

use crate::broker::ConnectError;
use crate::table::reports::{Problem, ProblemKind};

/// Shared by the workers, the HTTP endpoints and the reporter of one process.
#[derive(Debug, Clone, Default)]
pub struct Health {
    broker: Arc<Mutex<Option<Problem>>>,
}

impl Health {
    /// Records where a worker's broker link stands after its connect step: connected (just now
    /// or still), or failed without a known cause, clears what an earlier failure said, so no
    /// stale reason outlives its state.
    pub fn broker_connect(&self, outcome: Result<(), &ConnectError>) {
        *self.lock() = outcome.err().and_then(problem_of);
    }

    /// The problem keeping this process from relaying, if one is known.
    pub fn problem(&self) -> Option<Problem> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Problem>> {
        // A panic while holding the lock cannot leave an Option half-written.
        self.broker.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The reportable problem behind a failed connect: only a cause that someone must act on,
/// not an outage that retrying outlasts.
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
        ConnectError::Unavailable(_) => None,
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
    fn an_outage_replaces_an_earlier_reason() {
        let health = Health::default();
        health.broker_connect(Err(&ConnectError::ExchangeNotFound {
            exchange: "orders".into(),
            vhost: "/".into(),
        }));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        health.broker_connect(Err(&ConnectError::Unavailable(Arc::new(refused))));
        assert_eq!(health.problem(), None);
    }
}
